"""The stdlib rtnetlink encoder/decoder (pure), cross-checked against pyroute2 on a real netns, and the capture CLI."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from aether.netns import rtnl
from aether.netns.contract import CAPTURE_DIVERT_FWMARK, CAPTURE_ROUTE_TABLE
from aether.netns.install import DIVERT_RULE, LOCAL_ROUTE, install_capture
from aether.testing.netlab import Lab


def test_rule_body_round_trips() -> None:
    body = rtnl.rule_body(DIVERT_RULE)
    assert rtnl.decode_rule(body) == DIVERT_RULE
    # a table id >= 256 cannot live in the 8-bit header field: it is RT_TABLE_UNSPEC there and FRA_TABLE carries it
    assert body[4] == rtnl.RT_TABLE_UNSPEC
    assert rtnl.decode_rule(rtnl.rule_body(DIVERT_RULE._replace(table=100))).table == 100


def test_route_body_round_trips() -> None:
    assert rtnl.decode_route(rtnl.route_body(LOCAL_ROUTE)) == LOCAL_ROUTE


def test_split_walks_aligned_messages() -> None:
    a = rtnl.encode(rtnl.RTM_NEWRULE, 0, 7, rtnl.rule_body(DIVERT_RULE))
    b = rtnl.encode(rtnl.NLMSG_DONE, 0, 7, struct.pack("=i", 0))
    msgs = list(rtnl.split(a + b))
    assert [(t, s) for t, s, _ in msgs] == [(rtnl.RTM_NEWRULE, 7), (rtnl.NLMSG_DONE, 7)]
    assert rtnl.decode_rule(msgs[0][2]) == DIVERT_RULE


@pytest.mark.privileged
def test_pyroute2_sees_what_rtnl_installed(lab: Lab) -> None:
    from pyroute2 import IPRoute

    ns = lab.add_node("pr2")
    install_capture(ns.path)
    with IPRoute(netns=ns.path, flags=0) as ipr:  # flags=0: never create a missing netns
        rules = [r for r in ipr.get_rules(family=2) if r.get_attr("FRA_PRIORITY") == 100]
        assert len(rules) == 1
        assert rules[0].get_attr("FRA_FWMARK") == CAPTURE_DIVERT_FWMARK
        assert rules[0].get_attr("FRA_TABLE") == CAPTURE_ROUTE_TABLE
        routes = list(ipr.get_routes(family=2, table=CAPTURE_ROUTE_TABLE))
        assert len(routes) == 1
        assert routes[0]["type"] == rtnl.RTN_LOCAL and routes[0]["scope"] == rtnl.RT_SCOPE_HOST
        assert routes[0]["dst_len"] == 0 and routes[0].get_attr("RTA_OIF") == 1


@pytest.mark.privileged
def test_capture_cli(lab: Lab, tmp_path: Path) -> None:
    aether = str(Path(sys.executable).parent / "aether")
    ns = lab.add_node("cli")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([aether, "capture", *args], capture_output=True, text=True, timeout=60)

    assert run("check", "--netns", ns.path).returncode == 1
    ok = run("install", "--netns", ns.path)
    assert ok.returncode == 0, ok.stderr
    assert run("check", "--netns", ns.path).returncode == 0
    drift = run("check", "--netns", ns.path, "--mode", "redirect")
    assert drift.returncode == 1 and "missing chain 'redirect_out'" in drift.stderr
    plain = tmp_path / "f"
    plain.write_text("")
    bad = run("install", "--netns", str(plain))
    assert bad.returncode == 1 and "not a network namespace" in bad.stderr
    assert run("install", "--netns", ns.path, "--mode", "bogus").returncode == 2
    assert run("remove", "--netns", ns.path).returncode == 0
    assert run("check", "--netns", ns.path).returncode == 1
