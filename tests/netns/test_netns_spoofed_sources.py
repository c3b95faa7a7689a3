"""STRICT trusts mesh sources by address, so a meshed pod must not be able to send as one (issue 22, item 2), with the
pod network's anti-spoofing off (`rp_filter=0` on every interface of the node and the pods, as the lab's veths).

Real kernel, real nftables, no Envoy: node n1 with pods spoofer (10.200.1.2) and target (10.200.1.3), both with the
CNI plugin's ruleset (tproxy capture, STRICT with mesh sources the gateway 169.254.1.1 and the node prefix
10.250.0.0/16). The spoofer sends, from its own netns with a raw socket (CAP_NET_RAW, which container runtimes grant
by default), a UDP datagram and a TCP SYN whose source is 10.250.1.1 to the target's app ports.

- the spoofed datagram and SYN are dropped in the spoofer's own netns (its `egress_out` chain: a TCP or UDP packet
  leaving on anything but loopback with a source that is not one of its own addresses), counted there, and never
  reach the target (its mesh-source counter does not move);
- the control: the node's real datagram from the gateway still reaches the target, and the spoofer's own unspoofed
  datagram is still dropped by the target's STRICT.

Seen red on main: the spoofed datagram was received by the target's app socket from 10.250.1.1:40000.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from aether.netns.contract import CaptureMode, InboundMode, InboundPolicy
from aether.netns.install import install_capture
from aether.testing.netlab import GATEWAY_LL, Lab, Pod, sh
from aether.testing.spoofing import TCP_PORT, UDP_PORT, counter, raw_send, received

pytestmark = [pytest.mark.privileged]

SPOOFED = "10.250.1.1"
POLICY = InboundPolicy(InboundMode.STRICT, (GATEWAY_LL, "10.250.0.0/16"))


@pytest.fixture(scope="module")
def pods() -> Iterator[tuple[Lab, Pod, Pod]]:
    lab = Lab()
    try:
        node = lab.add_node("n1")
        spoofer = lab.add_pod(node, "spoofer", "10.200.1.2")
        target = lab.add_pod(node, "target", "10.200.1.3")
        for ns in (node.netns, spoofer.netns, target.netns):  # the pod network's anti-spoofing off, everywhere
            for conf in ("all", "default"):
                sh("sysctl", "-qw", f"net.ipv4.conf.{conf}.rp_filter=0", netns=ns)
        for ifname in (spoofer.host_if, target.host_if):
            sh("sysctl", "-qw", f"net.ipv4.conf.{ifname}.rp_filter=0", netns=node.netns)
        for pod in (spoofer, target):
            install_capture(pod.path, CaptureMode.TPROXY, inbound=POLICY)
        yield lab, spoofer, target
    finally:
        lab.close()


def test_a_spoofed_mesh_source_never_leaves_the_pod(pods: tuple[Lab, Pod, Pod]) -> None:
    _, spoofer, target = pods
    before = counter(target, "inbound_in", "10.250.0.0/16")
    got = received(target, [raw_send(spoofer, SPOOFED, target.ip, UDP_PORT, "udp")])
    assert got == [], f"the target's app got {got}"  # red on main: [['10.250.1.1', 'spoofed']]
    subprocess.run(raw_send(spoofer, SPOOFED, target.ip, TCP_PORT, "tcp"), check=True, timeout=30)
    assert counter(target, "inbound_in", "10.250.0.0/16") == before  # neither reached the target's STRICT
    assert counter(spoofer, "egress_out", "udp fib saddr type != local") == 1  # dropped and counted at the source
    assert counter(spoofer, "egress_out", "tcp fib saddr type != local") == 1


def test_the_controls_still_hold(pods: tuple[Lab, Pod, Pod]) -> None:
    _, spoofer, target = pods
    node = target.node
    genuine = ["ip", "netns", "exec", node.netns, sys.executable, "-c"]
    genuine += [f"import socket; socket.socket(2, 2).sendto(b'node', ('{target.ip}', {UDP_PORT}))"]
    own = ["ip", "netns", "exec", spoofer.netns, sys.executable, "-c"]
    own += [f"import socket; socket.socket(2, 2).sendto(b'own', ('{target.ip}', {UDP_PORT}))"]
    got = received(target, [genuine, own])
    assert got == [[GATEWAY_LL, "node"]], got  # the node's datagram in; the pod's own, direct one dropped by STRICT
