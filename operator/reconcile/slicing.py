"""How one namespace's service tables are split into MeshServiceSlices (pure).

Each Service contributes a `Contribution` (its arms, shapes and QUIC destination). A namespace with n contributing
Services gets `count` slices, the smallest power of two that keeps the average slice at or under
`TARGET_SERVICES` Services and `TARGET_BYTES` of JSON; a Service's slice is `slice_index(name, count)`, a stable
hash. So a change to one Service rewrites one slice, a new Service one slice (unless the namespace doubles its
count), and recomputing from nothing gives the same slices (level-based: a slice deleted by hand comes back as it
was). The measurements behind the two targets are in docs/architecture.md."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from aether.api.meshnode import IneligibleDestination, QuicDestination, ServiceArm, UnsupportedShape
from aether.api.slices import slice_index, slice_name

TARGET_SERVICES = 64  # the average Services per slice (the fullest of a hash split is ~1.4x that at this size)
TARGET_BYTES = 128 * 1024  # the average JSON bytes per slice (the API refuses an object over 1.5 MiB)


@dataclass(frozen=True)
class Contribution:
    """What one Service adds to its namespace's tables."""

    service: str  # the Service's name (its namespace is the result's)
    udp_arms: tuple[ServiceArm, ...] = ()
    udp_shapes: tuple[UnsupportedShape, ...] = ()
    tcp_arms: tuple[ServiceArm, ...] = ()
    tcp_shapes: tuple[UnsupportedShape, ...] = ()
    destinations: tuple[QuicDestination, ...] = ()
    ineligible: tuple[IneligibleDestination, ...] = ()

    @classmethod
    def joined(cls, service: str, parts: Sequence[Contribution]) -> Contribution:
        """`parts`' lists end to end, in their order (a namespace's tables from its Services')."""
        return cls(
            service,
            tuple(a for p in parts for a in p.udp_arms),
            tuple(x for p in parts for x in p.udp_shapes),
            tuple(a for p in parts for a in p.tcp_arms),
            tuple(x for p in parts for x in p.tcp_shapes),
            tuple(d for p in parts for d in p.destinations),
            tuple(d for p in parts for d in p.ineligible),
        )

    @property
    def empty(self) -> bool:
        return not (
            self.udp_arms or self.udp_shapes or self.tcp_arms or self.tcp_shapes or self.destinations or self.ineligible
        )

    @cached_property
    def wire(self) -> dict[str, list[dict[str, Any]]]:
        return {
            "udp_arms": [a.wire() for a in self.udp_arms],
            "udp_shapes": [x.wire() for x in self.udp_shapes],
            "tcp_arms": [a.wire() for a in self.tcp_arms],
            "tcp_shapes": [x.wire() for x in self.tcp_shapes],
            "destinations": [d.wire() for d in self.destinations],
            "ineligible": [d.wire() for d in self.ineligible],
        }

    @cached_property
    def size(self) -> int:
        return len(json.dumps(self.wire, separators=(",", ":")))


def slice_count(contributions: list[Contribution]) -> int:
    n, size = len(contributions), sum(c.size for c in contributions)
    count = 1
    while count * TARGET_SERVICES < n or count * TARGET_BYTES < size:
        count *= 2
    return count


def plan(namespace: str, contributions: tuple[Contribution, ...]) -> dict[str, dict[str, Any]]:
    """slice name -> its `spec` (wire form) for one mesh namespace; {} when it contributes nothing."""
    full = [c for c in contributions if not c.empty]
    if not full:
        return {}
    count = slice_count(full)
    parts: list[list[Contribution]] = [[] for _ in range(count)]
    for c in sorted(full, key=lambda c: c.service):
        parts[slice_index(c.service, count)].append(c)
    out: dict[str, dict[str, Any]] = {}
    for index, members in enumerate(parts):
        w = [c.wire for c in members]
        out[slice_name(namespace, index)] = {
            "namespace": namespace,
            "index": index,
            "count": count,
            "services": len(members),
            "udp": {
                "services": [a for x in w for a in x["udp_arms"]],
                "unsupportedShapes": [s for x in w for s in x["udp_shapes"]],
            },
            "tcp": {
                "services": [a for x in w for a in x["tcp_arms"]],
                "unsupportedShapes": [s for x in w for s in x["tcp_shapes"]],
            },
            "quic": {
                "destinations": [d for x in w for d in x["destinations"]],
                "ineligible": [d for x in w for d in x["ineligible"]],
            },
        }
    return out
