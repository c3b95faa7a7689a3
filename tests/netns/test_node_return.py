"""The node's return path for source-preserving plaintext UDP (aether.netns.node_return): its marks, its ruleset,
and install / check / remove in a real netns with the real kernel."""

from __future__ import annotations

import itertools

import pytest

from aether.netns import node_return as nr
from aether.testing.netlab import Lab, sh


def test_marks_differ_and_none_is_a_bitmask_superset_of_another() -> None:
    for a, b in itertools.permutations(nr.MARKS_IN_USE, 2):
        assert a != b and a & b != a, f"{a:#x} is covered by {b:#x}"
    assert nr.NODE_RULE_PRIORITY < 32766  # before the main table, which routes the pod's address to the pod


def test_the_one_rule_matches_only_datagrams_of_transparent_sockets() -> None:
    expr = nr.rule_expr()
    assert {"match": {"op": "==", "left": {"socket": {"key": "transparent"}}, "right": 1}} in expr
    assert {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "udp"}} in expr
    assert expr[-1] == {"mangle": {"key": {"meta": {"key": "mark"}}, "value": nr.NODE_RETURN_FWMARK}}
    cmds = nr.build_ruleset()["nftables"]
    assert [next(iter(c)) for c in cmds] == ["add", "delete", "add", "add", "add", "add"]  # replaced whole, atomically
    assert nr.rules()[0][0]["match"]["left"] == {"ct": {"key": "state"}}  # tracking on: fragments reassembled


@pytest.mark.privileged
def test_install_check_drift_remove(lab: Lab) -> None:
    node = lab.add_node("n")
    assert nr.check(node.path)  # nothing there yet: every object reported missing
    nr.install(node.path)
    nr.install(node.path)  # idempotent: one table, one rule, one route
    assert nr.check(node.path) == []
    assert "socket transparent 1" in sh("nft", "list", "table", "inet", nr.NODE_TABLE, netns=node.netns)
    sh("ip", "route", "del", "local", "default", "dev", "lo", "table", str(nr.NODE_ROUTE_TABLE), netns=node.netns)
    assert any("routes in table" in r for r in nr.check(node.path))  # drift is named
    nr.install(node.path)
    assert nr.check(node.path) == []
    nr.remove(node.path)
    reasons = nr.check(node.path)
    assert len(reasons) == 3 and "missing nft table" in reasons[0]
    assert str(nr.NODE_RETURN_FWMARK) not in sh("ip", "rule", netns=node.netns)


@pytest.mark.privileged
def test_cli_reports_drift_and_exits_nonzero(lab: Lab) -> None:
    node = lab.add_node("n")
    assert nr.main(["check", "--netns", node.path]) == 1
    assert nr.main(["install", "--netns", node.path]) == 0
    assert nr.main(["check", "--netns", node.path]) == 0
    assert nr.main(["remove", "--netns", node.path]) == 0
    assert nr.main(["install", "--netns", "/run/netns/does-not-exist"]) == 1
