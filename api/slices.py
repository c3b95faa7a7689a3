"""The MeshServiceSlice model: the shared, node-independent service tables, published once in bounded slices.

One namespace's Services (their UDP and TCP arms, unsupported shapes, QUIC destinations) are split over
`spec.count` cluster-scoped slices named `<namespace>.<index>`; a Service's slice is a stable hash of its name
(`slice_index`), so a change to one Service rewrites one slice. A MeshNode names the slices of the namespaces it
depends on (`status.serviceSlices`); `effective` gives the node's whole desired state (every arm in effect) from the
MeshNode and the slices, which is what translation reads. This *is* the CRD schema (crds/ is generated from it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from aether.api.meshnode import (
    API_GROUP,
    IneligibleDestination,
    L4Status,
    MeshNode,
    MeshNodeFileError,
    MeshObject,
    ObjectMeta,
    QuicDestination,
    _Model,
    parse_meshnode,
    read_document,
    validation_problems,
)
from aether.api.statefile import split_items

SLICE_KIND = "MeshServiceSlice"
SLICE_PLURAL = "meshserviceslices"
NAMESPACE_LABEL = f"{API_GROUP}/namespace"  # on every slice: the namespace whose Services it holds
MANAGED_BY_LABEL, MANAGED_BY = "app.kubernetes.io/managed-by", "aether-operator"


class SliceQuic(_Model):
    destinations: list[QuicDestination] = Field(default_factory=list)
    ineligible: list[IneligibleDestination] = Field(default_factory=list)


class SliceSpec(_Model):
    """What one slice holds: part `index` of `count` of one namespace's Services, as the operator computed it."""

    namespace: str = Field(min_length=1, description="the namespace whose Services this slice holds")
    index: int = Field(ge=0, description="this slice's part of the namespace: <namespace>.<index>")
    count: int = Field(ge=1, description="how many slices the namespace had when this one was written")
    services: int = Field(default=0, ge=0, description="how many Services this slice holds")
    udp: L4Status = Field(default_factory=L4Status)
    tcp: L4Status = Field(default_factory=L4Status)
    quic: SliceQuic = Field(default_factory=SliceQuic)


class MeshServiceSlice(MeshObject):
    kind: Literal["MeshServiceSlice"] = "MeshServiceSlice"
    metadata: ObjectMeta
    spec: SliceSpec


def slice_name(namespace: str, index: int) -> str:
    """Namespace names are DNS labels (no dot), so `<namespace>.<index>` never collides."""
    return f"{namespace}.{index}"


def split_name(name: str) -> tuple[str, int] | None:
    ns, dot, index = name.rpartition(".")
    return (ns, int(index)) if dot and ns and index.isdigit() else None


def slice_index(service: str, count: int) -> int:
    """The slice of Service `service` (its name) when its namespace has `count` slices: a stable hash, so adding
    or changing one Service leaves every other slice as it is."""
    h = int.from_bytes(hashlib.blake2b(service.encode(), digest_size=8).digest(), "big")
    return h % count


def parse_slice(data: Any, source: str = "<input>") -> MeshServiceSlice:
    try:
        return MeshServiceSlice.model_validate(data)
    except ValidationError as exc:
        problems = [f"{source}: {p}" for p in validation_problems(exc)]
        raise MeshNodeFileError("; ".join(problems)) from exc


def problems_of(node: MeshNode, slices: Mapping[str, MeshServiceSlice]) -> list[str]:
    """What keeps the node's referenced slices from being its whole desired state: a slice missing, or stale (its
    spec is from another split of its namespace than the one the MeshNode names). Empty when all is in effect."""
    refs = node.status.service_slices
    if refs is None:
        return []
    per_ns: dict[str, int] = {}
    for name in refs.names:
        parts = split_name(name)
        if parts is not None:
            per_ns[parts[0]] = per_ns.get(parts[0], 0) + 1
    missing, stale = [], []
    for name in refs.names:
        sl = slices.get(name)
        parts = split_name(name)
        if sl is None:
            missing.append(name)
        elif parts is None or (sl.spec.namespace, sl.spec.index) != parts or sl.spec.count != per_ns[parts[0]]:
            stale.append(f"{name} (part {sl.spec.index} of {sl.spec.count} of {sl.spec.namespace})")
    out = []
    if missing:
        out.append(f"{len(missing)} MeshServiceSlices missing: {', '.join(missing[:10])}{' ...' * (len(missing) > 10)}")
    if stale:
        out.append(f"{len(stale)} MeshServiceSlices stale: {', '.join(stale[:10])}{' ...' * (len(stale) > 10)}")
    return out


def effective(node: MeshNode, slices: Mapping[str, MeshServiceSlice]) -> MeshNode:
    """The node's whole desired state: its MeshNode with every arm, shape and QUIC destination of the slices it
    names appended (in the order named) to what the MeshNode itself holds (a bare MeshNode file holds them inline).
    A missing slice contributes nothing (`problems_of` says which)."""
    refs = node.status.service_slices
    held = [slices[n] for n in (refs.names if refs is not None else ()) if n in slices]
    if not held:
        return node
    st = node.status

    def l4(own: L4Status, parts: Iterable[L4Status]) -> L4Status:
        parts = list(parts)
        return L4Status(
            services=[*own.services, *(a for p in parts for a in p.services)],
            unsupported_shapes=[*own.unsupported_shapes, *(s for p in parts for s in p.unsupported_shapes)],
        )

    quic = st.quic.model_copy(
        update={
            "destinations": [*st.quic.destinations, *(d for s in held for d in s.spec.quic.destinations)],
            "ineligible": [*st.quic.ineligible, *(d for s in held for d in s.spec.quic.ineligible)],
        }
    )
    status = st.model_copy(
        update={
            "udp": l4(st.udp, (s.spec.udp for s in held)),
            "tcp": l4(st.tcp, (s.spec.tcp for s in held)),
            "quic": quic,
        }
    )
    return node.model_copy(update={"status": status})


@dataclass(frozen=True)
class NodeState:
    """A MeshNode and the slices at hand (by name): what the sidecar programs is `effective()`."""

    node: MeshNode
    slices: dict[str, MeshServiceSlice] = field(default_factory=dict)
    others: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # other kinds of a List, by kind

    def effective(self) -> MeshNode:
        return effective(self.node, self.slices)

    def problems(self) -> list[str]:
        return problems_of(self.node, self.slices)


def parse_state(data: Any, source: str = "<input>", node: str | None = None) -> NodeState:
    """A bare MeshNode, or a `kind: List` of MeshNodes, MeshServiceSlices and other objects the sidecar reads
    (`kubectl get mn,mss -o yaml`; taken apart by api.statefile): the MeshNode named `node` (or the only one), every
    slice (validated here) and the other items by kind, unparsed (each reader validates its own kind)."""
    body, others = split_items(data, source, node)
    if not isinstance(body, dict):
        raise MeshNodeFileError(f"{source}: <root>: expected a MeshNode or a List, got {type(body).__name__}")
    slices: dict[str, MeshServiceSlice] = {}
    for i, item in enumerate(others.pop(SLICE_KIND, [])):
        sl = parse_slice(item, f"{source}: {SLICE_KIND}[{i}]")
        slices[sl.metadata.name] = sl
    return NodeState(parse_meshnode(body, source), slices, others)


def load_state_file(path: str | Path, node: str | None = None) -> NodeState:
    p = Path(path)
    return parse_state(read_document(p), str(p), node)
