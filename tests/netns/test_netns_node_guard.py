"""The node's mesh-source guard (issue 22, item 2): STRICT admits the mesh sources by address, so no pod may send as
one, meshed or not, with the pod network's anti-spoofing off (`rp_filter=0` on every interface of the nodes and the
pods, as the lab's veths).

Real kernel, real nftables, no Envoy: nodes n1 (10.250.1.1) and n2 (10.250.1.2) on one link; on n1 a pod `rogue`
(10.200.1.2) WITHOUT aether's ruleset (not meshed, or its ADD failed: nothing in its own netns stops it) and a meshed
STRICT pod `target` (10.200.1.3, mesh sources the gateway 169.254.1.1 and 10.250.0.0/16). Both nodes carry the guard
(`aether.netns.node_guard`, table `inet aether_guard`). The rogue pod sends, with a raw socket (CAP_NET_RAW, which
container runtimes grant by default), UDP datagrams and a TCP SYN to the target's app ports with sources n2's
address, an unassigned address of the prefix and the gateway:

- n1's guard drops each where it enters (the route back to the source does not leave through the rogue's veth),
  counts it per mesh source, and the target's app receives nothing (its mesh-source counter does not move);
- the controls: n2's genuine datagram (its proxy's path across nodes) and n1's own (its proxy's path from the
  gateway) still reach the target; the rogue's own, unspoofed datagram is still dropped by the target's STRICT.

Seen red without the guard (the fixture's install left out): the target's app got [['10.250.1.2', 'spoofed'],
['10.250.9.9', 'spoofed']] (the gateway's spoof the kernel already drops: a source that is a local address of n1).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from aether.netns import node_guard
from aether.netns.contract import CaptureMode, InboundMode, InboundPolicy
from aether.netns.install import install_capture
from aether.testing.netlab import GATEWAY_LL, Lab, Node, Pod, sh
from aether.testing.spoofing import TCP_PORT, UDP_PORT, counter, raw_send, received

pytestmark = [pytest.mark.privileged]

SOURCES = (GATEWAY_LL, "10.250.0.0/16")
POLICY = InboundPolicy(InboundMode.STRICT, SOURCES)
N1, N2 = "10.250.1.1", "10.250.1.2"


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Lab, Pod, Pod, Node]]:
    lab = Lab()
    try:
        n1, n2 = lab.add_node("n1"), lab.add_node("n2")
        lab.link_nodes(n1, n2, N1, N2)
        rogue = lab.add_pod(n1, "rogue", "10.200.1.2")
        target = lab.add_pod(n1, "target", "10.200.1.3")
        for ns in (n1.netns, n2.netns, rogue.netns, target.netns):  # the pod network's anti-spoofing off
            for conf in ("all", "default", "eth0"):
                sh("sysctl", "-qw", f"net.ipv4.conf.{conf}.rp_filter=0", netns=ns, check=conf != "eth0")
        for ifname in (rogue.host_if, target.host_if):
            sh("sysctl", "-qw", f"net.ipv4.conf.{ifname}.rp_filter=0", netns=n1.netns)
        install_capture(target.path, CaptureMode.TPROXY, inbound=POLICY)  # the rogue has no aether ruleset
        for node in (n1, n2):
            node_guard.install(SOURCES, node.path)
        yield lab, rogue, target, n2
    finally:
        lab.close()


def guard_counter(node: Node, needle: str) -> int:
    text = sh("nft", "list", "chain", "inet", node_guard.GUARD_TABLE, node_guard.GUARD_CHAIN, netns=node.netns)
    lines = [ln for ln in text.splitlines() if needle in ln and "packets" in ln]
    return sum(int(ln.split("packets")[1].split()[0]) for ln in lines)


def test_a_pod_cannot_pose_as_a_mesh_source_even_without_aethers_ruleset(world: tuple[Lab, Pod, Pod, Node]) -> None:
    _, rogue, target, _ = world
    n1 = target.node
    before = counter(target, "inbound_in", "10.250.0.0/16") + counter(target, "inbound_in", GATEWAY_LL)
    sends = [raw_send(rogue, src, target.ip, UDP_PORT, "udp") for src in (N2, "10.250.9.9", GATEWAY_LL)]
    got = received(target, sends)
    assert got == [], f"the target's app got {got}"  # red without the guard: [['10.250.1.2', 'spoofed']]
    subprocess.run(raw_send(rogue, N2, target.ip, TCP_PORT, "tcp"), check=True, timeout=30)
    after = counter(target, "inbound_in", "10.250.0.0/16") + counter(target, "inbound_in", GATEWAY_LL)
    assert after == before  # nothing reached the target's STRICT as a mesh source
    assert guard_counter(n1, "10.250.0.0/16") == 3  # two datagrams and the SYN, dropped where they entered
    assert guard_counter(n1, GATEWAY_LL) == 1


def test_the_proxies_paths_still_pass(world: tuple[Lab, Pod, Pod, Node]) -> None:
    _, rogue, target, n2 = world
    n1 = target.node
    seen = guard_counter(n1, "10.250.0.0/16") + guard_counter(n1, GATEWAY_LL)

    def sender(netns: str, payload: str) -> list[str]:
        code = f"import socket; socket.socket(2, 2).sendto(b'{payload}', ('{target.ip}', {UDP_PORT}))"
        return ["ip", "netns", "exec", netns, sys.executable, "-c", code]

    got = received(target, [sender(n2.netns, "n2"), sender(n1.netns, "n1"), sender(rogue.netns, "own")])
    assert sorted(got) == sorted([[N2, "n2"], [GATEWAY_LL, "n1"]]), got  # the rogue's own: STRICT drops it
    assert guard_counter(n1, "10.250.0.0/16") + guard_counter(n1, GATEWAY_LL) == seen


def test_install_is_idempotent_and_check_names_the_drift(world: tuple[Lab, Pod, Pod, Node]) -> None:
    _, _, target, n2 = world
    n1 = target.node
    kept = guard_counter(n1, "10.250.0.0/16")
    node_guard.install(SOURCES, n1.path)  # already exact: nothing replaced, the counters kept
    assert guard_counter(n1, "10.250.0.0/16") == kept
    assert node_guard.check(SOURCES, n1.path) == []
    assert node_guard.check(("10.251.0.0/16",), n1.path) != []
    node_guard.remove(n2.path)
    assert node_guard.check(SOURCES, n2.path) == [f"missing nft table inet {node_guard.GUARD_TABLE}"]
    node_guard.install(SOURCES, n2.path)


def test_the_rules_and_their_refusals() -> None:
    rules = node_guard.rules(("10.250.7.9/16", "169.254.1.1", "10.250.0.0/16", "fd00::/8"))
    assert [r[0]["match"]["right"] for r in rules] == [
        {"prefix": {"addr": "10.250.0.0", "len": 16}},  # host bits cleared, the duplicate dropped
        "169.254.1.1",
        {"prefix": {"addr": "fd00::", "len": 8}},
    ]
    for r in rules:
        assert r[1:] == [
            {"match": {"op": "==", "left": {"fib": {"result": "oif", "flags": ["saddr", "iif"]}}, "right": False}},
            {"counter": {"packets": 0, "bytes": 0}},
            {"drop": None},
        ]
    for bad in [(), ("10.250.0.0/40",), ("nodes",)]:
        with pytest.raises(node_guard.NodeGuardError):
            node_guard.rules(bad)
