"""A packet capture without tcpdump: an AF_PACKET socket in a netns (root) writing every frame it sees on any
interface of that netns, hex, one line per frame, until stopped. Tests read the frames back to say what crossed the
wire (e.g. that a gateway's links carried only TLS records, no plaintext marker).

    with capture(lab, netns, workdir / "b.frames") as frames:
        ...traffic...
    assert marker not in b"".join(frames())
"""

from __future__ import annotations

import contextlib
import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from aether.testing.netlab import Lab

CAPTURE = r"""
import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))  # ETH_P_ALL
out = open(sys.argv[1], "w")
print("ready", flush=True)
while True:
    frame, addr = s.recvfrom(65535)
    if addr[2] == socket.PACKET_OUTGOING and addr[0] == "lo":
        continue  # loopback shows each packet twice; keep the incoming copy
    out.write(frame.hex() + "\n")
    out.flush()
"""


@contextlib.contextmanager
def capture(lab: Lab, netns: str, path: Path) -> Iterator[Callable[[], list[bytes]]]:
    """Capture in `netns` while the block runs; yields a reader of the frames captured so far."""
    path.touch()
    proc = lab.spawn(netns, [sys.executable, "-c", CAPTURE, str(path)], stdout=-1)
    assert proc.stdout is not None
    if b"ready" not in proc.stdout.readline():
        raise RuntimeError(f"capture in {netns} did not start")

    def frames() -> list[bytes]:
        return [bytes.fromhex(line) for line in path.read_text().splitlines() if line]

    try:
        yield frames
    finally:
        lab.stop(proc)


def tcp_payloads(frames: list[bytes], port: int) -> list[bytes]:
    """The TCP payloads of IPv4 frames (Ethernet or loopback, both with a 14-byte header here) to or from `port`."""
    return _payloads(frames, port, 6)


def udp_payloads(frames: list[bytes], port: int, *, to_port: bool = False) -> list[bytes]:
    """The UDP payloads of IPv4 frames to or from `port` (only to it with `to_port`)."""
    return _payloads(frames, port, 17, to_port=to_port)


def _payloads(frames: list[bytes], port: int, protocol: int, *, to_port: bool = False) -> list[bytes]:
    out = []
    for f in frames:
        if len(f) < 34 or f[12:14] != b"\x08\x00" or f[23] != protocol:  # IPv4, TCP (6) or UDP (17)
            continue
        ihl = (f[14] & 0x0F) * 4
        segment = f[14 + ihl :]
        if len(segment) < (20 if protocol == 6 else 8):
            continue
        sport, dport = struct.unpack("!HH", segment[:4])
        payload = segment[(segment[12] >> 4) * 4 :] if protocol == 6 else segment[8:]
        if (dport == port if to_port else port in (sport, dport)) and payload:
            out.append(payload)
    return out
