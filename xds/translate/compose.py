"""Desired state -> Envoy resources for one node: compose the per-area builders (pure).

`BUILDERS` is every area's builder, in the order their results merge: plaintext UDP (`l4/udp.py`), the raw TCP
floor (`l4/tcp.py`), east-west (`eastwest/build.py`) and the east-west gateway's role (`eastwest/gateway.py`, only
with `TranslateOptions.east_west_gateway`). Each follows the builder contract in
`aether.xds.resources`; `translate` runs the ones `TranslateOptions.areas` names (all when empty) and merges their
results, and the gates (`aether.xds.gates`) run on the merged result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Final, NamedTuple, TypeAlias

from aether.api.meshnode import MeshNode
from aether.netns.records import PodRecord
from aether.xds import memo
from aether.xds.resources import KNOWN_TYPES, Resources, TranslateOptions, merge
from aether.xds.translate.eastwest import build as eastwest
from aether.xds.translate.eastwest import gateway
from aether.xds.translate.l4 import tcp, udp

Builder: TypeAlias = Callable[[MeshNode, Mapping[str, PodRecord], TranslateOptions], Resources]


class Area(NamedTuple):
    name: str  # what `TranslateOptions.areas` and `aether xds --areas` call it
    build: Builder


def gateway_role(node: MeshNode, records: Mapping[str, PodRecord], options: TranslateOptions) -> Resources:
    """The gateway area, played as the MeshNode says when the operator gave this node the role (`status.gateway`,
    from the Node label): on its address (`--east-west-gateway` wins), exporting only the destinations a
    ServiceExport names (`exported`). Without the role, as `--east-west-gateway` says (every local destination)."""
    role = node.status.gateway
    if role is None:
        return gateway.area(node, records, options)
    quic = node.status.quic
    exported = quic.model_copy(update={"destinations": [d for d in quic.destinations if d.exported]})
    only = node.model_copy(update={"status": node.status.model_copy(update={"quic": exported})})
    return gateway.area(only, records, replace(options, east_west_gateway=options.east_west_gateway or role.address))


BUILDERS: Final[tuple[Area, ...]] = (
    Area("udp", udp.build),
    Area("tcp-floor", tcp.build),
    Area("eastwest", eastwest.build),
    Area("gateway", gateway_role),
)
AREAS: Final = tuple(area.name for area in BUILDERS)


def builders(areas: tuple[str, ...] = ()) -> list[Builder]:
    """The builders of `areas` (all when empty), in BUILDERS order."""
    unknown = sorted(set(areas) - set(AREAS))
    if unknown:
        raise ValueError(f"unknown translation areas {unknown}; known: {list(AREAS)}")
    return [area.build for area in BUILDERS if not areas or area.name in areas]


def translate(node: MeshNode, records: Mapping[str, PodRecord], options: TranslateOptions | None = None) -> Resources:
    opts = options or TranslateOptions()
    merged = merge(*(build(node, records, opts) for build in builders(opts.areas)))
    for type_url in KNOWN_TYPES[:3]:  # CDS, EDS, LDS always present (possibly empty): removals need a type
        merged.setdefault(type_url, {})
    return merged


def clear_memo() -> None:
    """Forget every memo in aether.xds (`aether.xds.memo.clear_all`; benchmarks measure cold translations with it)."""
    memo.clear_all()
