"""Transparent UDP sockets that see the pre-divert destination (IP_PKTINFO) and answer from it (ipi_spec_dst).

A diverted datagram keeps its header: `recv_pktinfo` reports the VIP the client dialled in `ipi_addr`. The reply
must leave from that VIP (`send_from(..., spec_dst=VIP)`), which needs IP_TRANSPARENT (without it the kernel refuses
a non-local source with ENETUNREACH, and without spec_dst the reply leaves from the wrong address and the connected
client drops it). Used by the Phase-0 rig and the divert benchmark. An IPv6 `host` (`::`) makes the IPv6 twin:
IPV6_TRANSPARENT, IPV6_RECVPKTINFO (`ipi6_addr` is the destination), and IPV6_PKTINFO on send for the source.
"""

from __future__ import annotations

import socket
import struct
from typing import Final, NamedTuple

SOL_IP: Final = 0
IP_TRANSPARENT: Final = 19
IP_PKTINFO: Final = 8
_PKTINFO = struct.Struct("=i4s4s")  # struct in_pktinfo { int ifindex; in_addr spec_dst; in_addr addr; }
SOL_IPV6: Final = 41
IPV6_RECVPKTINFO: Final = 49
IPV6_PKTINFO: Final = 50
IPV6_TRANSPARENT: Final = 75
_PKTINFO6 = struct.Struct("=16si")  # struct in6_pktinfo { in6_addr addr; int ifindex; }


class Datagram(NamedTuple):
    data: bytes
    source: tuple[str, int]
    dst: str | None  # ipi_addr: the header's destination address as received


def transparent_udp_socket(port: int, host: str = "0.0.0.0", *, transparent: bool = True) -> socket.socket:
    """A UDP socket with IP_PKTINFO (and IP_TRANSPARENT unless told otherwise), bound to host:port.

    It lives in the netns of the calling thread: create it inside `nsthread.run_in_netns` for a pod."""
    v6 = ":" in host
    sock = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if v6:
            sock.setsockopt(SOL_IPV6, socket.IPV6_V6ONLY, 1)
            if transparent:
                sock.setsockopt(SOL_IPV6, IPV6_TRANSPARENT, 1)
            sock.setsockopt(SOL_IPV6, IPV6_RECVPKTINFO, 1)
        else:
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
    data, ancdata, _flags, source = sock.recvmsg(bufsize, socket.CMSG_SPACE(_PKTINFO6.size))
    dst = None
    for level, kind, payload in ancdata:
        if level == SOL_IP and kind == IP_PKTINFO and len(payload) >= _PKTINFO.size:
            _ifindex, _spec, addr = _PKTINFO.unpack_from(payload)
            dst = socket.inet_ntoa(addr)
        elif level == SOL_IPV6 and kind == IPV6_PKTINFO and len(payload) >= _PKTINFO6.size:
            dst = socket.inet_ntop(socket.AF_INET6, _PKTINFO6.unpack_from(payload)[0])
    return Datagram(data, (str(source[0]), int(source[1])), dst)


def send_from(sock: socket.socket, data: bytes, to: tuple[str, int], spec_dst: str | None) -> int:
    """sendmsg to `to`, leaving from `spec_dst` (the VIP) when given."""
    if spec_dst is None:
        return sock.sendto(data, to)
    if ":" in spec_dst:
        info6 = _PKTINFO6.pack(socket.inet_pton(socket.AF_INET6, spec_dst), 0)
        return sock.sendmsg([data], [(SOL_IPV6, IPV6_PKTINFO, info6)], 0, to)
    info = _PKTINFO.pack(0, socket.inet_aton(spec_dst), bytes(4))
    return sock.sendmsg([data], [(SOL_IP, IP_PKTINFO, info)], 0, to)
