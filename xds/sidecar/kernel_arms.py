"""The sidecar's plaintext UDP arms (`ServiceArm`) as the in-kernel UDP path's arms (`aether.netns.kernel_udp`):
pure; `kernel_path.kernel_plan` feeds it the arms that select `kernel`.

- The Service's own idle timeout (`idle_timeout_seconds`) rides along: the arm's `ct timeout` (None: the node's).
- Only plaintext UDP arms (`udp:`, and `udp-split:` for a UDPRoute's weighted split); a `blackhole` arm (no healthy backend) becomes an arm without backends: it drops, as Envoy's
  blackhole does. TCP arms are not touched (R5).
- A draining endpoint is left out: no new flow picks it, and the installer deletes its flows' conntrack entries, so
  they move at their next datagram, as on the Envoy path.
- A weighted arm (`backends`): a backend's weight is shared evenly by its serving endpoints (scaled by the least
  common multiple of their counts, so the weights stay integers). Weight 0 (`Drained`) takes no range, but its
  serving endpoints stay as valid entries of weight 0, so their open flows are not forgotten: they finish, as on
  the Envoy path (a drained backendRef's endpoint that another backendRef also carries is listed once). An invalid
  backendRef (any other `reason`), or a backend with weight but no serving endpoint, keeps its weight as one
  invalid entry: its share is dropped, never given to the others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from aether.api.meshnode import BLACKHOLE_CLUSTER, ArmBackend, Endpoint, ServiceArm
from aether.netns.kernel_udp import KernelArm, KernelBackend

UDP_PREFIXES = ("udp:", "udp-split:")  # a plain UDP arm's cluster, a weighted one's (aether.api.naming)
UNROUTABLE = KernelBackend("0.0.0.0", 1, 0, valid=False)  # an invalid entry's address is never used: it drops


def _serving(endpoints: Sequence[Endpoint]) -> list[Endpoint]:
    return [e for e in endpoints if not e.draining]


def _weighted(backends: Sequence[ArmBackend]) -> tuple[KernelBackend, ...]:
    counts = [len(_serving(b.endpoints)) for b in backends]
    scale = math.lcm(*[n for n in counts if n]) if any(counts) else 1
    out: list[KernelBackend] = []
    drained: list[KernelBackend] = []
    for b, n in zip(backends, counts, strict=True):
        if b.weight == 0:  # drain: no new flow, its endpoints stay valid so their open flows are not forgotten
            drained += [KernelBackend(e.ip, e.port, 0) for e in _serving(b.endpoints)]
            continue
        if (b.reason is not None and b.reason != "Drained") or n == 0:
            out.append(UNROUTABLE._replace(weight=b.weight * scale))
            continue
        out += [KernelBackend(e.ip, e.port, b.weight * scale // n) for e in _serving(b.endpoints)]
    taken = {(k.ip, k.port) for k in out if k.valid}
    for k in drained:  # an endpoint that another backendRef also carries is already there
        if (k.ip, k.port) not in taken:
            taken.add((k.ip, k.port))
            out.append(k)
    return tuple(out)


def kernel_arm(arm: ServiceArm) -> KernelArm | None:
    """`arm` for table `ip aether_udp`, or None when it is not a plaintext UDP arm."""
    idle = arm.idle_timeout_seconds  # the Service's own (its annotation); None: the node's default
    if arm.cluster == BLACKHOLE_CLUSTER:  # only UDP is matched, so a TCP blackhole drops UDP too, as Envoy does
        return KernelArm(arm.vip, (), idle)
    if not arm.cluster.startswith(UDP_PREFIXES):
        return None
    if arm.backends is not None:
        return KernelArm(arm.vip, _weighted(arm.backends), idle)
    return KernelArm(arm.vip, tuple(KernelBackend(e.ip, e.port, 1) for e in _serving(arm.endpoints)), idle)


def kernel_arms(arms: Sequence[ServiceArm]) -> list[KernelArm]:
    return [k for k in map(kernel_arm, arms) if k is not None]
