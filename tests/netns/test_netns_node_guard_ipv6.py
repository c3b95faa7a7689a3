"""The node's mesh-source guard on IPv6: a pod sending with an IPv6 mesh source is dropped where it enters its node.

Real kernel, no Envoy: nodes n1 (fd00:250::1) and n2 (fd00:250::2) on one link; on n1 a pod `rogue` without aether's
ruleset and a STRICT pod `target` (mesh sources fd00:250::/64), both dual-stack. The rogue puts n2's address and an
unassigned one of the prefix on its own eth0 and sends UDP from each to the target's IPv6 address (IPv6 has no
rp_filter: nothing else stops it). n1's guard (`ip6 saddr fd00:250::/64 fib saddr . iif oif missing counter drop`)
drops both, counted; the control: n2's genuine datagram, from the same address over the node link, arrives.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from aether.netns import node_guard
from aether.netns.contract import CaptureMode, InboundMode, InboundPolicy
from aether.netns.install import install_capture
from aether.testing.netlab import Lab, Node, Pod, sh

pytestmark = [pytest.mark.privileged]

PREFIX, N1, N2, UNASSIGNED = "fd00:250::/64", "fd00:250::1", "fd00:250::2", "fd00:250::99"
PORT = 9999
SINK = r"""
import json, socket, sys
u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
u.bind(("::", int(sys.argv[1])))
print("ready", flush=True)
u.settimeout(1.5)
got = []
try:
    while True:
        data, peer = u.recvfrom(65536)
        got.append([peer[0], data.decode()])
except OSError:
    pass
print(json.dumps(got), flush=True)
"""
SEND = "import socket,sys; s=socket.socket(socket.AF_INET6,socket.SOCK_DGRAM); s.bind((sys.argv[1],0)); "
SEND += "s.sendto(sys.argv[3].encode(),(sys.argv[2],int(sys.argv[4])))"


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Pod, Pod, Node, Node]]:
    lab = Lab()
    try:
        n1, n2 = lab.add_node("g1"), lab.add_node("g2")
        lab.link_nodes(n1, n2, "10.250.1.1", "10.250.1.2", a_ip6=N1, b_ip6=N2)
        rogue = lab.add_pod(n1, "rogue", "10.200.1.2", ip6="fd00:200:1::2")
        target = lab.add_pod(n1, "target", "10.200.1.3", ip6="fd00:200:1::3")
        for spoofed in (N2, UNASSIGNED):  # the rogue claims them (root in its netns; a raw socket would do too)
            sh("ip", "-6", "addr", "add", f"{spoofed}/128", "dev", "eth0", "nodad", netns=rogue.netns)
        install_capture(target.path, CaptureMode.TPROXY, inbound=InboundPolicy(InboundMode.STRICT, (PREFIX,)))
        node_guard.install((PREFIX,), n1.path)
        yield rogue, target, n1, n2
    finally:
        lab.close()


def _received(target: Pod, sends: list[tuple[str, str, str]]) -> list[list[str]]:
    sink = subprocess.Popen(
        ["ip", "netns", "exec", target.netns, sys.executable, "-c", SINK, str(PORT)], stdout=subprocess.PIPE, text=True
    )
    assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"
    for netns, src, payload in sends:
        argv = ["ip", "netns", "exec", netns, sys.executable, "-c", SEND, src, str(target.ip6), payload, str(PORT)]
        subprocess.run(argv, check=True, capture_output=True, timeout=30)
    out, _ = sink.communicate(timeout=30)
    got: list[list[str]] = json.loads(out.strip().splitlines()[-1])
    return got


def _guard_drops(node: Node) -> int:
    text = sh("nft", "list", "chain", "inet", node_guard.GUARD_TABLE, node_guard.GUARD_CHAIN, netns=node.netns)
    return sum(int(ln.split("packets")[1].split()[0]) for ln in text.splitlines() if PREFIX.split("/")[0] in ln)


def test_a_pod_cannot_pose_as_an_ipv6_mesh_source(world: tuple[Pod, Pod, Node, Node]) -> None:
    rogue, target, n1, n2 = world
    before = _guard_drops(n1)
    got = _received(target, [(rogue.netns, N2, "spoofed-n2"), (rogue.netns, UNASSIGNED, "spoofed-prefix")])
    assert got == [], f"the target's app got {got}"
    assert _guard_drops(n1) - before == 2
    got = _received(target, [(n2.netns, N2, "genuine")])  # the control: n2 itself, over the node link
    assert got == [[N2, "genuine"]]
