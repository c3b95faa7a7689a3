"""Listening and dialling addresses as flags spell them: `host:port` and `unix:PATH` (pure)."""

from __future__ import annotations


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
