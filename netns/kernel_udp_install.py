"""Program the in-kernel UDP data path (`aether.netns.kernel_udp`) into a pod's netns, and forget the flows of
backends that left.

The effects go through `KernelUdpEffects` (run an nft command given as JSON; delete the conntrack entries of the flows
from a VIP to a backend; read the netns's nft generation), opened on a thread inside the netns like the capture's
(`aether.netns.install`): `KernelUdpKernel` is the real one (libnftables, fed nft text for changes; ctnetlink and
nfnetlink through pyroute2), and `aether.testing.kernel_udp_effects` models the tables and records the calls, so the
order is tested without privileges.

`apply_kernel_udp` first makes sure what the netns holds: with a `Verified` record whose nft generation has not moved
since our last transaction there, it knows; otherwise it reads the tables back. When they are exactly what
`previous` builds, it sends only
the difference (`aether.netns.kernel_udp_diff.update_commands`: the changed Services' chains, elements and objects;
nothing when nothing changed); otherwise (first programming, a restarted sidecar, a table someone changed) it
replaces both tables whole and reads them back. Either way it is one nft transaction, all or nothing: when nft
refuses it, the tables the netns held before stay as they were. Then, for every backend endpoint that left an arm
(gone from it, or its backendRef now invalid), the conntrack entries of the flows VIP:18082 -> that endpoint are
deleted, the way kube-proxy clears a removed UDP endpoint's entries: the flow's next datagram is a new flow and picks
again. A backend whose weight went to 0 (drain) keeps its flows: they finish, as on the Envoy path.

`read_kernel_udp_counters` lists the tables' named counters (`aether.netns.kernel_udp.parse_counters`).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from pyroute2.netlink.exceptions import NetlinkError

from aether.netns import install, kernel_udp, kernel_udp_diff, kernel_udp_text
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.netns.kernel_udp import FAMILIES, KERNEL_UDP_TABLE, Family, Json, KernelArm, KernelUdpCounter
from aether.netns.libnft import Nft, NftError, NftResult
from aether.netns.nsthread import NetnsError, call_in_netns

log = logging.getLogger(__name__)
T = TypeVar("T")


class KernelUdpError(RuntimeError):
    """The kernel UDP rules could not be programmed as asked (the netns keeps what it had)."""


class KernelUdpEffects(Protocol):
    def nft(self, command: dict[str, Any]) -> NftResult: ...

    def forget_flows(self, vip: str, vip_port: int, backend_ip: str, backend_port: int) -> int:
        """Delete the UDP conntrack entries whose original destination is vip:vip_port and whose reply comes from
        backend_ip:backend_port (IPv4 or IPv6); return how many."""
        ...

    def generation(self) -> int:
        """The netns's nft ruleset generation (NFT_MSG_GETGEN)."""
        ...

    def close(self) -> None: ...


class KernelUdpKernel:
    """The real effects, opened on a thread inside the target netns."""

    def __init__(self) -> None:
        self._nft = Nft()

    def nft(self, command: dict[str, Any]) -> NftResult:
        """A listing goes as JSON; a change as nft text (`aether.netns.kernel_udp_text`: why)."""
        if any("list" in item for item in command["nftables"]):
            return self._nft.run(command)
        return self._nft.run(kernel_udp_text.to_text(command))

    def forget_flows(self, vip: str, vip_port: int, backend_ip: str, backend_port: int) -> int:
        """IPv4: one filtered flush (a CTA_FILTER'd delete, kernel >= 6.3) deletes every match in the kernel, and the
        netns's `nf_conntrack_count` before and after says how many (flows made or ended meanwhile move it too).
        Measured here: 3.8 ms for 97 flows, where one delete per entry took 285 ms for 88, and merely listing the
        matches through pyroute2 415 ms for 109 (the worker waits on it). IPv6: the kernel's filter matched none of
        the entries that match (kernel 6.18, pyroute2 0.9.7; dump and flush alike), so the IPv6 table is dumped
        whole, filtered here and deleted entry by entry."""
        from pyroute2 import Conntrack
        from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

        udp = socket.IPPROTO_UDP
        v6 = ":" in vip
        family = socket.AF_INET6 if v6 else socket.AF_INET
        orig = NFCTAttrTuple(family=family, proto=udp, daddr=vip, dport=vip_port)
        reply = NFCTAttrTuple(family=family, proto=udp, saddr=backend_ip, sport=backend_port)
        ct = Conntrack(nfgen_family=family)
        try:
            if not v6:
                before = _conntrack_count()
                orig.attrs(), reply.attrs()  # they set the filter's flags
                flags = [["CTA_FILTER_ORIG_FLAGS", orig.flags], ["CTA_FILTER_REPLY_FLAGS", reply.flags]]
                ct.entry("del", tuple_orig=orig, tuple_reply=reply, cta_filter={"attrs": flags})
                return max(0, before - _conntrack_count())
            entries = [e for e in ct.dump_entries() if _same_flow(e, orig, reply)]
            for entry in entries:
                ct.delete(entry)
            return len(entries)
        finally:
            ct.close()

    def generation(self) -> int:
        from pyroute2.netlink import NLM_F_REQUEST
        from pyroute2.netlink.nfnetlink.nftsocket import NFT_MSG_GETGEN, NFTSocket, nft_gen_msg

        sock = NFTSocket(nfgen_family=0)
        try:
            reply = sock.request_get(nft_gen_msg(), NFT_MSG_GETGEN, msg_flags=NLM_F_REQUEST)
            return int(reply[0].get_attr("NFTA_GEN_ID"))
        finally:
            sock.close()

    def close(self) -> None:
        self._nft.close()


def _conntrack_count() -> int:
    """The calling thread's netns's conntrack entries (/proc/sys/net is the opener's netns)."""
    with open("/proc/sys/net/netfilter/nf_conntrack_count") as fh:
        return int(fh.read())


def _same_flow(entry: Any, orig: Any, reply: Any) -> bool:
    o, r = entry.tuple_orig, entry.tuple_reply
    return (
        o.proto == orig.proto
        and ipaddress.ip_address(o.daddr) == ipaddress.ip_address(orig.daddr)
        and o.dport == orig.dport
        and ipaddress.ip_address(r.saddr) == ipaddress.ip_address(reply.saddr)
        and r.sport == reply.sport
    )


def departed(old: Sequence[KernelArm], new: Sequence[KernelArm]) -> list[tuple[str, str, int]]:
    """(VIP, backend ip, backend port) of every valid backend of `old` that `new` no longer has as a valid backend
    of the same VIP (sorted: the order flows are forgotten in)."""
    return list(kernel_udp_diff.plan(old, new).departed)


def _list(fx: KernelUdpEffects, family: Family, what: str = "table") -> Json | None:
    """`nft -j list <what> <family> aether_udp`, or None when the table is not there."""
    key = "table" if what == "counters" else "name"
    ref = {"family": family, key: KERNEL_UDP_TABLE}
    res = fx.nft({"nftables": [{"list": {what: ref}}]})
    if res.rc != 0:
        return None
    listed: Json = json.loads(res.output)  # the C parser: litejson's pure Python took 75 ms a table at 1,000 Services
    return listed


def _listed_equals(fx: KernelUdpEffects, wanted: dict[Family, Json]) -> bool:
    for family in FAMILIES:
        listed = _list(fx, family)
        if listed is None or kernel_udp_diff.canonical(listed, family) != wanted[family]:
            return False
    return True


def _send(fx: KernelUdpEffects, where: str, command: Json) -> None:
    res = fx.nft(command)
    if res.rc != 0:
        raise KernelUdpError(
            f"nft refused the kernel UDP rules for {where} (the previous rules stay): {res.error.strip()}"
        )


class Verified:
    """What each netns was last seen to hold, and the nft generation (the netns's ruleset generation counter, which
    every committed nft transaction in it, of any table, moves by one) right after: when the generation has not
    moved since, nothing has changed the tables, and the read-back can be skipped. Only a generation that moved by
    exactly our own transaction is kept (another commit in between: forgotten, the next apply reads back)."""

    def __init__(self, cap: int = 4096) -> None:
        self._seen: dict[str, tuple[tuple[tuple[KernelArm, ...], float | None], int]] = {}
        self._cap = cap

    def holds(self, where: str, arms: Sequence[KernelArm], default: float | None, generation: int) -> bool:
        return self._seen.get(where) == ((tuple(arms), default), generation)

    def note(self, where: str, arms: Sequence[KernelArm], default: float | None, generation: int | None) -> None:
        self._seen.pop(where, None)
        if generation is not None:
            if len(self._seen) >= self._cap:
                del self._seen[next(iter(self._seen))]
            self._seen[where] = ((tuple(arms), default), generation)


VERIFIED = Verified()  # the process's record for program_kernel_udp (its callers hold install._LOCK)


def apply_kernel_udp(
    fx: KernelUdpEffects,
    where: str,
    arms: Sequence[KernelArm],
    previous: Sequence[KernelArm] = (),
    *,
    default_idle_timeout_s: float | None = None,
    verified: Verified | None = None,
) -> int:
    """Make tables `ip|ip6 aether_udp` in `fx`'s netns exactly what `arms` build (incrementally when they hold what
    `previous` builds: known from `verified` at an unchanged nft generation, else read back), then forget the flows
    of the backends that left since `previous`; return how many conntrack entries were deleted."""
    default = default_idle_timeout_s
    plan = kernel_udp_diff.plan(previous, arms, default_idle_timeout_s=default)
    before = fx.generation() if verified is not None else 0
    sent = 0
    if (verified is not None and verified.holds(where, previous, default, before)) or _listed_equals(fx, plan.previous):
        if plan.update["nftables"]:
            _send(fx, where, plan.update)
            sent = 1
    else:
        log.info("kernel UDP rules in %s are not what the previous arms build: replacing them whole", where)
        _send(fx, where, kernel_udp_diff.replace_commands(plan.wanted))
        sent = 1
        if not _listed_equals(fx, plan.wanted):
            raise KernelUdpError(f"the kernel UDP rules loaded in {where} differ from what was asked")
    if verified is not None:
        after = fx.generation()
        verified.note(where, arms, default, after if after == before + sent else None)
    try:
        return sum(fx.forget_flows(vip, L4_OUTBOUND_PORT, ip, port) for vip, ip, port in plan.departed)
    except (OSError, NetlinkError) as exc:
        # pyroute2's NetlinkError is no OSError: uncaught, the caller's record of what the netns holds stayed at the
        # old arms with no failure noted, so nothing retried and the departed backends' flows lived on
        raise KernelUdpError(
            f"the rules loaded in {where}, but forgetting departed backends' flows failed: {exc}"
        ) from exc


def counters(fx: KernelUdpEffects) -> list[KernelUdpCounter]:
    """Every named counter of both tables (a missing table has none)."""
    out: list[KernelUdpCounter] = []
    for family in FAMILIES:
        listed = _list(fx, family, "counters")
        out += kernel_udp.parse_counters(listed or {})
    return sorted(out, key=lambda c: (c.vip, c.backend_ip or "", c.backend_port or 0))


def _in_netns(path: str, open_effects: Callable[[], KernelUdpEffects], fn: Callable[[KernelUdpEffects], T]) -> T:
    def run() -> T:
        fx = open_effects()
        try:
            return fn(fx)
        finally:
            fx.close()

    try:
        with install._LOCK:  # libnftables keeps process-global state: one nft user at a time, as the capture's
            return call_in_netns(path, run)
    except NetnsError as exc:
        raise KernelUdpError(exc.strerror or str(exc)) from exc
    except (OSError, NftError, NetlinkError) as exc:
        raise KernelUdpError(f"programming the kernel UDP rules in {path} failed: {exc}") from exc


def program_kernel_udp(
    netns_path: str | os.PathLike[str],
    arms: Sequence[KernelArm],
    *,
    previous: Sequence[KernelArm] = (),
    default_idle_timeout_s: float | None = None,
    effects: Callable[[], KernelUdpEffects] = KernelUdpKernel,
) -> int:
    """`apply_kernel_udp` on a thread inside the netns at `netns_path`, with the process's `VERIFIED` record (keyed
    by the path and the netns's inode: a netns made again at the same path is another)."""
    path = os.fspath(netns_path)

    def apply(fx: KernelUdpEffects) -> int:
        where = _identity(path)
        return apply_kernel_udp(
            fx, where, arms, previous, default_idle_timeout_s=default_idle_timeout_s, verified=VERIFIED
        )

    return _in_netns(path, effects, apply)


def _identity(path: str) -> str:
    st = os.stat(path)
    return f"{path}@{st.st_dev}:{st.st_ino}"


def read_kernel_udp_counters(
    netns_path: str | os.PathLike[str], *, effects: Callable[[], KernelUdpEffects] = KernelUdpKernel
) -> list[KernelUdpCounter]:
    """The kernel path's named counters in the netns at `netns_path` (none when it holds no tables)."""
    return _in_netns(os.fspath(netns_path), effects, counters)


def remove_kernel_udp(
    netns_path: str | os.PathLike[str], *, effects: Callable[[], KernelUdpEffects] = KernelUdpKernel
) -> None:
    """Delete tables `ip|ip6 aether_udp` (idempotent)."""
    path = os.fspath(netns_path)

    def remove(fx: KernelUdpEffects) -> int:
        VERIFIED.note(_identity(path), (), None, None)
        res = fx.nft(kernel_udp.delete_commands())
        if res.rc != 0:
            raise KernelUdpError(f"removing the kernel UDP rules from {path} failed: {res.error.strip()}")
        return 0

    _in_netns(path, effects, remove)
