"""The pure ruleset builder: golden files for both modes, properties, and the normaliser/diff."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aether.netns.contract import (
    CAPTURE_DIVERT_FWMARK,
    CAPTURED_PORTS,
    KERNEL_UDP_FWMARK,
    CaptureMode,
    InboundMode,
    InboundPolicy,
    Transport,
)
from aether.netns.rules import (
    CAPTURE_IN_CHAIN,
    DIVERT_CHAIN,
    EGRESS_CHAIN,
    INBOUND_CHAIN,
    REDIRECT_CHAIN,
    RulesetError,
    build_ruleset,
    canonical,
    check_statement_order,
    create_table_commands,
    diff,
    replace_table_commands,
)
from aether.testing.golden import UPDATE_FLAG, GoldenMismatch, check_golden, golden_json

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("mode", list(CaptureMode))
def test_golden_ruleset(mode: CaptureMode) -> None:
    check_golden(GOLDEN / f"ruleset_{mode.value}.json", golden_json(build_ruleset(mode)))


STRICT = InboundPolicy(InboundMode.STRICT, ("169.254.1.1", "10.199.0.0/24", "fd00:10::/64"))


@pytest.mark.parametrize("inbound", list(InboundMode))
def test_golden_inbound_ruleset(inbound: InboundMode) -> None:
    """The CNI plugin's ruleset in both inbound modes (tproxy capture, the gateway and a node range as mesh
    sources); PERMISSIVE is the capture plus the egress source check and the capture listeners' check (no inbound
    chain)."""
    rs = build_ruleset(CaptureMode.TPROXY, inbound=STRICT._replace(mode=inbound))
    check_golden(GOLDEN / f"ruleset_tproxy_inbound_{inbound.value}.json", golden_json(rs))
    if inbound is InboundMode.PERMISSIVE:
        bare = build_ruleset(CaptureMode.TPROXY)["nftables"]
        assert rs["nftables"][: len(bare)] == bare
        assert {c["add"]["chain"]["name"] for c in rs["nftables"] if "chain" in c["add"]} == {
            "divert_out",
            EGRESS_CHAIN,
            CAPTURE_IN_CHAIN,
        }


def test_every_meshed_pod_drops_tcp_and_udp_leaving_with_a_foreign_source() -> None:
    """STRICT trusts mesh sources by address: a meshed pod never sends as one (tests/netns/test_netns_spoofed_sources.py
    shows it on the kernel, red on main)."""
    for mode in InboundMode:
        rs = build_ruleset(CaptureMode.TPROXY, inbound=STRICT._replace(mode=mode))
        chain = next(c["add"]["chain"] for c in rs["nftables"] if c["add"].get("chain", {}).get("name") == EGRESS_CHAIN)
        assert (chain["type"], chain["hook"], chain["prio"], chain["policy"]) == ("filter", "output", 0, "accept")
        rules = [r["expr"] for r in _rules(rs) if r["chain"] == EGRESS_CHAIN]
        assert [r[1]["match"]["right"] for r in rules] == ["tcp", "udp"]
        for r in rules:
            assert r[0]["match"] == {"op": "!=", "left": {"meta": {"key": "oifname"}}, "right": "lo"}
            assert r[2]["match"] == {
                "op": "!=",
                "left": {"fib": {"result": "type", "flags": ["saddr"]}},
                "right": "local",
            }
            assert r[3:] == [{"counter": {"packets": 0, "bytes": 0}}, {"drop": None}]
    assert EGRESS_CHAIN not in str(build_ruleset(CaptureMode.TPROXY))  # the bare capture (tests, `aether capture`)


def test_the_capture_listeners_take_only_loopback_arrivals() -> None:
    """The capture's L4 listeners (18082, TCP and UDP) in a meshed pod's netns see only the pod's own diverted
    traffic: anything to those ports on another interface is counted and dropped (tests/e2e/test_e2e_confused_deputy.py
    shows it from the node and another node, red on main). 18080 is left to its listener (403 and a log line)."""
    for mode in CaptureMode:
        rs = build_ruleset(mode, inbound=STRICT._replace(mode=InboundMode.PERMISSIVE))
        chain = next(
            c["add"]["chain"] for c in rs["nftables"] if c["add"].get("chain", {}).get("name") == CAPTURE_IN_CHAIN
        )
        assert (chain["type"], chain["hook"], chain["prio"], chain["policy"]) == ("filter", "input", 0, "accept")
        rules = [r["expr"] for r in _rules(rs) if r["chain"] == CAPTURE_IN_CHAIN]
        assert [(r[1]["match"]["left"]["payload"]["protocol"], r[1]["match"]["right"]) for r in rules] == [
            ("tcp", 18082),
            ("udp", 18082),
        ]
        for r in rules:
            assert r[0]["match"] == {"op": "!=", "left": {"meta": {"key": "iifname"}}, "right": "lo"}
            assert r[2:] == [{"counter": {"packets": 0, "bytes": 0}}, {"drop": None}]
    assert CAPTURE_IN_CHAIN not in str(build_ruleset(CaptureMode.TPROXY))
    only_http = build_ruleset(CaptureMode.TPROXY, {Transport.TCP: (18080,)}, STRICT)
    assert CAPTURE_IN_CHAIN not in str(only_http)  # no empty chain


def test_strict_shape_accepts_the_mesh_then_counts_and_drops() -> None:
    rs = build_ruleset(CaptureMode.TPROXY, inbound=STRICT)
    chain = next(c["add"]["chain"] for c in rs["nftables"] if c["add"].get("chain", {}).get("name") == INBOUND_CHAIN)
    assert (chain["type"], chain["hook"], chain["prio"], chain["policy"]) == ("filter", "input", 0, "accept")
    rules = [r["expr"] for r in _rules(rs) if r["chain"] == INBOUND_CHAIN]
    assert [next(iter(r[-1])) for r in rules] == ["accept"] * 7 + ["drop"] * 2
    assert [r[-2] for r in rules[4:]] == [{"counter": {"packets": 0, "bytes": 0}}] * 5  # sources and drops
    assert {r[0]["match"]["right"] for r in rules[2:4]} == {18008}
    saddr = [r[0]["match"]["right"] for r in rules[4:7]]
    assert saddr == [
        "169.254.1.1",
        {"prefix": {"addr": "10.199.0.0", "len": 24}},
        {"prefix": {"addr": "fd00:10::", "len": 64}},
    ]


@pytest.mark.parametrize(
    ("source", "right"),
    [
        ("10.199.0.1/30", {"prefix": {"addr": "10.199.0.0", "len": 30}}),
        ("10.1.2.3/32", "10.1.2.3"),
        ("fd00::1/64", {"prefix": {"addr": "fd00::", "len": 64}}),
        ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),
    ],
)
def test_mesh_sources_are_written_as_nft_prints_them(source: str, right: Any) -> None:
    rs = build_ruleset(CaptureMode.TPROXY, inbound=InboundPolicy(InboundMode.STRICT, (source,)))
    rules = [r["expr"] for r in _rules(rs) if r["chain"] == INBOUND_CHAIN]
    assert rules[4][0]["match"]["right"] == right


@pytest.mark.parametrize("bad", ["", "10.0.0.0/0", "10.0.0/8", "10.0.0.256", "fd00::/129", "x::y", "1.2.3.4/a"])
def test_bad_mesh_sources_are_refused(bad: str) -> None:
    with pytest.raises(RulesetError, match="mesh source"):
        build_ruleset(CaptureMode.TPROXY, inbound=InboundPolicy(InboundMode.STRICT, (bad,)))


def test_golden_mismatch_fails_and_is_not_rewritten(tmp_path: Path) -> None:
    """Negative control for the golden gate (aether.testing.golden): a differing file fails with a diff naming what
    changed and stays as it was, a missing one fails and is not created; only updating writes."""
    path = tmp_path / "ruleset_tproxy.json"
    text = golden_json(build_ruleset(CaptureMode.TPROXY))
    path.write_text(text.replace('"prio": -150', '"prio": -100', 1))
    with pytest.raises(GoldenMismatch, match="differs") as failure:
        check_golden(path, text, update=False)
    assert '\n-          "prio": -100,\n+          "prio": -150,\n' in str(failure.value)
    assert UPDATE_FLAG in str(failure.value)
    assert path.read_text() != text
    with pytest.raises(GoldenMismatch, match="missing"):
        check_golden(tmp_path / "absent.json", text, update=False)
    assert not (tmp_path / "absent.json").exists()
    check_golden(path, text, update=True)
    assert path.read_text() == text
    check_golden(path, text, update=False)


def _rules(ruleset: dict[str, Any]) -> list[dict[str, Any]]:
    return [c["add"]["rule"] for c in ruleset["nftables"] if "rule" in c["add"]]


def _port_rules(ruleset: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-(transport, port) capture rules (each starts with its `dport` match): all but the claim skip."""
    return [r for r in _rules(ruleset) if "payload" in r["expr"][0].get("match", {}).get("left", {})]


def test_the_divert_skips_what_the_kernel_udp_path_claimed() -> None:
    """tproxy: the divert chain's first rule accepts a datagram the in-kernel UDP path marked (before its chain
    runs), so it is neither diverted nor re-routed; REDIRECT mode has no such rule (its control stays as it was)."""
    first = _rules(build_ruleset(CaptureMode.TPROXY))[0]
    claimed = {"match": {"op": "==", "left": {"meta": {"key": "mark"}}, "right": KERNEL_UDP_FWMARK}}
    assert (first["chain"], first["expr"]) == (DIVERT_CHAIN, [claimed, {"accept": None}])
    redirect = build_ruleset(CaptureMode.REDIRECT)
    assert _port_rules(redirect) == _rules(redirect)


def _dport(rule: dict[str, Any]) -> tuple[str, int]:
    m = rule["expr"][0]["match"]
    return m["left"]["payload"]["protocol"], m["right"]


def test_tproxy_shape() -> None:
    rs = build_ruleset(CaptureMode.TPROXY)
    chains = [c["add"]["chain"] for c in rs["nftables"] if "chain" in c["add"]]
    assert chains == [
        {
            "family": "inet",
            "table": "aether",
            "name": DIVERT_CHAIN,
            "type": "route",
            "hook": "output",
            "prio": -150,
            "policy": "accept",
        }
    ]
    assert sorted(_dport(r) for r in _port_rules(rs)) == [("tcp", 18080), ("tcp", 18082), ("udp", 18082)]


def test_redirect_shape_keeps_the_port_and_counts_before_redirect() -> None:
    rs = build_ruleset(CaptureMode.REDIRECT)
    chains = [c["add"]["chain"] for c in rs["nftables"] if "chain" in c["add"]]
    assert [(c["name"], c["type"], c["hook"], c["prio"]) for c in chains] == [(REDIRECT_CHAIN, "nat", "output", -100)]
    for rule in _rules(rs):
        assert rule["expr"][-1] == {"redirect": {"port": _dport(rule)[1]}}
        assert "counter" in rule["expr"][-2]


def test_statement_after_terminal_is_refused() -> None:
    rs = build_ruleset(CaptureMode.REDIRECT)
    bad = copy.deepcopy(rs)
    _rules(bad)[0]["expr"].append({"counter": None})
    with pytest.raises(RulesetError, match="after terminal 'redirect'"):
        check_statement_order(bad)


@pytest.mark.parametrize(
    "ports",
    [
        {},
        {Transport.UDP: ()},
        {Transport.UDP: (0,)},
        {Transport.UDP: (70000,)},
        {Transport.UDP: (18082, 18082)},
        {Transport.TCP: (True,)},
    ],
)
def test_bad_ports_are_refused(ports: dict[Transport, tuple[int, ...]]) -> None:
    with pytest.raises(RulesetError):
        build_ruleset(CaptureMode.TPROXY, ports)


def test_replace_transaction_deletes_then_recreates_whole() -> None:
    rs = build_ruleset(CaptureMode.TPROXY)
    tx = replace_table_commands(rs)["nftables"]
    assert [next(iter(c)) for c in tx[:3]] == ["add", "flush", "delete"]
    assert all("table" in c[next(iter(c))] for c in tx[:3])
    assert tx[3:] == rs["nftables"]


def test_create_transaction_creates_and_deletes_nothing() -> None:
    rs = build_ruleset(CaptureMode.TPROXY)
    tx = create_table_commands(rs)["nftables"]
    assert tx[0] == {"create": {"table": {"family": "inet", "name": "aether"}}}
    assert tx[1:] == rs["nftables"][1:]
    assert not any("delete" in c or "flush" in c for c in tx)


def test_canonical_of_a_listing_equals_canonical_of_the_ruleset() -> None:
    rs = build_ruleset(CaptureMode.TPROXY)
    listing: dict[str, Any] = {"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}}]}
    for i, cmd in enumerate(rs["nftables"]):
        body = copy.deepcopy(cmd["add"])
        (kind,) = body
        body[kind]["handle"] = i + 1
        for stmt in body[kind].get("expr", []):
            if "counter" in stmt:
                stmt["counter"] = {"packets": 7, "bytes": 700}
        listing["nftables"].append(body)
    listing["nftables"].append({"table": {"family": "ip", "name": "other", "handle": 9}})
    assert diff(canonical(rs), canonical(listing)) == []


def test_diff_names_missing_and_extra() -> None:
    wanted = canonical(build_ruleset(CaptureMode.TPROXY))
    assert diff(wanted, canonical({"nftables": []}))[0] == "table inet aether is missing"
    fewer = canonical(build_ruleset(CaptureMode.TPROXY, {Transport.UDP: (18082,)}))
    reasons = diff(wanted, fewer)
    assert any(r.startswith("missing rule in 'divert_out': tcp dport == 18080") for r in reasons)
    assert diff(fewer, wanted) and all(r.startswith("extra rule") for r in diff(fewer, wanted))
    doubled = copy.deepcopy(wanted)
    doubled["rules"][DIVERT_CHAIN].append(doubled["rules"][DIVERT_CHAIN][0])
    assert "different order or duplicated" in diff(wanted, doubled)[0]


ports_strategy = st.dictionaries(
    st.sampled_from(list(Transport)),
    st.lists(st.integers(min_value=1, max_value=65535), min_size=1, max_size=6, unique=True).map(tuple),
    min_size=1,
)


@settings(max_examples=150, deadline=None)
@given(mode=st.sampled_from(list(CaptureMode)), ports=ports_strategy)
def test_properties(mode: CaptureMode, ports: dict[Transport, tuple[int, ...]]) -> None:
    rs = build_ruleset(mode, ports)
    rules = _port_rules(rs)
    assert len(_rules(rs)) == len(rules) + (mode is CaptureMode.TPROXY)  # the claim skip (tproxy only)
    # one rule per (transport, port), nothing else
    assert sorted(_dport(r) for r in rules) == sorted((t.value, p) for t, ps in ports.items() for p in ps)
    for rule in rules:
        expr = rule["expr"]
        # every rule diverts only traffic whose destination is not local
        assert expr[1] == {
            "match": {"op": "!=", "left": {"fib": {"result": "type", "flags": ["daddr"]}}, "right": "local"}
        }
        # counters only before the terminal statement, which is last
        assert [i for i, s in enumerate(expr) if "counter" in s] == [len(expr) - 2]
        if mode is CaptureMode.TPROXY:
            assert expr[-1] == {"mangle": {"key": {"meta": {"key": "mark"}}, "value": CAPTURE_DIVERT_FWMARK}}
            assert rule["chain"] == DIVERT_CHAIN
        else:
            assert expr[-1] == {"redirect": {"port": _dport(rule)[1]}}  # the same port: never rewritten
            assert rule["chain"] == REDIRECT_CHAIN
    check_statement_order(rs)
    # pure: same input, same output; canonical form is stable
    assert build_ruleset(mode, ports) == rs
    assert diff(canonical(rs), canonical(build_ruleset(mode, ports))) == []


def test_default_ports_are_the_contract() -> None:
    assert build_ruleset(CaptureMode.TPROXY) == build_ruleset(CaptureMode.TPROXY, CAPTURED_PORTS)
