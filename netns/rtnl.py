"""The two routing objects of the divert, over rtnetlink, with nothing but the standard library.

`ip rule add pref 100 fwmark 0xae71 lookup <table>` and `ip route add local default dev lo table <table>`, for IPv4
and (with `family=AF_INET6`) IPv6; `rules(AF_UNSPEC)` and `routes(table, AF_UNSPEC)` dump both families.
pyroute2 would do this too, but importing it costs ~250 ms and each `IPRoute(netns=...)` forks a child; the CNI
plugin's whole budget is 50 ms. The message encoders and decoders are pure (unit-tested against the kernel's
answers in the integration tests, and cross-checked with pyroute2 there); `RtnlSocket` is the thin shell. Open the
socket on a thread inside the target netns (`nsthread.run_in_netns`): it stays bound to that netns.
"""

from __future__ import annotations

# `_socket`, not `socket`: the wrapper module costs ~6 ms to import (selectors, enum conversion of every
# constant), a tenth of the CNI plugin's budget, and a raw netlink socket needs nothing from it.
import _socket
import errno
import os
import struct

TYPE_CHECKING = False  # on the CNI plugin's start-up path: see aether.netns.lite
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Final
    from typing import NamedTuple as Record
else:
    from aether.netns.lite import Record

NETLINK_ROUTE: Final = 0
NLMSG_ERROR: Final = 2
NLMSG_DONE: Final = 3
RTM_NEWROUTE: Final = 24
RTM_DELROUTE: Final = 25
RTM_GETROUTE: Final = 26
RTM_NEWRULE: Final = 32
RTM_DELRULE: Final = 33
RTM_GETRULE: Final = 34

NLM_F_REQUEST: Final = 0x1
NLM_F_ACK: Final = 0x4
NLM_F_DUMP: Final = 0x300
NLM_F_REPLACE: Final = 0x100
NLM_F_EXCL: Final = 0x200
NLM_F_CREATE: Final = 0x400

AF_UNSPEC: Final = 0  # a dump of every family
AF_INET6: Final = 10
RT_TABLE_UNSPEC: Final = 0
RTPROT_BOOT: Final = 3
RT_SCOPE_UNIVERSE: Final = 0
RT_SCOPE_HOST: Final = 254
RTN_LOCAL: Final = 2
FR_ACT_TO_TBL: Final = 1

RTA_OIF: Final = 4
RTA_TABLE: Final = 15
FRA_PRIORITY: Final = 6
FRA_FWMARK: Final = 10
FRA_TABLE: Final = 15
FRA_FWMASK: Final = 16

_NLMSGHDR = struct.Struct("=IHHII")
_RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg and fib_rule_hdr share this layout
_RTATTR = struct.Struct("=HH")


class Rule(Record):
    priority: int
    fwmark: int
    fwmask: int
    table: int
    action: int = FR_ACT_TO_TBL
    family: int = _socket.AF_INET


class Route(Record):
    table: int
    type: int
    scope: int
    oif: int
    dst_len: int
    family: int = _socket.AF_INET


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attr_u32(kind: int, value: int) -> bytes:
    return _RTATTR.pack(8, kind) + struct.pack("=I", value)


def encode(msg_type: int, flags: int, seq: int, body: bytes) -> bytes:
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), msg_type, flags, seq, 0) + body


def rule_body(rule: Rule) -> bytes:
    small_table = rule.table if rule.table < 256 else RT_TABLE_UNSPEC
    hdr = _RTMSG.pack(rule.family, 0, 0, 0, small_table, 0, 0, rule.action, 0)
    attrs = _attr_u32(FRA_PRIORITY, rule.priority) + _attr_u32(FRA_FWMARK, rule.fwmark)
    attrs += _attr_u32(FRA_FWMASK, rule.fwmask) + _attr_u32(FRA_TABLE, rule.table)
    return hdr + attrs


def route_body(route: Route) -> bytes:
    small_table = route.table if route.table < 256 else RT_TABLE_UNSPEC
    hdr = _RTMSG.pack(route.family, route.dst_len, 0, 0, small_table, RTPROT_BOOT, route.scope, route.type, 0)
    return hdr + _attr_u32(RTA_TABLE, route.table) + _attr_u32(RTA_OIF, route.oif)


def _attrs(data: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    off = 0
    while off + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, off)
        if length < _RTATTR.size:
            break
        out[kind & 0x3FFF] = data[off + _RTATTR.size : off + length]
        off += _align(length)
    return out


def _u32(attrs: dict[int, bytes], kind: int, default: int) -> int:
    raw = attrs.get(kind)
    return int(struct.unpack("=I", raw[:4])[0]) if raw and len(raw) >= 4 else default


def decode_rule(body: bytes) -> Rule:
    family, _dl, _sl, _tos, table, _r1, _r2, action, _fl = _RTMSG.unpack_from(body)
    a = _attrs(body[_RTMSG.size :])
    return Rule(
        priority=_u32(a, FRA_PRIORITY, 0),
        fwmark=_u32(a, FRA_FWMARK, 0),
        fwmask=_u32(a, FRA_FWMASK, 0),
        table=_u32(a, FRA_TABLE, table),
        action=action,
        family=family,
    )


def decode_route(body: bytes) -> Route:
    family, dst_len, _sl, _tos, table, _proto, scope, rtype, _fl = _RTMSG.unpack_from(body)
    a = _attrs(body[_RTMSG.size :])
    return Route(
        table=_u32(a, RTA_TABLE, table),
        type=rtype,
        scope=scope,
        oif=_u32(a, RTA_OIF, 0),
        dst_len=dst_len,
        family=family,
    )


def split(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(type, seq, body) of each netlink message in a datagram."""
    off = 0
    while off + _NLMSGHDR.size <= len(data):
        length, mtype, _flags, seq, _pid = _NLMSGHDR.unpack_from(data, off)
        if length < _NLMSGHDR.size:
            break
        yield mtype, seq, data[off + _NLMSGHDR.size : off + length]
        off += _align(length)


class RtnlSocket:
    """A NETLINK_ROUTE socket in the netns of the thread that opened it."""

    def __init__(self) -> None:
        self._sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW, NETLINK_ROUTE)
        self._sock.bind((0, 0))
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> RtnlSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, msg_type: int, flags: int, body: bytes) -> list[tuple[int, bytes]]:
        self._seq += 1
        seq = self._seq
        self._sock.send(encode(msg_type, NLM_F_REQUEST | flags, seq, body))
        out: list[tuple[int, bytes]] = []
        while True:
            data = self._sock.recv(65536)
            for mtype, mseq, mbody in split(data):
                if mseq != seq:
                    continue
                if mtype == NLMSG_DONE:
                    return out
                if mtype == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", mbody)[0]
                    if code:
                        raise OSError(code, os.strerror(code))
                    return out  # an ACK
                out.append((mtype, mbody))

    def rules(self, family: int = _socket.AF_INET) -> list[Rule]:
        body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
        return [decode_rule(b) for t, b in self._request(RTM_GETRULE, NLM_F_DUMP, body) if t == RTM_NEWRULE]

    def routes(self, table: int, family: int = _socket.AF_INET) -> list[Route]:
        body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
        got = [decode_route(b) for t, b in self._request(RTM_GETROUTE, NLM_F_DUMP, body) if t == RTM_NEWROUTE]
        return [r for r in got if r.table == table]

    def add_rule(self, rule: Rule) -> bool:
        """Add the rule; False when an identical one is already there (the kernel refuses a duplicate)."""
        try:
            self._request(RTM_NEWRULE, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, rule_body(rule))
        except FileExistsError:
            return False
        return True

    def delete_rule(self, rule: Rule) -> int:
        """Delete every copy of the rule; returns how many went."""
        n = 0
        while True:
            try:
                self._request(RTM_DELRULE, NLM_F_ACK, rule_body(rule))
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ESRCH):
                    return n
                raise
            n += 1

    def replace_route(self, route: Route) -> None:
        self._request(RTM_NEWROUTE, NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE, route_body(route))

    def delete_route(self, route: Route) -> bool:
        try:
            self._request(RTM_DELROUTE, NLM_F_ACK, route_body(route))
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ESRCH):
                return False
            raise
        return True
