"""The capture contract: marks, port roles (one number per role for both transports), what is captured."""

from __future__ import annotations

from aether.netns import contract as c
from aether.netns.contract import Transport


def test_marks_differ_and_neither_is_a_bitmask_superset() -> None:
    divert, passthrough = c.CAPTURE_DIVERT_FWMARK, c.CAPTURE_PASSTHROUGH_FWMARK
    assert divert == 0xAE71
    assert passthrough == 0xAE7E
    assert divert != passthrough
    assert divert & passthrough != divert, "passthrough mark would match a `meta mark & divert == divert` test"
    assert divert & passthrough != passthrough, (
        "divert mark would match a `meta mark & passthrough == passthrough` test"
    )


def test_one_number_per_role_for_both_transports() -> None:
    by_name = {role.name: role for role in c.PORT_ROLES}
    assert by_name["L4_OUTBOUND_PORT"].number == c.L4_OUTBOUND_PORT == 18082
    assert by_name["INBOUND_PORT"].number == c.INBOUND_PORT == 18008
    assert by_name["EAST_WEST_PORT"].number == c.EAST_WEST_PORT == 18009
    assert by_name["HTTP_OUTBOUND_PORT"].number == c.HTTP_OUTBOUND_PORT == 18080
    both = frozenset({Transport.TCP, Transport.UDP})
    assert by_name["L4_OUTBOUND_PORT"].transports == both
    assert by_name["INBOUND_PORT"].transports == both
    assert by_name["EAST_WEST_PORT"].transports == both
    assert by_name["HTTP_OUTBOUND_PORT"].transports == frozenset({Transport.TCP})
    # R3: no number serves two roles, no role has two numbers
    numbers = [role.number for role in c.PORT_ROLES]
    assert len(numbers) == len(set(numbers))
    assert len(by_name) == len(c.PORT_ROLES)
    for role in c.PORT_ROLES:
        assert set(role.meaning) == set(role.transports)
        assert c.role_for(role.number) is role


def test_captured_ports_are_the_mesh_spellings() -> None:
    assert dict(c.CAPTURED_PORTS) == {Transport.UDP: (18082,), Transport.TCP: (18082, 18080)}
    assert c.INBOUND_PORT not in {p for ports in c.CAPTURED_PORTS.values() for p in ports}


def test_routing_constants() -> None:
    assert c.CAPTURE_ROUTE_TABLE not in (0, 253, 254, 255)  # not unspec/default/main/local
    assert c.CAPTURE_RULE_PRIORITY == 100
    assert (c.NFT_TABLE_FAMILY, c.NFT_TABLE_NAME) == ("inet", "aether")
