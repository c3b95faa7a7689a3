"""Spoofed sources from inside a pod's netns, and what a pod's app received: raw-socket UDP datagrams and TCP SYNs with
a chosen source address (CAP_NET_RAW, which container runtimes grant by default), a UDP sink in a pod, and the
packets counted by an nftables chain's rules (tests/netns/test_netns_spoofed_sources.py, test_netns_node_guard.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from aether.testing.netlab import Pod, sh

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


def counter(pod: Pod, chain: str, needle: str, table: str = "aether") -> int:
    """Packets counted by the rules of `chain` (in table inet `table` of the pod's netns) whose text contains
    `needle` (0 when none)."""
    text = sh("nft", "-a", "list", "chain", "inet", table, chain, netns=pod.netns, check=False)
    lines = [line for line in text.splitlines() if needle in line and "packets" in line]
    return sum(int(line.split("packets")[1].split()[0]) for line in lines)
