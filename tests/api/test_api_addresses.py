"""aether.api.addresses: flag addresses, and which IPs can be a Service VIP (one rule for operator and sidecar)."""

from __future__ import annotations

import pytest

from aether.api.addresses import AddressError, parse_addr, parse_hostport, unroutable_vip


@pytest.mark.parametrize(
    ("ip", "why"),
    [
        ("10.96.0.10", None),
        ("fd00::10", None),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("fe80::1%eth0", "zoned (it carries an interface scope)"),
        ("224.0.0.1", "multicast"),
        ("10.96.0", "not an IP address"),
    ],
)
def test_unroutable_vip(ip: str, why: str | None) -> None:
    assert unroutable_vip(ip) == why


def test_flag_addresses() -> None:
    assert parse_addr("unix:/run/x.sock") == "/run/x.sock"
    assert parse_addr("[::1]:18000") == ("::1", 18000)
    assert parse_hostport("0.0.0.0:19091") == ("0.0.0.0", 19091)
    for bad in ("unix:", "nowhere", "h:0", "h:70000"):
        with pytest.raises(AddressError):
            parse_addr(bad)
    with pytest.raises(AddressError, match="expected host:port"):
        parse_hostport("unix:/run/x.sock")
