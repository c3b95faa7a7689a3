"""The installer against real network namespaces: idempotence, read-back, drift, rollback, removal.

What the installer did is read back here with the `nft` and `ip` binaries (an oracle independent of the
installer's own libnftables/rtnetlink code).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from aether.netns import install as inst
from aether.netns import rtnl
from aether.netns import rules as nftrules
from aether.netns.contract import CAPTURE_DIVERT_FWMARK, CAPTURE_ROUTE_TABLE, CaptureMode, Transport
from aether.netns.install import CaptureDrift, CaptureError, check_capture, install_capture, remove_capture
from aether.testing.netlab import Lab, sh

pytestmark = pytest.mark.privileged


def nft_tables(netns: str) -> list[dict[str, Any]]:
    out = json.loads(sh("nft", "-j", "list", "ruleset", netns=netns))
    return [o["table"] for o in out["nftables"] if "table" in o]


def nft_rules(netns: str) -> list[dict[str, Any]]:
    out = json.loads(sh("nft", "-j", "list", "ruleset", netns=netns))
    return [o["rule"] for o in out["nftables"] if "rule" in o]


def ip_rules(netns: str, family: str = "-4") -> list[dict[str, Any]]:
    return [r for r in json.loads(sh("ip", family, "-j", "rule", "show", netns=netns)) if r.get("priority") == 100]


def ip_routes(netns: str, family: str = "-4") -> list[dict[str, Any]]:
    out = sh("ip", family, "-j", "route", "show", "table", str(CAPTURE_ROUTE_TABLE), netns=netns, check=False)
    return list(json.loads(out)) if out.strip() not in ("", "[") else []  # "[" and rc 2: the table does not exist


def untouched(netns: str) -> bool:
    routing = [*ip_rules(netns), *ip_rules(netns, "-6"), *ip_routes(netns), *ip_routes(netns, "-6")]
    return nft_tables(netns) == [] and routing == []


def test_install_twice_leaves_one_copy(lab: Lab) -> None:
    ns = lab.add_node("inst")
    install_capture(ns.path)
    install_capture(ns.path)
    assert [t["name"] for t in nft_tables(ns.netns)] == ["aether"]
    assert len(nft_rules(ns.netns)) == 4  # the claim skip and one divert rule per captured port
    rules = ip_rules(ns.netns)
    assert len(rules) == 1
    assert int(rules[0]["fwmark"], 16) == CAPTURE_DIVERT_FWMARK
    assert rules[0]["table"] == str(CAPTURE_ROUTE_TABLE)
    routes = ip_routes(ns.netns)
    assert [(r["type"], r["dst"], r["dev"], r["scope"]) for r in routes] == [("local", "default", "lo", "host")]
    rules6 = ip_rules(ns.netns, "-6")  # table inet aether marks IPv6 too: the same rule and route for it
    assert [(int(r["fwmark"], 16), r["table"]) for r in rules6] == [(CAPTURE_DIVERT_FWMARK, str(CAPTURE_ROUTE_TABLE))]
    assert [(r["type"], r["dst"], r["dev"]) for r in ip_routes(ns.netns, "-6")] == [("local", "default", "lo")]
    check_capture(ns.path)
    # the root netns of this test process was never touched by the thread-scoped setns
    assert not any(r.get("fwmark") == hex(CAPTURE_DIVERT_FWMARK) for r in json.loads(sh("ip", "-j", "rule")))


def test_mode_switch_replaces_whole(lab: Lab) -> None:
    ns = lab.add_node("switch")
    install_capture(ns.path)
    install_capture(ns.path, CaptureMode.REDIRECT)
    check_capture(ns.path, CaptureMode.REDIRECT)
    assert ip_rules(ns.netns) == [] and ip_routes(ns.netns) == []
    assert all(r["expr"][-1].get("redirect") for r in nft_rules(ns.netns))
    install_capture(ns.path, CaptureMode.TPROXY)
    check_capture(ns.path, CaptureMode.TPROXY)


def test_drift_is_detected(lab: Lab) -> None:
    ns = lab.add_node("drift")
    install_capture(ns.path)
    check_capture(ns.path)
    handle = next(r["handle"] for r in nft_rules(ns.netns) if r["expr"][0]["match"]["right"] == 18080)
    sh("nft", "delete", "rule", "inet", "aether", nftrules.DIVERT_CHAIN, "handle", str(handle), netns=ns.netns)
    with pytest.raises(CaptureDrift, match="missing rule in 'divert_out': tcp dport == 18080") as info:
        check_capture(ns.path)
    assert len(info.value.reasons) == 1
    install_capture(ns.path)
    sh("ip", "rule", "del", "pref", "100", netns=ns.netns)
    with pytest.raises(CaptureDrift, match="missing ip rule"):
        check_capture(ns.path)
    install_capture(ns.path)
    sh("ip", "route", "flush", "table", str(CAPTURE_ROUTE_TABLE), netns=ns.netns)
    with pytest.raises(CaptureDrift, match="missing route"):
        check_capture(ns.path)
    install_capture(ns.path)
    sh("ip", "-6", "rule", "del", "pref", "100", netns=ns.netns)
    with pytest.raises(CaptureDrift, match=r"drifted: missing ip -6 rule: pref 100 fwmark 0xae71 lookup 44657$"):
        check_capture(ns.path)
    install_capture(ns.path)
    sh("ip", "-6", "route", "flush", "table", str(CAPTURE_ROUTE_TABLE), netns=ns.netns)
    with pytest.raises(CaptureDrift, match=r"drifted: missing IPv6 route: local ::/0 dev lo table 44657$"):
        check_capture(ns.path)
    install_capture(ns.path)
    sh("nft", "add", "rule", "inet", "aether", nftrules.DIVERT_CHAIN, "udp", "dport", "9999", "accept", netns=ns.netns)
    with pytest.raises(CaptureDrift, match="extra rule"):
        check_capture(ns.path)
    sh("nft", "delete", "table", "inet", "aether", netns=ns.netns)
    with pytest.raises(CaptureDrift, match="table inet aether is missing"):
        check_capture(ns.path)


def test_rejected_ruleset_raises_and_loads_nothing(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a counter after redirect makes nft refuse the whole transaction."""
    ns = lab.add_node("reject")

    def counter_after_redirect(mode: CaptureMode, ports: Any = None, inbound: Any = None) -> dict[str, Any]:
        rs = nftrules.build_ruleset(mode)
        for cmd in rs["nftables"]:
            if "rule" in cmd["add"]:
                cmd["add"]["rule"]["expr"].append({"counter": None})
        return rs

    monkeypatch.setattr(inst, "build_ruleset", counter_after_redirect)
    with pytest.raises(CaptureError, match="nft rejected the redirect ruleset"):
        install_capture(ns.path, CaptureMode.REDIRECT)
    assert untouched(ns.netns)


def test_silently_empty_load_is_caught(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: nft says yes but nothing (only the table) loaded -> read-back raises, nothing left."""
    ns = lab.add_node("empty")
    only_the_table = lambda rs: {"nftables": rs["nftables"][:1]}  # noqa: E731
    monkeypatch.setattr(nftrules, "create_table_commands", only_the_table)
    monkeypatch.setattr(nftrules, "replace_table_commands", only_the_table)
    with pytest.raises(CaptureError, match="did not load as asked: missing chain 'divert_out'"):
        install_capture(ns.path)
    assert untouched(ns.netns)


def test_routing_failure_rolls_back_the_table(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = lab.add_node("rollback")

    def fail(self: rtnl.RtnlSocket, route: rtnl.Route) -> None:
        raise OSError(1, "Operation not permitted (injected)")

    monkeypatch.setattr(rtnl.RtnlSocket, "replace_route", fail)
    with pytest.raises(CaptureError, match="rolled back"):
        install_capture(ns.path)
    assert untouched(ns.netns)


def test_not_a_netns_is_refused(tmp_path: Any) -> None:
    plain = tmp_path / "plain"
    plain.write_text("")
    for path, msg in [
        (plain, "not a network namespace"),
        (tmp_path / "missing", "does not exist"),
        ("/proc/self/ns/mnt", "not a network namespace"),
        (tmp_path, "not a network namespace"),
    ]:
        with pytest.raises(CaptureError, match=msg):
            install_capture(path)
        with pytest.raises(CaptureError, match=msg):
            check_capture(path)


def test_remove_is_idempotent_and_tolerates_a_vanished_netns(lab: Lab) -> None:
    ns = lab.add_node("remove")
    install_capture(ns.path, ports={Transport.UDP: (18082,)})
    check_capture(ns.path, ports={Transport.UDP: (18082,)})
    assert remove_capture(ns.path) is True
    assert untouched(ns.netns)
    assert remove_capture(ns.path) is True
    assert remove_capture("/run/netns/does-not-exist-aether-test") is False


def test_call_in_netns_returns_the_thread_home(lab: Lab) -> None:
    from aether.netns.nsthread import call_in_netns, run_in_netns

    ns = lab.add_node("home")
    home = os.stat("/proc/thread-self/ns/net").st_ino
    inside = call_in_netns(ns.path, lambda: os.stat("/proc/thread-self/ns/net").st_ino)
    assert inside == os.stat(ns.path).st_ino != home
    assert os.stat("/proc/thread-self/ns/net").st_ino == home

    def boom() -> None:
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        call_in_netns(ns.path, boom)
    assert os.stat("/proc/thread-self/ns/net").st_ino == home
    assert run_in_netns(ns.path, lambda: os.stat("/proc/thread-self/ns/net").st_ino) == inside
    assert os.stat("/proc/thread-self/ns/net").st_ino == home


def test_concurrent_installs_from_threads(lab: Lab) -> None:
    """The sidecar may call the installer from several threads: each netns ends up exactly right."""
    from concurrent.futures import ThreadPoolExecutor

    nodes = [lab.add_node(f"t{i}") for i in range(4)]

    def thrice(path: str) -> None:
        for _ in range(3):
            install_capture(path)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(thrice, [n.path for n in nodes]))
    for n in nodes:
        check_capture(n.path)
