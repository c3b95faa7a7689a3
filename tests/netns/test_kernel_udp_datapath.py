"""The in-kernel UDP path against the real kernel: a client pod netns holding the capture (tproxy, STRICT inbound)
and table `ip aether_udp`, two backend pod netns running real UDP programs (the udp_echo that names itself, and a
socat byte-for-byte echo), real sockets made inside the client netns."""

from __future__ import annotations

import json
import socket
import sys
from collections import Counter
from dataclasses import dataclass

import pytest

from aether.netns.contract import L4_OUTBOUND_PORT, CaptureMode, InboundMode, InboundPolicy
from aether.netns.install import install_capture
from aether.netns.kernel_udp import KernelArm, KernelBackend, build_kernel_udp
from aether.netns.kernel_udp_install import program_kernel_udp
from aether.netns.nsthread import call_in_netns
from aether.netns.rules import DIVERT_CHAIN, REDIRECT_CHAIN
from aether.testing.netlab import GATEWAY_LL, Lab, Pod, sh
from aether.testing.udp_clients import socat_echo_argv
from aether.testing.wait import wait_for

pytestmark = pytest.mark.privileged

NAMED, ECHO = 5353, 7007  # the backends' app ports: udp_echo (answers `<name>|payload`), socat (payload back)
VIP, VIP_ECHO = "10.96.29.10", "10.96.29.11"


@dataclass
class Rig:
    lab: Lab
    client: Pod
    b1: Pod
    b2: Pod

    def arms(self, w1: int = 70, w2: int = 30, with_b2: bool = True) -> list[KernelArm]:
        named = [KernelBackend(self.b1.ip, NAMED, w1)] + ([KernelBackend(self.b2.ip, NAMED, w2)] if with_b2 else [])
        return [KernelArm(VIP, tuple(named)), KernelArm(VIP_ECHO, (KernelBackend(self.b2.ip, ECHO, 1),))]

    def connected(self, vip: str = VIP) -> socket.socket:
        """A UDP socket made in the client netns, connected to vip:18082 (it accepts replies from there only)."""

        def make() -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(2.0)
            s.connect((vip, L4_OUTBOUND_PORT))
            return s

        return call_in_netns(self.client.path, make)


def exchange(sock: socket.socket, payload: bytes) -> bytes | None:
    try:
        sock.send(payload)
        return sock.recv(65536)
    except (TimeoutError, ConnectionRefusedError):  # refused: the ICMP port unreachable of a program not up yet
        return None


def _rig(lab: Lab, mode: CaptureMode) -> Rig:
    node = lab.add_node("n")
    client = lab.add_pod(node, "c", "10.29.0.2")
    b1, b2 = lab.add_pod(node, "b1", "10.29.0.3"), lab.add_pod(node, "b2", "10.29.0.4")
    for pod in (b1, b2):
        lab.spawn(pod.netns, [sys.executable, "-m", "aether.testing.udp_echo", pod.name, str(NAMED)])
    lab.spawn(b2.netns, socat_echo_argv(b2.ip, ECHO))
    inbound = InboundPolicy(InboundMode.STRICT, (GATEWAY_LL,)) if mode is CaptureMode.TPROXY else None
    install_capture(client.path, mode, inbound=inbound)
    r = Rig(lab, client, b1, b2)
    program_kernel_udp(client.path, r.arms())

    def both_answer() -> bool:  # the real signal: each backend program answers through the kernel path
        return exchange(r.connected(VIP_ECHO), b"up") == b"up" and _names(r, 40) >= {"b1", "b2"}

    wait_for(both_answer, timeout=20, what="both backends answering through the kernel rules")
    return r


@pytest.fixture
def rig(lab: Lab) -> Rig:
    return _rig(lab, CaptureMode.TPROXY)


def _names(r: Rig, n: int) -> set[str]:
    out = set()
    for _ in range(n):
        reply = exchange(r.connected(), b"who")
        if reply:
            out.add(reply.split(b"|")[0].decode())
    return out


def _counter(netns: str, table: str, chain: str) -> int:
    listed = json.loads(sh("nft", "-j", "list", "chain", *table.split(), chain, netns=netns))
    rules = [o["rule"] for o in listed["nftables"] if "rule" in o]
    return sum(s["counter"]["packets"] for r in rules for s in r["expr"] if "counter" in s)


def test_selection_by_vip_replies_from_vip_and_every_size(rig: Rig) -> None:
    """Each VIP reaches its own Service's backends; a connected socket gets the replies (so they come from
    VIP:18082); every datagram size to 65,507 B comes back byte for byte; the capture's divert marked them and the
    kernel path took them anyway (its undivert counter moved)."""
    assert _names(rig, 60) == {"b1", "b2"}
    echo = rig.connected(VIP_ECHO)
    for size in (1, 1472, 1473, 9000, 32768, 65507):
        payload = bytes(i % 251 for i in range(size))
        assert exchange(echo, payload) == payload, f"{size} B through the kernel path"
    assert _counter(rig.client.netns, "ip aether_udp", "undivert") > 0
    assert _counter(rig.client.netns, "inet aether", DIVERT_CHAIN) > 0  # the divert saw them and was undone


def test_weights_70_30_over_1000_fresh_flows(rig: Rig) -> None:
    counts: Counter[str] = Counter()
    for _ in range(1000):
        sock = rig.connected()
        reply = exchange(sock, b"w")
        sock.close()
        counts[reply.split(b"|")[0].decode() if reply else "none"] += 1
    print(f"70/30 asked over 1000 fresh flows: {dict(counts)}")
    # binomial(1000, 0.7): sd = sqrt(1000 * 0.7 * 0.3) = 14.5; a 5-sigma bound is 72
    assert counts["none"] == 0 and abs(counts["b1"] - 700) <= 72, counts


def test_without_undivert_the_divert_wins(rig: Rig) -> None:
    """Negative control: the same table without its undivert rule; the divert then sends the datagram to the
    pod's own loopback (the local route of table 0xae71), where nothing listens on the VIP's port: no reply."""
    rs = build_kernel_udp(rig.arms())
    cmds = [c for c in rs["nftables"] if c.get("add", {}).get("rule", {}).get("chain") != "undivert"]
    text = json.dumps(
        {
            "nftables": [
                {"add": {"table": {"family": "ip", "name": "aether_udp"}}},
                {"delete": {"table": {"family": "ip", "name": "aether_udp"}}},
                *cmds,
            ]
        }
    )
    sh("nft", "-j", "-f", "-", netns=rig.client.netns, input=text)
    assert exchange(rig.connected(VIP_ECHO), b"x") is None
    program_kernel_udp(rig.client.path, rig.arms())  # restored: it answers again
    assert exchange(rig.connected(VIP_ECHO), b"x") == b"x"


def test_removed_backend_flow_moves_at_its_next_datagram(rig: Rig) -> None:
    """A flow pinned on b2 (conntrack) stays there while b2 is in the arm; removing b2 deletes its conntrack
    entries, and the same connected socket's next datagram reaches b1. Without the deletion (`previous` not given:
    nothing forgotten) the flow stays on b2, though the rules no longer name it: the negative control."""

    def pinned_on_b2() -> socket.socket:
        while True:
            sock = rig.connected()
            reply = exchange(sock, b"p")
            if reply and reply.startswith(b"b2|"):
                return sock
            sock.close()

    old, new = rig.arms(), rig.arms(with_b2=False)
    stale = pinned_on_b2()
    assert program_kernel_udp(rig.client.path, new) == 0
    assert (exchange(stale, b"again") or b"").startswith(b"b2|"), "conntrack keeps the flow without the deletion"
    program_kernel_udp(rig.client.path, old)
    moved = pinned_on_b2()
    forgotten = program_kernel_udp(rig.client.path, new, previous=old)
    assert forgotten >= 2  # this flow and the stale one (both VIP:18082 -> b2:5353)
    assert (exchange(moved, b"again") or b"").startswith(b"b1|")


def test_redirect_capture_negative_control(lab: Lab) -> None:
    """With the capture in REDIRECT mode (R6's negative control) and no kernel rules, a datagram to the VIP is
    redirected to the pod's own port 18082 (the redirect rule's counter moves): the VIP is gone, no backend gets
    it. With the kernel rules, whose nat chain runs first (priority dstnat - 1), the same datagram reaches the
    VIP's backend."""
    r = _rig(lab, CaptureMode.REDIRECT)
    assert exchange(r.connected(VIP_ECHO), b"k") == b"k"
    assert _names(r, 20) == {"b1", "b2"}
    before = _counter(r.client.netns, "inet aether", REDIRECT_CHAIN)
    sh("nft", "delete", "table", "ip", "aether_udp", netns=r.client.netns)
    assert exchange(r.connected(VIP_ECHO), b"k") is None
    assert _counter(r.client.netns, "inet aether", REDIRECT_CHAIN) > before
