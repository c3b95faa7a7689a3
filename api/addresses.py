"""Addresses as flags spell them (`host:port`, `unix:PATH`), and which IPs can be a Service VIP (pure)."""

from __future__ import annotations

import ipaddress


class AddressError(ValueError):
    pass


def parse_addr(addr: str) -> tuple[str, int] | str:
    """`host:port` -> (host, port); `unix:PATH` -> PATH."""
    if addr.startswith("unix:"):
        path = addr[len("unix:") :]
        if not path:
            raise AddressError(f"{addr!r}: unix: needs a path")
        return path
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise AddressError(f"{addr!r}: expected host:port or unix:PATH")
    return host.strip("[]"), int(port)


def parse_hostport(addr: str) -> tuple[str, int]:
    """`host:port` only (what a TCP listener such as `--metrics` needs); AddressError for anything else."""
    try:
        parsed = parse_addr(addr)
    except AddressError:
        parsed = addr
    if isinstance(parsed, str):
        raise AddressError(f"{addr!r}: expected host:port (e.g. 0.0.0.0:19091), port 1-65535")
    return parsed


def unroutable_vip(ip: str) -> str | None:
    """Why an address cannot be a Service VIP, or None when it can: not an IP address, zoned (an IPv6 scope such as
    fe80::1%eth0 names one host's interface), loopback, unspecified, link-local or multicast. The operator refuses
    such a Service (InvalidService) and the sidecar's gates refuse such an arm, with the same words."""
    if "%" in ip:
        return "zoned (it carries an interface scope)"
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return "not an IP address"
    for what, bad in (
        ("loopback", addr.is_loopback),
        ("unspecified", addr.is_unspecified),
        ("link-local", addr.is_link_local),
        ("multicast", addr.is_multicast),
    ):
        if bad:
            return what
    return None
