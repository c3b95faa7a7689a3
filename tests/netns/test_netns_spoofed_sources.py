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

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from aether.netns.contract import CaptureMode, InboundMode, InboundPolicy
from aether.netns.install import install_capture
from aether.testing.netlab import GATEWAY_LL, Lab, Pod, sh

pytestmark = [pytest.mark.privileged]

SPOOFED = "10.250.1.1"
POLICY = InboundPolicy(InboundMode.STRICT, (GATEWAY_LL, "10.250.0.0/16"))
UDP_PORT, TCP_PORT = 9999, 9998

# Send one UDP datagram (or a TCP SYN) with a chosen source address through a raw socket: argv src dst port kind.
RAW_SEND = r"""
import socket, struct, sys
src, dst, port, kind = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF
s_ip, d_ip = socket.inet_aton(src), socket.inet_aton(dst)
if kind == "udp":
    payload = b"spoofed"
    l4 = struct.pack("!HHHH", 40000, port, 8 + len(payload), 0) + payload
    proto = socket.IPPROTO_UDP
    pseudo = s_ip + d_ip + struct.pack("!BBH", 0, proto, len(l4))
    l4 = l4[:6] + struct.pack("!H", csum(pseudo + l4)) + l4[8:]
else:
    l4 = struct.pack("!HHIIBBHHH", 40001, port, 1, 0, 5 << 4, 0x02, 64240, 0, 0)
    proto = socket.IPPROTO_TCP
    pseudo = s_ip + d_ip + struct.pack("!BBH", 0, proto, len(l4))
    l4 = l4[:16] + struct.pack("!H", csum(pseudo + l4)) + l4[18:]
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(l4), 1, 0, 64, proto, 0, s_ip, d_ip)
ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
r.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
try:
    r.sendto(ip + l4, (dst, 0))
    print("sent")
except OSError as exc:
    print("refused " + type(exc).__name__)
"""

# Wait up to argv[2] seconds for datagrams on UDP port argv[1]; print every (source, payload) as JSON.
UDP_SINK = r"""
import json, socket, sys, time
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
u.settimeout(float(sys.argv[2]))
got = []
try:
    while True:
        data, peer = u.recvfrom(65536)
        got.append([peer[0], data.decode(errors="replace")])
except OSError:
    pass
print(json.dumps(got), flush=True)
"""


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


def received(target: Pod, send: list[list[str]]) -> list[list[str]]:
    """Start a UDP sink in the target, run each `ip netns exec` argv of `send`, return what the sink got."""
    sink = subprocess.Popen(
        ["ip", "netns", "exec", target.netns, sys.executable, "-c", UDP_SINK, str(UDP_PORT), "1.5"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"
    for argv in send:
        subprocess.run(argv, check=True, capture_output=True, timeout=30)
    out, _ = sink.communicate(timeout=30)
    got: list[list[str]] = json.loads(out.strip().splitlines()[-1])
    return got


def raw_send(pod: Pod, src: str, dst: str, port: int, kind: str) -> list[str]:
    return ["ip", "netns", "exec", pod.netns, sys.executable, "-c", RAW_SEND, src, dst, str(port), kind]


def counter(pod: Pod, chain: str, needle: str) -> int:
    """Packets counted by the rules of `chain` whose text contains `needle` (0 when none)."""
    text = sh("nft", "-a", "list", "chain", "inet", "aether", chain, netns=pod.netns, check=False)
    lines = [line for line in text.splitlines() if needle in line and "packets" in line]
    return sum(int(line.split("packets")[1].split()[0]) for line in lines)


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
