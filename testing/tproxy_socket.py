"""Transparent UDP sockets that see the pre-divert destination (IP_PKTINFO) and answer from it (ipi_spec_dst).

A diverted datagram keeps its header: `recv_pktinfo` reports the VIP the client dialled in `ipi_addr`. The reply
must leave from that VIP (`send_from(..., spec_dst=VIP)`), which needs IP_TRANSPARENT (without it the kernel refuses
a non-local source with ENETUNREACH, and without spec_dst the reply leaves from the wrong address and the connected
client drops it). Used by the Phase-0 rig and the divert benchmark.
"""

from __future__ import annotations

import socket
import struct
from typing import Final, NamedTuple

SOL_IP: Final = 0
IP_TRANSPARENT: Final = 19
IP_PKTINFO: Final = 8
_PKTINFO = struct.Struct("=i4s4s")  # struct in_pktinfo { int ifindex; in_addr spec_dst; in_addr addr; }


class Datagram(NamedTuple):
    data: bytes
    source: tuple[str, int]
    dst: str | None  # ipi_addr: the header's destination address as received


def transparent_udp_socket(port: int, host: str = "0.0.0.0", *, transparent: bool = True) -> socket.socket:
    """A UDP socket with IP_PKTINFO (and IP_TRANSPARENT unless told otherwise), bound to host:port.

    It lives in the netns of the calling thread: create it inside `nsthread.run_in_netns` for a pod."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if transparent:
            sock.setsockopt(SOL_IP, IP_TRANSPARENT, 1)
        sock.setsockopt(SOL_IP, IP_PKTINFO, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def recv_pktinfo(sock: socket.socket, bufsize: int = 65535) -> Datagram:
    """One datagram and the destination address its header carried (honours the socket's timeout)."""
    data, ancdata, _flags, source = sock.recvmsg(bufsize, socket.CMSG_SPACE(_PKTINFO.size))
    dst = None
    for level, kind, payload in ancdata:
        if level == SOL_IP and kind == IP_PKTINFO and len(payload) >= _PKTINFO.size:
            _ifindex, _spec, addr = _PKTINFO.unpack_from(payload)
            dst = socket.inet_ntoa(addr)
    return Datagram(data, (str(source[0]), int(source[1])), dst)


def send_from(sock: socket.socket, data: bytes, to: tuple[str, int], spec_dst: str | None) -> int:
    """sendmsg to `to`, leaving from `spec_dst` (the VIP) when given."""
    if spec_dst is None:
        return sock.sendto(data, to)
    info = _PKTINFO.pack(0, socket.inet_aton(spec_dst), bytes(4))
    return sock.sendmsg([data], [(SOL_IP, IP_PKTINFO, info)], 0, to)
