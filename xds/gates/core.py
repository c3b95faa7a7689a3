"""Our own validation gates, run on the merged translation before anything is served (pure).

`run_gates` reports every finding; the sidecar refuses only the resources a finding names (refuse.py) and serves
the rest, and refuses the whole new state (the last good one keeps serving) only when something is still wrong
after that. Envoy would
not catch these: a connection-less UDP listener is invisible to any filter-chain walker, so a matcher arm naming
a missing cluster just drops datagrams; a duplicate VIP silently collapses two arms into one map key; a listener
on a missing netns is rejected only after everything else was pushed.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from aether.api.meshnode import MeshNode
from aether.xds.memo import ObjectMemo, register
from aether.xds.resources import CLUSTER, LISTENER, Resources, Shared
from aether.xds.translate.l4.tcp import TCP_PROXY_CONFIG
from aether.xds.translate.l4.udp import UDP_ROUTE

PathExists = Callable[[str], bool]
_vip = attrgetter("vip")


@dataclass(frozen=True)
class GateFailure:
    gate: str
    reason: str

    def __str__(self) -> str:
        return f"{self.gate}: {self.reason}"


def _clusters_in(obj: Any) -> frozenset[str] | set[str]:
    """The cluster of every udp_proxy Route and tcp_proxy config anywhere inside `obj` (a `Shared` part is walked
    once per object; the parts of a dict are unioned as sets, so a 10,000-arm matcher costs one pass in C)."""
    if isinstance(obj, Shared):
        return _shared_clusters(obj)
    out: set[str] = set()
    if isinstance(obj, dict):
        if obj.get("@type") in (UDP_ROUTE, TCP_PROXY_CONFIG) and "cluster" in obj:
            out.add(obj["cluster"])
        values: Any = obj.values()
    elif isinstance(obj, list):
        values = obj
    else:
        return out
    for value in values:
        if type(value) is Shared:
            out |= _shared_clusters(value)
        elif isinstance(value, dict | list):
            out |= _clusters_in(value)
    return out


_walked_shared: ObjectMemo[str, frozenset[str]] = register(ObjectMemo("clusters"))  # on each Shared part


def _shared_clusters(obj: Shared) -> frozenset[str]:
    hit = _walked_shared.get(obj, "clusters")
    if hit is not None:
        return hit
    return _walked_shared.put(obj, "clusters", frozenset(_clusters_in(dict(obj))))


_walked: dict[int, tuple[Any, frozenset[str]]] = register({})


def clusters_named_by(listener: dict[str, Any]) -> frozenset[str]:
    """The clusters a listener routes to, memoized per listener object (resource dicts are immutable and shared
    between translations, so an unchanged listener with 10,000 arms is walked once)."""
    hit = _walked.get(id(listener))
    if hit is not None and hit[0] is listener:
        return hit[1]
    named = frozenset(_clusters_in(listener))
    if len(_walked) > 8192:
        _walked.clear()
    _walked[id(listener)] = (listener, named)
    return named


def clusters_of(listeners: Mapping[str, dict[str, Any]]) -> dict[str, frozenset[str]]:
    """`clusters_named_by` of each listener of one translation; the memo then keeps these listeners' walks only.
    A listener object no translation holds any more is never looked up again, and builders that return fresh dicts
    each time would otherwise fill the memo with every listener they ever made (found by bench/soak.py: each
    sidecar's RSS grew by megabytes a minute, since it re-translates every few seconds)."""
    out = {name: clusters_named_by(listener) for name, listener in listeners.items()}
    if len(_walked) > len(listeners):
        keep = {id(listener) for listener in listeners.values()}
        for key in [k for k in _walked if k not in keep]:
            del _walked[key]
    return out


def arms_resolve(resources: Resources) -> list[GateFailure]:
    """Every matcher arm (and on_no_match) and every tcp_proxy names a cluster present in CDS."""
    clusters = resources.get(CLUSTER, {})
    out: list[GateFailure] = []
    named = clusters_of(resources.get(LISTENER, {}))
    for name in sorted(named):
        missing = sorted(named[name].difference(clusters))  # C-level: the common case is empty
        if missing:
            out.append(GateFailure("arm-names-cluster", f"listener {name!r} routes to {missing}, not in CDS"))
    return out


def unique_vips(node: MeshNode) -> list[GateFailure]:
    """No VIP appears in two arms of one transport (one would silently win the matcher map)."""
    out: list[GateFailure] = []
    for transport, status in (("udp", node.status.udp), ("tcp", node.status.tcp)):
        vips = list(map(_vip, status.services))
        if len(set(vips)) == len(vips):
            continue  # the common case, in C
        counts = Counter(vips)
        for vip, n in sorted(counts.items()):
            if n > 1:
                services = sorted(a.service for a in status.services if a.vip == vip)
                out.append(GateFailure("duplicate-vip", f"{transport} VIP {vip} is claimed by {n} arms: {services}"))
    return out


def netns_of(listener: dict[str, Any]) -> str | None:
    path = listener.get("address", {}).get("socketAddress", {}).get("networkNamespaceFilepath")
    return path if isinstance(path, str) else None


def netns_exist(resources: Resources, path_exists: PathExists = os.path.exists) -> list[GateFailure]:
    """Every listener bound into a netns names a path that exists now."""
    out: list[GateFailure] = []
    for name, listener in sorted(resources.get(LISTENER, {}).items()):
        path = netns_of(listener)
        if path is not None and not path_exists(path):
            out.append(GateFailure("netns-exists", f"listener {name!r} binds into {path}, which does not exist"))
    return out


def bind_key(listener: dict[str, Any]) -> tuple[str, str, str, int]:
    """What a listener binds: (netns, protocol, address, port)."""
    sa = listener.get("address", {}).get("socketAddress", {})
    return (netns_of(listener) or "", sa.get("protocol", "TCP"), sa.get("address", ""), int(sa.get("portValue", 0)))


def unique_binds(resources: Resources) -> list[GateFailure]:
    """No two listeners bind the same (netns, protocol, address, port): Envoy would reject the second."""
    seen: dict[tuple[str, str, str, int], str] = {}
    out: list[GateFailure] = []
    for name, listener in sorted(resources.get(LISTENER, {}).items()):
        key = bind_key(listener)
        if key in seen:
            out.append(GateFailure("unique-bind", f"listeners {seen[key]!r} and {name!r} both bind {key}"))
        else:
            seen[key] = name
    return out


def run_gates(node: MeshNode, resources: Resources, path_exists: PathExists = os.path.exists) -> list[GateFailure]:
    """All gates; an empty list means the state may be served."""
    return [
        *unique_vips(node),
        *arms_resolve(resources),
        *unique_binds(resources),
        *netns_exist(resources, path_exists),
    ]
