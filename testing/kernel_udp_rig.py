"""The in-kernel UDP path's real-kernel rig (tests/netns/test_kernel_udp_*.py): a dual-stack client pod netns
holding the capture and tables `ip|ip6 aether_udp`, two dual-stack backend pod netns running real UDP programs
(`aether.testing.udp_echo`, which names itself, on both families; a socat byte-for-byte echo per family), and
sockets made inside the client netns. Every arm is programmed for both families at once, as a node would; a test
dials the family it is about."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass

from aether.netns.contract import L4_OUTBOUND_PORT, CaptureMode, InboundMode, InboundPolicy
from aether.netns.install import install_capture
from aether.netns.kernel_udp import KernelArm, KernelBackend
from aether.netns.kernel_udp_install import program_kernel_udp
from aether.netns.nsthread import call_in_netns
from aether.testing.netlab import GATEWAY_LL, Lab, Pod, sh
from aether.testing.udp_clients import socat_echo_argv
from aether.testing.wait import wait_for

NAMED, ECHO = 5353, 7007  # the backends' app ports: udp_echo (answers `<name>|payload`), socat (payload back)
VIPS = {4: ("10.96.29.10", "10.96.29.11"), 6: ("fd00:96:29::10", "fd00:96:29::11")}  # (named, echo) per family


@dataclass
class Rig:
    lab: Lab
    client: Pod
    b1: Pod
    b2: Pod
    family: int  # 4 or 6: what the test dials

    @property
    def vip(self) -> str:
        return VIPS[self.family][0]

    @property
    def vip_echo(self) -> str:
        return VIPS[self.family][1]

    def addr(self, pod: Pod, family: int | None = None) -> str:
        ip = pod.ip6 if (family or self.family) == 6 else pod.ip
        assert ip is not None
        return ip

    def arms(
        self, w1: int = 70, w2: int = 30, with_b2: bool = True, idle_timeout_s: float | None = None
    ) -> list[KernelArm]:
        """Both families' arms: the named VIP over b1/b2 by weight, the echo VIP to b2's socat."""
        out = []
        for family, (vip, vip_echo) in VIPS.items():
            named = [KernelBackend(self.addr(self.b1, family), NAMED, w1)]
            if with_b2:
                named.append(KernelBackend(self.addr(self.b2, family), NAMED, w2))
            out += [
                KernelArm(vip, tuple(named), idle_timeout_s),
                KernelArm(vip_echo, (KernelBackend(self.addr(self.b2, family), ECHO, 1),)),
            ]
        return out

    def connected(self, vip: str | None = None, bind_port: int = 0) -> socket.socket:
        """A UDP socket made in the client netns, connected to vip:18082 (it accepts replies from there only)."""
        target = vip or self.vip

        def make() -> socket.socket:
            s = socket.socket(socket.AF_INET6 if ":" in target else socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(2.0)
            if bind_port:
                s.bind(("::" if ":" in target else "0.0.0.0", bind_port))
            s.connect((target, L4_OUTBOUND_PORT))
            return s

        return call_in_netns(self.client.path, make)

    def names(self, n: int) -> set[str]:
        """Which backends answer `n` fresh flows to the named VIP."""
        out = set()
        for _ in range(n):
            sock = self.connected()
            reply = exchange(sock, b"who")
            sock.close()
            if reply:
                out.add(reply.split(b"|")[0].decode())
        return out

    def flow(self, sock: socket.socket) -> tuple[str, int] | None:
        """The conntrack entry of `sock`'s flow in the client netns: (the backend it was rewritten to, seconds left
        before it times out), or None when there is none (never made, deleted, or timed out)."""
        sport = sock.getsockname()[1]
        family = socket.AF_INET6 if sock.family == socket.AF_INET6 else socket.AF_INET

        def look() -> tuple[str, int] | None:
            from pyroute2 import Conntrack

            ct = Conntrack(nfgen_family=family)
            try:
                for e in ct.dump_entries():
                    if e.tuple_orig.proto == socket.IPPROTO_UDP and e.tuple_orig.sport == sport:
                        return str(e.tuple_reply.saddr), int(e.timeout)
            finally:
                ct.close()
            return None

        return call_in_netns(self.client.path, look)

    def pinned(self, backend: str) -> socket.socket:
        """A connected socket whose flow picked `backend` (fresh flows until one does)."""
        return pinned_on(self.connected, backend)


def pinned_on(make: Callable[[], socket.socket], backend: str) -> socket.socket:
    while True:
        sock = make()
        reply = exchange(sock, b"p")
        if reply and reply.startswith(backend.encode() + b"|"):
            return sock
        sock.close()


def exchange(sock: socket.socket, payload: bytes) -> bytes | None:
    try:
        sock.send(payload)
        return sock.recv(65536)
    except (TimeoutError, ConnectionRefusedError):  # refused: the ICMP port unreachable of a program not up yet
        return None


def chain_packets(netns: str, table: str, chain: str) -> int:
    """The sum of the anonymous counters in `chain` of `table` ("inet aether", "ip6 aether_udp", ...)."""
    listed = json.loads(sh("nft", "-j", "list", "chain", *table.split(), chain, netns=netns))
    rules = [o["rule"] for o in listed["nftables"] if "rule" in o]
    return sum(s["counter"]["packets"] for r in rules for s in r["expr"] if isinstance(s.get("counter"), dict))


def make_rig(lab: Lab, mode: CaptureMode, family: int) -> Rig:
    node = lab.add_node("n")
    client = lab.add_pod(node, "c", "10.29.0.2", ip6="fd00:29::2")
    b1 = lab.add_pod(node, "b1", "10.29.0.3", ip6="fd00:29::3")
    b2 = lab.add_pod(node, "b2", "10.29.0.4", ip6="fd00:29::4")
    for pod in (b1, b2):
        lab.spawn(pod.netns, [sys.executable, "-m", "aether.testing.udp_echo", pod.name, str(NAMED), "--dual-stack"])
    for ip in (b2.ip, b2.ip6):
        assert ip is not None
        lab.spawn(b2.netns, socat_echo_argv(ip, ECHO))
    inbound = InboundPolicy(InboundMode.STRICT, (GATEWAY_LL,)) if mode is CaptureMode.TPROXY else None
    install_capture(client.path, mode, inbound=inbound)
    r = Rig(lab, client, b1, b2, family)
    program_kernel_udp(client.path, r.arms())

    def both_answer() -> bool:  # the real signal: each backend program answers through the kernel path
        return all(exchange(r.connected(v[1]), b"up") == b"up" for v in VIPS.values()) and r.names(40) >= {"b1", "b2"}

    wait_for(both_answer, timeout=20, what="both backends answering through the kernel rules")
    return r
