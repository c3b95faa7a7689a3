"""The in-kernel UDP path against the real kernel, IPv4 and IPv6 alike: a client pod netns holding the capture
(tproxy, STRICT inbound) and tables `ip|ip6 aether_udp`, two backend pod netns running real UDP programs, real
sockets made inside the client netns (`aether.testing.kernel_udp_rig`)."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest

from aether.netns.contract import CaptureMode
from aether.netns.kernel_udp import build_kernel_udp, replace_commands, service_chain
from aether.netns.kernel_udp_install import program_kernel_udp
from aether.netns.kernel_udp_text import to_text
from aether.netns.rules import DIVERT_CHAIN, REDIRECT_CHAIN
from aether.testing.kernel_udp_rig import Rig, chain_packets, exchange, make_rig
from aether.testing.netlab import Lab, sh
from aether.testing.wait import wait_for

pytestmark = pytest.mark.privileged
FAMILIES = pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])


def table(r: Rig) -> str:
    return "ip aether_udp" if r.family == 4 else "ip6 aether_udp"


@pytest.fixture(params=[4, 6], ids=["ipv4", "ipv6"])
def rig(lab: Lab, request: pytest.FixtureRequest) -> Rig:
    return make_rig(lab, CaptureMode.TPROXY, request.param)


def test_selection_by_vip_replies_from_vip_and_every_size(rig: Rig) -> None:
    """Each VIP reaches its own Service's backends; a connected socket gets the replies (so they come from
    VIP:18082); every datagram size to 65,507 B comes back byte for byte. The table's `claim` marked them before
    the capture's divert, which skipped them: its counters and `undivert`'s never moved (before the claim, each
    datagram was marked, re-routed, unmarked and re-routed again: about 10 % of a ping-pong's rate)."""
    assert rig.names(60) == {"b1", "b2"}
    echo = rig.connected(rig.vip_echo)
    for size in (1, 1452, 1472, 1473, 9000, 32768, 65507):  # 1452 / 1472: one 1500 B packet on IPv6 / IPv4
        payload = bytes(i % 251 for i in range(size))
        assert exchange(echo, payload) == payload, f"{size} B through the kernel path"
    assert chain_packets(rig.client.netns, table(rig), "undivert") == 0
    assert chain_packets(rig.client.netns, "inet aether", DIVERT_CHAIN) == 0  # the divert never marked them


def test_a_capture_without_the_claim_skip_is_undone_by_undivert(rig: Rig) -> None:
    """A pod whose capture predates the claim-skip rule (deleted here) still marks the datagrams for the divert;
    `undivert` clears that mark and the kernel path carries them (both counters move)."""
    listed = json.loads(sh("nft", "-j", "-a", "list", "chain", "inet", "aether", DIVERT_CHAIN, netns=rig.client.netns))
    skip = next(o["rule"] for o in listed["nftables"] if "rule" in o and "accept" in o["rule"]["expr"][-1])
    sh("nft", "delete", "rule", "inet", "aether", DIVERT_CHAIN, "handle", str(skip["handle"]), netns=rig.client.netns)
    assert exchange(rig.connected(rig.vip_echo), b"old capture") == b"old capture"
    assert chain_packets(rig.client.netns, table(rig), "undivert") > 0
    assert chain_packets(rig.client.netns, "inet aether", DIVERT_CHAIN) > 0


def test_weights_70_30_over_1000_fresh_flows(rig: Rig) -> None:
    counts: Counter[str] = Counter()
    for _ in range(1000):
        sock = rig.connected()
        reply = exchange(sock, b"w")
        sock.close()
        counts[reply.split(b"|")[0].decode() if reply else "none"] += 1
    print(f"IPv{rig.family}, 70/30 asked over 1000 fresh flows: {dict(counts)}")
    # binomial(1000, 0.7): sd = sqrt(1000 * 0.7 * 0.3) = 14.5; a 5-sigma bound is 72
    assert counts["none"] == 0 and abs(counts["b1"] - 700) <= 72, counts


def test_without_the_claim_and_undivert_the_divert_wins(rig: Rig) -> None:
    """Negative control: the same tables without the claim's mark and the undivert rules; the divert then sends the
    datagram to the pod's own loopback (the local route of table 0xae71), where nothing listens on the VIP's port:
    no reply."""
    rs = build_kernel_udp(rig.arms())

    def kept(c: dict[str, Any]) -> bool:
        rule = c.get("add", {}).get("rule", {})
        return rule.get("chain") != "undivert" and "mangle" not in rule.get("expr", [{}])[-1]

    cmds = [c for c in rs["nftables"] if kept(c)]
    sh("nft", "-f", "-", netns=rig.client.netns, input=to_text(replace_commands({"nftables": cmds})))
    assert exchange(rig.connected(rig.vip_echo), b"x") is None
    program_kernel_udp(rig.client.path, rig.arms())  # restored (replaced whole: not what it was): it answers again
    assert exchange(rig.connected(rig.vip_echo), b"x") == b"x"


def test_removed_backend_flow_moves_at_its_next_datagram(rig: Rig) -> None:
    """A flow pinned on b2 (conntrack) stays there while b2 is in the arm; removing b2 deletes its conntrack
    entries, and the same connected socket's next datagram reaches b1. Without the deletion (`previous` not given:
    nothing forgotten) the flow stays on b2, though the rules no longer name it: the negative control."""
    old, new = rig.arms(), rig.arms(with_b2=False)
    stale = rig.pinned("b2")
    assert program_kernel_udp(rig.client.path, new) == 0
    assert (exchange(stale, b"again") or b"").startswith(b"b2|"), "conntrack keeps the flow without the deletion"
    program_kernel_udp(rig.client.path, old)
    moved = rig.pinned("b2")
    forgotten = program_kernel_udp(rig.client.path, new, previous=old)
    assert forgotten >= 2  # this flow and the stale one (both VIP:18082 -> b2:5353)
    assert (exchange(moved, b"again") or b"").startswith(b"b1|")


@FAMILIES
def test_redirect_capture_negative_control(lab: Lab, family: int) -> None:
    """With the capture in REDIRECT mode (R6's negative control) and no kernel rules, a datagram to the VIP is
    redirected to the pod's own port 18082 (the redirect rule's counter moves): the VIP is gone, no backend gets
    it. With the kernel rules, whose nat chain runs first (priority dstnat - 1), the same datagram reaches the
    VIP's backend."""
    r = make_rig(lab, CaptureMode.REDIRECT, family)
    assert exchange(r.connected(r.vip_echo), b"k") == b"k"
    assert r.names(20) == {"b1", "b2"}
    before = chain_packets(r.client.netns, "inet aether", REDIRECT_CHAIN)
    sh("nft", "delete", "table", *table(r).split(), netns=r.client.netns)
    assert exchange(r.connected(r.vip_echo), b"k") is None
    assert chain_packets(r.client.netns, "inet aether", REDIRECT_CHAIN) > before


def test_counters_count_every_datagram_per_service_and_backend(rig: Rig) -> None:
    """The named counters (`read_kernel_udp_counters`): the Service's counts every datagram sent to VIP:18082, a
    backend's every datagram rewritten to it, the flow's first and its later ones alike (the nat chains see only
    the first), bytes as IP length; the other family's and the other Service's counters do not move."""
    from aether.netns.kernel_udp_install import read_kernel_udp_counters

    def counts() -> dict[tuple[str, str | None], tuple[int, int]]:
        got = read_kernel_udp_counters(rig.client.path)
        return {(c.vip, c.backend_ip): (c.packets, c.bytes) for c in got}

    before = counts()
    sock = rig.connected(rig.vip_echo)
    for size in (100, 65507, 100):
        assert exchange(sock, bytes(size)) is not None
    after = counts()
    header = 20 + 8 if rig.family == 4 else 40 + 8
    sent = (3, 100 + 65507 + 100 + 3 * header)
    b2 = rig.addr(rig.b2)

    def delta(key: tuple[str, str | None]) -> tuple[int, int]:
        return (after[key][0] - before[key][0], after[key][1] - before[key][1])

    assert delta((rig.vip_echo, None)) == sent
    assert delta((rig.vip_echo, b2)) == sent
    others = [k for k in after if k[0] != rig.vip_echo]
    assert len(others) == 8 and all(delta(k) == (0, 0) for k in others), after  # 10 counters: 5 per family
    print(json.dumps({f"{k[0]} {k[1]}": v for k, v in after.items()}))


def test_idle_timeout_ends_the_flow_and_the_next_datagram_picks_again(rig: Rig) -> None:
    """The arm's idle timeout (a `ct timeout` object, 2 s) is the flow's conntrack timeout (the kernel's entry says
    <= 2 s left, against the kernel's 30/120 s for the Service without one). A flow pinned on b2, with b2 then
    drained (weight 0: its flows stay, as on the Envoy path), keeps reaching b2 while it is busy; once it idles
    past 2 s its entry is gone and the same socket's next datagram is a new flow, which can only pick b1."""
    program_kernel_udp(rig.client.path, rig.arms(idle_timeout_s=1.5), previous=rig.arms())
    sock = rig.pinned("b2")
    flow = rig.flow(sock)
    assert flow is not None and flow[0] == rig.addr(rig.b2) and flow[1] <= 2, flow
    echo = rig.connected(rig.vip_echo)
    assert exchange(echo, b"e") == b"e"
    untimed = rig.flow(echo)
    assert untimed is not None and untimed[1] > 2, untimed  # the kernel's default for a Service without one
    drained = rig.arms(w1=1, w2=0, idle_timeout_s=1.5)
    program_kernel_udp(rig.client.path, drained, previous=rig.arms(idle_timeout_s=1.5))
    assert (exchange(sock, b"busy") or b"").startswith(b"b2|"), "a drained backend keeps its live flow"
    wait_for(lambda: rig.flow(sock) is None, timeout=10, interval=0.2, what="the idle flow's conntrack entry to end")
    assert (exchange(sock, b"again") or b"").startswith(b"b1|")


def test_without_an_idle_timeout_the_drained_flow_stays(rig: Rig) -> None:
    """Negative control for the test above: no idle timeout (the kernel's 30/120 s), the same drain, 3 s idle: the
    flow is still on b2."""
    sock = rig.pinned("b2")
    program_kernel_udp(rig.client.path, rig.arms(w1=1, w2=0), previous=rig.arms())
    flow = rig.flow(sock)
    assert flow is not None and flow[0] == rig.addr(rig.b2) and flow[1] > 20, flow  # the kernel's default
    time.sleep(3.0)  # idling is what is tested: nothing to wait on but time (the test above ends its flow in 2 s)
    assert (exchange(sock, b"again") or b"").startswith(b"b2|")


def test_incremental_update_keeps_the_other_services_counters_and_chains(rig: Rig) -> None:
    """An endpoint change with `previous` rewrites only that Service: the other Service's counter keeps its count
    and its chain its handle, and the flows now go only to the endpoint left. Negative control: the same change
    against tables that are not what `previous` builds (one element deleted by hand) replaces them whole, and
    that counter starts again at 0."""
    echo = rig.connected(rig.vip_echo)
    for _ in range(5):
        assert exchange(echo, b"c") == b"c"

    def echo_state() -> tuple[int, int]:
        """The echo Service's counter's packets and its chain's handle."""
        listed = json.loads(sh("nft", "-j", "list", "table", *table(rig).split(), netns=rig.client.netns))
        name = service_chain(rig.vip_echo)
        counter = next(o["counter"] for o in listed["nftables"] if o.get("counter", {}).get("name") == name)
        chain = next(o["chain"] for o in listed["nftables"] if o.get("chain", {}).get("name") == name)
        return counter["packets"], chain["handle"]

    packets, handle = echo_state()
    assert packets >= 5
    moved = rig.arms(with_b2=False)
    program_kernel_udp(rig.client.path, moved, previous=rig.arms())
    assert echo_state() == (packets, handle)
    assert rig.names(20) == {"b1"}
    assert exchange(echo, b"c") == b"c"
    key = f"{rig.vip} . 18082"
    sh("nft", "delete", "element", *table(rig).split(), "vips", "{", key, "}", netns=rig.client.netns)
    program_kernel_udp(rig.client.path, rig.arms(), previous=moved)
    assert echo_state()[0] == 0  # a new table (its handles are numbered afresh: only the count tells)
    assert rig.names(40) == {"b1", "b2"}
