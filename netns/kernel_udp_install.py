"""Program the in-kernel UDP data path (`aether.netns.kernel_udp`) into a pod's netns, and forget the flows of
backends that left.

The effects go through `KernelUdpEffects` (run a libnftables JSON command; delete the conntrack entries of the flows
from a VIP to a backend), opened on a thread inside the netns like the capture's (`aether.netns.install`):
`KernelUdpKernel` is the real one (libnftables, and ctnetlink through pyroute2), and `aether.testing.kernel_udp_effects`
records the calls, so the order is tested without privileges.

`apply_kernel_udp` loads the whole table in one nft transaction (all or nothing: when nft refuses it, the table the
netns held before stays as it was) and reads back what loaded. Then, for every backend endpoint that left an arm
(gone from it, or its backendRef now invalid), the conntrack entries of the flows VIP:18082 -> that endpoint are
deleted, the way kube-proxy clears a removed UDP endpoint's entries: the flow's next datagram is a new flow and picks
again. A backend whose weight went to 0 (drain) keeps its flows: they finish, as on the Envoy path.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from aether.netns import install, kernel_udp
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.netns.kernel_udp import KernelArm
from aether.netns.libnft import Nft, NftError, NftResult
from aether.netns.nsthread import NetnsError, call_in_netns


class KernelUdpError(RuntimeError):
    """The kernel UDP rules could not be programmed as asked (the netns keeps what it had)."""


class KernelUdpEffects(Protocol):
    def nft(self, command: dict[str, Any]) -> NftResult: ...

    def forget_flows(self, vip: str, vip_port: int, backend_ip: str, backend_port: int) -> int:
        """Delete the UDP conntrack entries whose original destination is vip:vip_port and whose reply comes from
        backend_ip:backend_port; return how many."""
        ...

    def close(self) -> None: ...


class KernelUdpKernel:
    """The real effects, opened on a thread inside the target netns."""

    def __init__(self) -> None:
        self._nft = Nft()

    def nft(self, command: dict[str, Any]) -> NftResult:
        return self._nft.run(command)

    def forget_flows(self, vip: str, vip_port: int, backend_ip: str, backend_port: int) -> int:
        from pyroute2 import Conntrack
        from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

        udp = socket.IPPROTO_UDP
        orig = NFCTAttrTuple(proto=udp, daddr=vip, dport=vip_port)
        reply = NFCTAttrTuple(proto=udp, saddr=backend_ip, sport=backend_port)
        ct = Conntrack()
        try:
            entries = list(ct.dump_entries(tuple_orig=orig, tuple_reply=reply))
            for entry in entries:
                ct.delete(entry)
        finally:
            ct.close()
        return len(entries)

    def close(self) -> None:
        self._nft.close()


def _endpoints(arms: Sequence[KernelArm]) -> dict[str, set[tuple[str, int]]]:
    """VIP -> its valid backends' (ip, port), weight 0 included (a drained backend's flows finish)."""
    return {a.vip: {(b.ip, b.port) for b in a.backends if b.valid} for a in arms}


def departed(old: Sequence[KernelArm], new: Sequence[KernelArm]) -> list[tuple[str, str, int]]:
    """(VIP, backend ip, backend port) of every valid backend of `old` that `new` no longer has as a valid backend
    of the same VIP (sorted: the order flows are forgotten in)."""
    before, after = _endpoints(old), _endpoints(new)
    return sorted((vip, ip, port) for vip, eps in before.items() for ip, port in eps - after.get(vip, set()))


def apply_kernel_udp(
    fx: KernelUdpEffects, where: str, arms: Sequence[KernelArm], previous: Sequence[KernelArm] = ()
) -> int:
    """Make table `ip aether_udp` in `fx`'s netns exactly `arms`, then forget the flows of the backends that left
    since `previous`; return how many conntrack entries were deleted."""
    wanted = kernel_udp.build_kernel_udp(arms)
    res = fx.nft(kernel_udp.replace_commands(wanted))
    if res.rc != 0:
        raise KernelUdpError(
            f"nft refused the kernel UDP rules for {where} (the previous rules stay): {res.error.strip()}"
        )
    listed = fx.nft({"nftables": [{"list": {"table": {"family": "ip", "name": kernel_udp.KERNEL_UDP_TABLE}}}]})
    if listed.rc != 0 or kernel_udp.canonical(listed.json()) != kernel_udp.canonical(wanted):
        raise KernelUdpError(
            f"the kernel UDP rules loaded in {where} differ from what was asked: {listed.error.strip()}"
        )
    return sum(fx.forget_flows(vip, L4_OUTBOUND_PORT, ip, port) for vip, ip, port in departed(previous, arms))


def _in_netns(path: str, open_effects: Callable[[], KernelUdpEffects], fn: Callable[[KernelUdpEffects], int]) -> int:
    def run() -> int:
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
    except (OSError, NftError) as exc:
        raise KernelUdpError(f"programming the kernel UDP rules in {path} failed: {exc}") from exc


def program_kernel_udp(
    netns_path: str | os.PathLike[str],
    arms: Sequence[KernelArm],
    *,
    previous: Sequence[KernelArm] = (),
    effects: Callable[[], KernelUdpEffects] = KernelUdpKernel,
) -> int:
    """`apply_kernel_udp` on a thread inside the netns at `netns_path`."""
    path = os.fspath(netns_path)
    return _in_netns(path, effects, lambda fx: apply_kernel_udp(fx, path, arms, previous))


def remove_kernel_udp(
    netns_path: str | os.PathLike[str], *, effects: Callable[[], KernelUdpEffects] = KernelUdpKernel
) -> None:
    """Delete table `ip aether_udp` (idempotent)."""
    path = os.fspath(netns_path)

    def remove(fx: KernelUdpEffects) -> int:
        res = fx.nft(kernel_udp.delete_commands())
        if res.rc != 0:
            raise KernelUdpError(f"removing the kernel UDP rules from {path} failed: {res.error.strip()}")
        return 0

    _in_netns(path, effects, remove)
