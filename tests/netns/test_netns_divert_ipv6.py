"""Mark-and-divert on IPv6, on the real kernel: the pod dials an IPv6 VIP that exists nowhere and a transparent
socket in its netns sees that VIP (IPV6_PKTINFO) and answers from it, for UDP (the Phase-0 rig's cases) and TCP.

The same table `inet aether` marks both families; what IPv6 needs besides is its own policy rule and
`local ::/0 dev lo` route in table 0xae71 (the installer adds both families). No extra address on `lo` is needed
(Istio adds `::6/128` for its own redirect path): the divert delivers to a socket bound to `::`, and `lo` here
holds only `::1/128` throughout. Negative control: the IPv4 half alone (the IPv6 rule deleted) delivers nothing.
"""

from __future__ import annotations

import json
import socket

import pytest

from aether.netns.contract import L4_OUTBOUND_PORT, CaptureMode
from aether.netns.install import install_capture
from aether.netns.nsthread import run_in_netns
from aether.testing.netlab import Lab, Pod, sh
from aether.testing.phase0 import measure, run_rig

pytestmark = pytest.mark.privileged

VIP6 = "fd00:96::a"  # exists nowhere: not in the pod, not on the node
IPV6_TRANSPARENT = 75


@pytest.fixture
def pod(lab: Lab) -> Pod:
    node = lab.add_node("n6")
    return lab.add_pod(node, "p6", "10.200.1.2", ip6="fd00:200:1::2")


def lo_addresses(pod: Pod) -> list[str]:
    links = json.loads(sh("ip", "-j", "-6", "addr", "show", "dev", "lo", netns=pod.netns))
    return [f"{a['local']}/{a['prefixlen']}" for link in links for a in link["addr_info"]]


def test_udp_to_an_ipv6_vip_is_diverted_with_the_vip_kept_and_answered_from_it(pod: Pod) -> None:
    report = run_rig(pod.path, VIP6)
    assert report.c1.delivered_dst == VIP6
    assert report.c1.reply_from == (VIP6, L4_OUTBOUND_PORT)
    assert report.c2.delivered_dst == "::1"  # REDIRECT rewrites the destination on IPv6 too
    assert report.c3.delivered_dst is None and report.c3.reply_from is None
    assert report.main.delivered_dst == VIP6 and report.main.reply_from == (VIP6, L4_OUTBOUND_PORT)
    assert lo_addresses(pod) == ["::1/128"]  # nothing added to lo


def test_without_the_ipv6_rule_nothing_is_diverted(pod: Pod) -> None:
    install_capture(pod.path)
    sh("ip", "-6", "rule", "del", "pref", "100", netns=pod.netns)
    dst, reply, _ino = measure(pod.path, VIP6, L4_OUTBOUND_PORT, read_in_netns=True, wait=0.5)
    assert dst is None and reply is None
    install_capture(pod.path)  # and back: delivered again
    dst, reply, _ino = measure(pod.path, VIP6, L4_OUTBOUND_PORT, read_in_netns=True, wait=2.0)
    assert dst == VIP6 and reply == (VIP6, L4_OUTBOUND_PORT)


def test_tcp_to_an_ipv6_vip_is_accepted_by_a_transparent_listener_on_the_vip(pod: Pod) -> None:
    install_capture(pod.path, CaptureMode.TPROXY)

    def listener() -> socket.socket:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_TRANSPARENT, 1)
        sock.bind(("::", L4_OUTBOUND_PORT))
        sock.listen(4)
        sock.settimeout(5)
        return sock

    def client() -> socket.socket:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.connect((VIP6, L4_OUTBOUND_PORT))
        return sock

    server = run_in_netns(pod.path, listener)
    try:
        cli = run_in_netns(pod.path, client)
        conn, peer = server.accept()
        try:
            assert conn.getsockname()[:2] == (VIP6, L4_OUTBOUND_PORT)  # the original destination, kept
            assert peer[0] == "fd00:200:1::2"
            cli.sendall(b"ping6")
            assert conn.recv(16) == b"ping6"
            conn.sendall(b"pong6")
            assert cli.recv(16) == b"pong6"
            assert cli.getpeername()[:2] == (VIP6, L4_OUTBOUND_PORT)
        finally:
            conn.close()
            cli.close()
    finally:
        server.close()
