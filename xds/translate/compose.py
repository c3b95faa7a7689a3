"""Desired state -> Envoy resources for one node: compose the per-area builders (pure).

Builders follow the contract in `aether.xds.resources`. The east-west QUIC builder
(`aether.xds.translate.eastwest.build.build`) joins when that module exists. The gates run on the merged result.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TypeAlias

from aether.api.meshnode import MeshNode
from aether.netns.records import PodRecord
from aether.xds import memo
from aether.xds.resources import KNOWN_TYPES, Resources, TranslateOptions, merge
from aether.xds.translate.l4 import tcp, udp

Builder: TypeAlias = Callable[[MeshNode, Mapping[str, PodRecord], TranslateOptions], Resources]


AREAS = ("udp", "tcp-floor", "eastwest")


def builders(areas: tuple[str, ...] = ()) -> list[Builder]:
    """The builders of `areas` (all when empty), in AREAS order; eastwest only once its module exists."""
    unknown = sorted(set(areas) - set(AREAS))
    if unknown:
        raise ValueError(f"unknown translation areas {unknown}; known: {list(AREAS)}")
    wanted = areas or AREAS
    out: list[Builder] = []
    if "udp" in wanted:
        out.append(udp.build)
    if "tcp-floor" in wanted:
        out.append(tcp.build)
    if "eastwest" in wanted:
        try:
            eastwest = importlib.import_module("aether.xds.translate.eastwest.build")
        except ModuleNotFoundError as exc:
            if exc.name != "aether.xds.translate.eastwest.build":
                raise
        else:
            out.append(eastwest.build)
    return out


def translate(node: MeshNode, records: Mapping[str, PodRecord], options: TranslateOptions | None = None) -> Resources:
    opts = options or TranslateOptions()
    merged = merge(*(build(node, records, opts) for build in builders(opts.areas)))
    for type_url in KNOWN_TYPES[:3]:  # CDS, EDS, LDS always present (possibly empty): removals need a type
        merged.setdefault(type_url, {})
    return merged


def clear_memo() -> None:
    """Forget every memo in aether.xds (`aether.xds.memo.clear_all`; benchmarks measure cold translations with it)."""
    memo.clear_all()
