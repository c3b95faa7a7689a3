"""The in-kernel UDP path's pure builder (golden, the weight ranges' property, what it matches: R5) and its
installer against the recording effects (no privileges)."""

from __future__ import annotations

import copy
import errno
import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroute2.netlink.exceptions import NetlinkError

from aether.netns.contract import CAPTURE_DIVERT_FWMARK, KERNEL_UDP_FWMARK, L4_OUTBOUND_PORT
from aether.netns.kernel_udp import (
    BUCKETS,
    CLAIM_CHAIN,
    COUNT_BACKEND_CHAIN,
    DISPATCH_CHAIN,
    PRIO_UNDIVERT,
    UNDIVERT_CHAIN,
    Family,
    KernelArm,
    KernelBackend,
    build_kernel_udp,
    share_ranges,
)
from aether.netns.kernel_udp_diff import canonical
from aether.netns.kernel_udp_install import KernelUdpError, apply_kernel_udp, departed
from aether.netns.kernel_udp_text import to_text
from aether.netns.rules import PRIO_DSTNAT, PRIO_MANGLE, RulesetError
from aether.testing.golden import check_golden, golden_json
from aether.testing.kernel_udp_effects import ARMS, B1, B2, B3, RecordingKernelUdp

GOLDEN = Path(__file__).parent / "golden"


def test_golden_kernel_udp() -> None:
    check_golden(GOLDEN / "kernel_udp.json", golden_json(build_kernel_udp(ARMS)))


def test_golden_kernel_udp_text() -> None:
    """What the kernel is handed: the same transaction as nft text (`kernel_udp_text`), both families, an idle
    timeout on one arm and the node's default on the others."""
    arms = (
        ARMS[0]._replace(idle_timeout_s=7.5),
        *ARMS[1:],
        KernelArm("fd00:96::10", (KernelBackend("fd00:29::2", 53, 1),)),
    )
    check_golden(GOLDEN / "kernel_udp.nft", to_text(build_kernel_udp(arms, default_idle_timeout_s=30)))


def _pick(rs: dict[str, Any], chain: str) -> list[Any]:
    rules = canonical(rs)["rules"][chain]
    return next(s["vmap"]["data"]["set"] for s in rules[-1] if "vmap" in s)


def test_drain_and_invalid_backend() -> None:
    """Weight 0 gets no range; an invalid backend's range drops (its share is not given to the others); an arm
    with no range at all drops."""
    rs = build_kernel_udp(ARMS)
    assert _pick(rs, "svc_10_96_0_10") == [
        [{"range": [0, 69]}, {"goto": {"target": "svc_10_96_0_10__10_29_1_2_5353"}}],
        [{"range": [70, 94]}, {"goto": {"target": "svc_10_96_0_10__10_29_1_3_5353"}}],
        [{"range": [95, 99]}, {"drop": None}],
    ]
    assert _pick(rs, "svc_10_96_0_12") == [[{"range": [0, 99]}, {"goto": {"target": "svc_10_96_0_12__10_29_1_2_53"}}]]
    assert "svc_10_96_0_12__10_29_1_5_53" not in canonical(rs)["chains"]
    assert canonical(rs)["rules"]["svc_10_96_0_11"] == [[{"drop": None}]]


def _matches(rs: dict[str, Any], family: Family) -> list[Any]:
    """Every left side matched or looked up anywhere in the ruleset, and every literal value it is compared with."""
    out: list[Any] = []
    for rule in (r for rules in canonical(rs, family)["rules"].values() for r in rules):
        for stmt in rule:
            if "match" in stmt:
                out.append((stmt["match"]["left"], stmt["match"]["right"]))
            if "vmap" in stmt:
                out.append(
                    (stmt["vmap"]["key"], stmt["vmap"]["data"] if isinstance(stmt["vmap"]["data"], str) else "set")
                )
            if "map" in (stmt.get("counter") or {}):
                out.append((stmt["counter"]["map"]["key"], stmt["counter"]["map"]["data"]))
    return out


@pytest.mark.parametrize("family", ["ip", "ip6"])
def test_only_plaintext_udp_to_18082_is_touched(family: Family) -> None:
    """R5: the only traffic matched is UDP to a listed VIP on the plaintext port 18082 (the sets' keys); no TCP
    match, no other port, nothing about the QUIC class; the chains sit after the divert and at dstnat. Both
    tables alike."""
    six = KernelArm("fd00:96::10", (KernelBackend("fd00:29::2", 53, 1),))
    rs = build_kernel_udp((*ARMS, six))
    c = canonical(rs, family)
    keys = {(e["concat"][0], e["concat"][1]) for e in c["sets"]["vips"]["elem"]}
    assert keys and {port for _, port in keys} == {L4_OUTBOUND_PORT}
    daddr_dport = {
        "concat": [
            {"payload": {"protocol": family, "field": "daddr"}},
            {"payload": {"protocol": "udp", "field": "dport"}},
        ]
    }
    l4udp = {"meta": {"key": "l4proto"}}
    backend = {"concat": [{"ct": {"key": f"{family} daddr", "dir": "original"}}, *daddr_dport["concat"]]}
    for left, right in _matches(rs, family):
        assert left in (
            daddr_dport,
            backend,
            l4udp,
            {"meta": {"key": "mark"}},
            {"numgen": {"mode": "random", "mod": 100, "offset": 0}},
        )
        if left == l4udp:
            assert right == "udp"
        if left == daddr_dport:
            assert right in ("@vips", "@services", "@vip_counters")
        if left == backend:
            assert right == "@backend_counters"
    assert "tcp" not in str(rs)
    assert c["chains"][UNDIVERT_CHAIN]["prio"] == PRIO_UNDIVERT and PRIO_MANGLE < PRIO_UNDIVERT < PRIO_DSTNAT
    assert c["chains"][DISPATCH_CHAIN]["type"] == "nat" and c["chains"][DISPATCH_CHAIN]["prio"] == PRIO_DSTNAT - 1
    assert c["chains"][CLAIM_CHAIN]["type"] == c["chains"][COUNT_BACKEND_CHAIN]["type"] == "filter"
    assert c["chains"][CLAIM_CHAIN]["prio"] < PRIO_MANGLE < PRIO_DSTNAT < c["chains"][COUNT_BACKEND_CHAIN]["prio"]
    assert next(s for s in c["rules"][UNDIVERT_CHAIN][0] if "match" in s)["match"]["right"] == CAPTURE_DIVERT_FWMARK
    claim = c["rules"][CLAIM_CHAIN][1]  # the claim mark is set only on datagrams to the table's VIP.port pairs
    assert claim[0]["match"]["right"] == "@vips" and claim[-1]["mangle"]["value"] == KERNEL_UDP_FWMARK


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=1_000_000), min_size=1, max_size=12))
def test_ranges_partition_buckets_by_weight(weights: list[int]) -> None:
    """Largest remainder: the ranges tile 0-99 in backend order, each holds floor or ceil of 100 * w / sum,
    and weight 0 holds nothing."""
    ranges = share_ranges(weights)
    total = sum(weights)
    if total == 0:
        assert ranges == []
        return
    assert ranges[0].low == 0 and ranges[-1].high == BUCKETS - 1
    assert all(a.high + 1 == b.low for a, b in itertools.pairwise(ranges))
    got = {r.backend: r.high - r.low + 1 for r in ranges}
    for i, w in enumerate(weights):
        n = got.get(i, 0)
        exact = BUCKETS * w / total
        assert int(exact) <= n <= int(exact) + 1
        if w == 0:
            assert n == 0


def test_share_ranges_rounding_ties() -> None:
    assert share_ranges([1, 1, 1]) == [(0, 0, 33), (1, 34, 66), (2, 67, 99)]  # the leftover bucket: the first
    assert share_ranges([70, 30]) == [(0, 0, 69), (1, 70, 99)]
    assert share_ranges([0, 0]) == []


@pytest.mark.parametrize(
    ("arms", "message"),
    [
        ([KernelArm("10.96.0.300", ())], "not an IP address"),
        ([KernelArm("fd00::1", (KernelBackend(B1, 53, 1),))], "not the VIP's family"),
        ([KernelArm("fd00::1", ()), KernelArm("fd00:0::1", ())], "listed twice"),
        ([KernelArm("10.96.0.1", ()), KernelArm("10.96.0.1", ())], "listed twice"),
        ([KernelArm("10.96.0.1", (KernelBackend(B1, 0, 1),))], "port"),
        ([KernelArm("10.96.0.1", (KernelBackend(B1, 53, -1),))], "weights"),
    ],
)
def test_rejects(arms: list[KernelArm], message: str) -> None:
    with pytest.raises(RulesetError, match=message):
        build_kernel_udp(arms)


def test_empty_builds_empty_maps() -> None:
    families: tuple[tuple[Family, str], ...] = (("ip", "ipv4_addr"), ("ip6", "ipv6_addr"))
    for family, addr in families:
        c = canonical(build_kernel_udp([]), family)
        assert c["sets"] == {
            "vips": {"elem": [], "type": [addr, "inet_service"]},
            "services": {"elem": [], "type": [addr, "inet_service"], "map": "verdict"},
            "vip_counters": {"elem": [], "type": [addr, "inet_service"], "map": "counter"},
            "backend_counters": {"elem": [], "type": [addr, addr, "inet_service"], "map": "counter"},
        }
        assert c["counters"] == c["timeouts"] == {}


def test_apply_loads_reads_back_and_forgets_departed_flows() -> None:
    fx = RecordingKernelUdp(flows=[("10.96.0.10", 18082, B2, 5353), ("10.96.0.10", 18082, B1, 5353)])
    assert apply_kernel_udp(fx, "ns", ARMS) == 0
    listed = [("nft", "list", "table", "ip"), ("nft", "list", "table", "ip6")]
    assert fx.calls == [listed[0], ("nft", "replace"), *listed]  # no table yet: replaced whole, read back
    new = (KernelArm("10.96.0.10", (KernelBackend(B1, 5353, 70), KernelBackend(B3, 5353, 5, valid=False))), *ARMS[1:])
    assert departed(ARMS, new) == [("10.96.0.10", B2, 5353)]
    assert apply_kernel_udp(fx, "ns", new, previous=ARMS) == 1
    assert fx.calls[-1] == ("forget_flows", "10.96.0.10", B2, 5353)
    assert fx.flows == [("10.96.0.10", 18082, B1, 5353)]


def test_drained_backend_keeps_its_flows_and_invalid_loses_them() -> None:
    drained = (KernelArm("10.96.0.10", (KernelBackend(B1, 5353, 0), KernelBackend(B2, 5353, 1))),)
    invalid = (KernelArm("10.96.0.10", (KernelBackend(B1, 5353, 1, valid=False), KernelBackend(B2, 5353, 1))),)
    before = (KernelArm("10.96.0.10", (KernelBackend(B1, 5353, 1), KernelBackend(B2, 5353, 1))),)
    assert departed(before, drained) == []
    assert departed(before, invalid) == [("10.96.0.10", B1, 5353)]
    assert departed(before, ()) == [("10.96.0.10", B1, 5353), ("10.96.0.10", B2, 5353)]


def test_refused_transaction_keeps_the_previous_rules() -> None:
    fx = RecordingKernelUdp()
    apply_kernel_udp(fx, "ns", ARMS)
    kept = copy.deepcopy(fx.tables)
    fx.refuse = True
    with pytest.raises(KernelUdpError, match="previous rules stay"):
        apply_kernel_udp(fx, "ns", ARMS[:1], previous=ARMS)
    assert fx.tables == kept
    assert [c for c in fx.calls if c[0] == "forget_flows"] == []  # nothing forgotten for rules that did not load


def test_a_conntrack_failure_after_the_rules_loaded_is_reported_and_the_retry_forgets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pyroute2's NetlinkError is no OSError: it passed every handler, so the sidecar kept its record of the old arms
    with no failure noted and never retried, and the departed backend's flows lived on. Now it is a KernelUdpError
    (a failure the sidecar notes and retries), and the retry, from the same previous arms, forgets the flows."""
    fx = RecordingKernelUdp(flows=[("10.96.0.10", 18082, B2, 5353)])
    apply_kernel_udp(fx, "ns", ARMS)
    new = (KernelArm("10.96.0.10", (KernelBackend(B1, 5353, 70),)), *ARMS[1:])

    def broken(vip: str, vip_port: int, backend_ip: str, backend_port: int) -> int:
        raise NetlinkError(errno.ENOBUFS, "No buffer space available")

    with monkeypatch.context() as m:
        m.setattr(fx, "forget_flows", broken)
        with pytest.raises(KernelUdpError, match="rules loaded in ns, but forgetting departed backends' flows failed"):
            apply_kernel_udp(fx, "ns", new, previous=ARMS)
    assert apply_kernel_udp(fx, "ns", new, previous=ARMS) == 1
    assert fx.flows == []


def test_canonical_ignores_the_order_nft_lists_set_elements_in() -> None:
    """nft lists a large set's elements in its own (hash) order: 1,000 Services failed the read-back until the
    canonical form sorted them (bench.kernel_udp_program)."""
    listed = copy.deepcopy(build_kernel_udp(ARMS))
    for item in listed["nftables"]:
        if "element" in item.get("add", {}):
            item["add"]["element"]["elem"].reverse()
    assert canonical(listed) == canonical(build_kernel_udp(ARMS))
