"""The installer's order of effects, without privileges: install, re-install, mode switch, rollback and removal
over a recording stand-in for libnftables and rtnetlink (`aether.testing.capture_effects`).

tests/netns/test_netns_install.py runs the same paths against real network namespaces (as root) and reads the
result back with the `nft` and `ip` binaries; here the order itself is the assertion: the table before any
routing, stale rules before the divert's own, the read-back last, and on any failure after the table loaded the
removal of everything, table first.
"""

from __future__ import annotations

from typing import Any

import pytest

from aether.netns import rules as nftrules
from aether.netns.contract import CAPTURE_DIVERT_FWMARK, CAPTURE_ROUTE_TABLE, CAPTURED_PORTS, CaptureMode
from aether.netns.install import (
    DIVERT_RULE,
    DIVERT_RULE6,
    DIVERT_RULES,
    LOCAL_ROUTE,
    LOCAL_ROUTE6,
    LOCAL_ROUTES,
    CaptureError,
    apply_capture,
    capture_state,
    drift_reasons,
    install_capture,
    read_state,
    remove_all,
)
from aether.netns.rtnl import Route, Rule
from aether.testing.capture_effects import RecordingEffects
from aether.testing.netlab import Lab

T = CAPTURE_ROUTE_TABLE
INSTALLED = ["nft create", "rules", "add_rule", "add_rule", "routes", "replace_route", "replace_route"]
READ_BACK = ["nft list", "rules", "routes"]
REMOVED = ["nft delete", "rules", "delete_rule", "delete_rule", "routes"]


def install(fx: RecordingEffects, mode: CaptureMode = CaptureMode.TPROXY) -> None:
    apply_capture(fx, "ns", mode, CAPTURED_PORTS, None)


class Interrupted(BaseException):
    """Not an OSError nor an NftError: the installer must roll back and let it through unchanged."""


def test_a_fresh_install_loads_the_table_then_routes_then_reads_back() -> None:
    fx = RecordingEffects()
    install(fx)
    assert fx.names() == INSTALLED + READ_BACK
    assert fx.calls[2:4] == [("add_rule", DIVERT_RULE), ("add_rule", DIVERT_RULE6)]
    assert fx.calls[5:7] == [("replace_route", LOCAL_ROUTE), ("replace_route", LOCAL_ROUTE6)]
    assert fx.ip_rules == list(DIVERT_RULES) and fx.ip_routes == list(LOCAL_ROUTES)
    assert drift_reasons(read_state(fx), CaptureMode.TPROXY, CAPTURED_PORTS) == []


def test_a_second_install_replaces_the_table_whole_and_adds_no_second_rule() -> None:
    fx = RecordingEffects()
    install(fx)
    fx.calls.clear()
    install(fx)
    assert fx.names() == ["nft create", "nft replace", *INSTALLED[1:], *READ_BACK]
    assert fx.ip_rules == list(DIVERT_RULES) and fx.ip_routes == list(LOCAL_ROUTES)


def test_stale_rules_and_routes_go_before_the_divert_is_added() -> None:
    stale_rule = Rule(priority=101, fwmark=CAPTURE_DIVERT_FWMARK, fwmask=0xFF, table=T)
    stale_route = Route(table=T, type=1, scope=0, oif=2, dst_len=24)
    fx = RecordingEffects(ip_rules=[stale_rule], ip_routes=[stale_route])
    install(fx)
    assert fx.calls[:9] == [
        ("nft", "create"),
        ("rules",),
        ("delete_rule", stale_rule),
        ("add_rule", DIVERT_RULE),
        ("add_rule", DIVERT_RULE6),
        ("routes", T),
        ("delete_route", stale_route),
        ("replace_route", LOCAL_ROUTE),
        ("replace_route", LOCAL_ROUTE6),
    ]
    assert fx.ip_rules == list(DIVERT_RULES) and fx.ip_routes == list(LOCAL_ROUTES)


def test_a_switch_to_redirect_removes_the_rule_and_the_route() -> None:
    fx = RecordingEffects()
    install(fx)
    fx.calls.clear()
    install(fx, CaptureMode.REDIRECT)
    assert fx.names() == [
        *["nft create", "nft replace", "rules", "delete_rule", "delete_rule"],
        *["routes", "delete_route", "delete_route", *READ_BACK],
    ]
    assert fx.ip_rules == [] and fx.ip_routes == [] and fx.table is not None
    assert drift_reasons(read_state(fx), CaptureMode.REDIRECT, CAPTURED_PORTS) == []


def test_a_refused_ruleset_touches_no_routing() -> None:
    fx = RecordingEffects(refuse={"create", "replace"})
    with pytest.raises(CaptureError, match=r"nft rejected the tproxy ruleset for ns \(nothing loaded\)"):
        install(fx)
    assert fx.names() == ["nft create", "nft replace"]
    assert fx.untouched()


def test_a_routing_failure_removes_everything_table_first() -> None:
    fx = RecordingEffects(fail={"replace_route": OSError(1, "Operation not permitted (injected)")})
    with pytest.raises(CaptureError, match=r"installing the tproxy capture in ns failed \(rolled back\)"):
        install(fx)
    assert fx.names() == INSTALLED[:-1] + REMOVED  # the first replace_route failed
    assert fx.calls[-3:-1] == [("delete_rule", DIVERT_RULE), ("delete_rule", DIVERT_RULE6)]
    assert fx.untouched()


def test_a_silently_empty_load_is_caught_by_the_read_back_and_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: nft says yes but only the table loaded."""

    def only_the_table(rs: dict[str, Any]) -> dict[str, Any]:
        return {"nftables": [{"create": rs["nftables"][0]["add"]}]}

    monkeypatch.setattr(nftrules, "create_table_commands", only_the_table)
    fx = RecordingEffects()
    with pytest.raises(CaptureError, match="did not load as asked: missing chain 'divert_out'"):
        install(fx)
    assert fx.names() == INSTALLED + READ_BACK + [*REMOVED, "delete_route", "delete_route"]
    assert fx.untouched()


def test_a_failed_rollback_says_both() -> None:
    fx = RecordingEffects(
        fail={"add_rule": OSError(1, "Operation not permitted (injected)"), "nft delete": OSError(16, "busy")}
    )
    with pytest.raises(CaptureError, match=r"Operation not permitted \(injected\); and the rollback failed too"):
        install(fx)
    assert fx.names() == ["nft create", "rules", "add_rule", "nft delete"]


def test_an_interruption_is_rolled_back_and_let_through() -> None:
    fx = RecordingEffects(fail={"replace_route": Interrupted()})
    with pytest.raises(Interrupted):
        install(fx)
    assert fx.names() == INSTALLED[:-1] + REMOVED  # the first replace_route failed
    assert fx.untouched()


def test_remove_deletes_the_table_then_our_rules_then_our_routes() -> None:
    foreign = Rule(priority=0, fwmark=0, fwmask=0, table=255)
    fx = RecordingEffects(ip_rules=[foreign])
    install(fx)
    fx.calls.clear()
    remove_all(fx)
    assert fx.calls == [
        ("nft", "delete"),
        ("rules",),
        ("delete_rule", DIVERT_RULE),
        ("delete_rule", DIVERT_RULE6),
        ("routes", T),
        ("delete_route", LOCAL_ROUTE),
        ("delete_route", LOCAL_ROUTE6),
    ]
    assert fx.table is None and fx.ip_rules == [foreign] and fx.ip_routes == []
    fx.calls.clear()
    remove_all(fx)  # idempotent: nothing left to delete
    assert fx.names() == ["nft delete", "rules", "routes"]


def test_read_state_without_a_table_is_empty() -> None:
    state = read_state(RecordingEffects())
    assert state.table == {"tables": [], "chains": {}, "rules": {}} and state.rules == [] and state.routes == []


@pytest.mark.privileged
def test_install_capture_opens_the_injected_effects_inside_the_netns_and_closes_them(lab: Lab) -> None:
    """The shell: a real netns entered, the effects opened there and closed after; the kernel is never touched."""
    ns = lab.add_node("inject")
    fx = RecordingEffects()
    install_capture(ns.path, effects=lambda: fx)
    assert fx.names() == [*INSTALLED, *READ_BACK, "close"] and fx.closed
    assert capture_state(ns.path).rules == []  # the real netns: nothing installed


def test_check_names_the_ipv6_rule_and_route_when_only_they_are_gone() -> None:
    """CHECK sees IPv6 drift on its own: the IPv4 half intact, the IPv6 rule and route removed."""
    fx = RecordingEffects()
    install(fx)
    fx.ip_rules.remove(DIVERT_RULE6)
    fx.ip_routes.remove(LOCAL_ROUTE6)
    assert drift_reasons(read_state(fx), CaptureMode.TPROXY, CAPTURED_PORTS) == [
        f"missing ip -6 rule: pref 100 fwmark {CAPTURE_DIVERT_FWMARK:#x} lookup {T}",
        f"missing IPv6 route: local ::/0 dev lo table {T}",
    ]
    fx.ip_rules.append(DIVERT_RULE6._replace(fwmask=0xFF))
    assert f"extra ip -6 rule: pref 100 fwmark {CAPTURE_DIVERT_FWMARK:#x}/0xff lookup {T}" in drift_reasons(
        read_state(fx), CaptureMode.TPROXY, CAPTURED_PORTS
    )


def test_a_netns_without_ipv6_gets_and_wants_the_ipv4_routing_only() -> None:
    """A kernel booted with ipv6.disable=1 refuses any IPv6 rule (EAFNOSUPPORT, as the stub does): the installer asks
    the netns first and installs, checks and removes the IPv4 half alone there."""
    fx = RecordingEffects(ipv6=False)
    install(fx)
    assert fx.names() == ["nft create", "rules", "add_rule", "routes", "replace_route", *READ_BACK]
    assert fx.ip_rules == [DIVERT_RULE] and fx.ip_routes == [LOCAL_ROUTE]
    assert drift_reasons(read_state(fx), CaptureMode.TPROXY, CAPTURED_PORTS) == []
    fx.ip_rules.clear()
    assert drift_reasons(read_state(fx), CaptureMode.TPROXY, CAPTURED_PORTS) == [
        f"missing ip rule: pref 100 fwmark {CAPTURE_DIVERT_FWMARK:#x} lookup {T}"
    ]
