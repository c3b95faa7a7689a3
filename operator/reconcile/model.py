"""The cluster as the reconcile sees it, and incremental reconcile over it.

`ClusterModel` holds the typed views (fed from the kopf indexes), remembers which namespaces each namespace
result read and which namespaces each node depends on, and on `reconcile()` recomputes only what a change can
reach. `reconcile(full=True)` recomputes everything; a property test checks both agree."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from aether.api.meshnode import EffectiveStatus
from aether.api.naming import DEFAULT_TRUST_DOMAIN
from aether.operator.reconcile.gateway import GrantView, RouteView, parse_grant, parse_route
from aether.operator.reconcile.multicluster import (
    PEERS,
    ExportView,
    ImportView,
    PeerView,
    parse_export,
    parse_import,
    parse_peer,
)
from aether.operator.reconcile.namespace import NamespaceResult, compute_namespace
from aether.operator.reconcile.nodes import NodeDesired, Tables, dependency_set, meshed_pods
from aether.operator.reconcile.routes import Verdict
from aether.operator.reconcile.views import (
    NamespaceView,
    NodeView,
    PodView,
    ServiceView,
    SliceView,
    parse_namespace,
    parse_node,
    parse_pod,
    parse_service,
    parse_slice,
)

Kind = Literal["namespace", "node", "pod", "service", "slice", "route", "grant", "export", "import", "peer"]
View = (
    NamespaceView
    | NodeView
    | PodView
    | ServiceView
    | SliceView
    | RouteView
    | GrantView
    | ExportView
    | ImportView
    | PeerView
)
PARSERS: dict[str, Any] = {
    "namespace": parse_namespace,
    "node": parse_node,
    "pod": parse_pod,
    "service": parse_service,
    "slice": parse_slice,
    "route": parse_route,
    "grant": parse_grant,
    "export": parse_export,
    "import": parse_import,
    "peer": parse_peer,
}


@dataclass
class Output:
    """What changed in one reconcile: node statuses to write, nodes gone, MeshServiceSlices to write (name -> spec;
    None: no longer wanted, delete it), route verdicts of namespaces whose results changed (routes gone from them
    map to ())."""

    desired: dict[str, NodeDesired] = field(default_factory=dict)
    slices: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    removed_nodes: set[str] = field(default_factory=set)
    routes: dict[tuple[str, str], tuple[Verdict, ...]] = field(default_factory=dict)
    new_discards: set[tuple[str, str, str]] = field(default_factory=set)

    @property
    def nodes(self) -> dict[str, EffectiveStatus]:
        """The changed nodes' statuses as pydantic models (tests; the reconciler uses `desired`)."""
        return {name: d.status() for name, d in self.desired.items()}


class _Reader:
    """The World a namespace computation sees; records which namespaces it read."""

    def __init__(self, model: ClusterModel) -> None:
        self.m = model
        self.read: set[str] = set()
        self.trust_domain = model.trust_domain

    def namespace(self, name: str) -> NamespaceView | None:
        self.read.add(name)
        return self.m.namespaces.get(name)

    def service(self, namespace: str, name: str) -> ServiceView | None:
        self.read.add(namespace)
        return self.m.services[namespace].get(name)

    def services_in(self, namespace: str) -> Iterable[ServiceView]:
        self.read.add(namespace)
        return self.m.services[namespace].values()

    def slices_of(self, namespace: str, service: str) -> Iterable[SliceView]:
        self.read.add(namespace)
        names = self.m.slices_by_service.get((namespace, service), ())
        return [self.m.slices[namespace][n] for n in sorted(names)]

    def routes_in(self, namespace: str) -> Iterable[RouteView]:
        self.read.add(namespace)
        return self.m.routes[namespace].values()

    def grants_in(self, namespace: str) -> Iterable[GrantView]:
        self.read.add(namespace)
        return self.m.grants[namespace].values()

    def pod(self, namespace: str, name: str) -> PodView | None:
        self.read.add(namespace)
        return self.m.pods.get((namespace, name))

    def export(self, namespace: str, name: str) -> ExportView | None:
        self.read.add(namespace)
        return self.m.exports[namespace].get(name)

    def imports_in(self, namespace: str) -> Iterable[ImportView]:
        self.read.add(namespace)
        return self.m.imports[namespace].values()

    def peer(self, name: str) -> PeerView | None:
        self.read.add(PEERS)
        return self.m.peers.get(name)

    def pods_matching(self, namespace: str, selector: frozenset[tuple[str, str]]) -> Iterable[PodView]:
        self.read.add(namespace)
        if not selector:
            return []
        sets = sorted((self.m.pods_by_label.get((namespace, k, v), set()) for k, v in selector), key=len)
        names = set(sets[0]).intersection(*sets[1:])
        return [self.m.pods[(namespace, n)] for n in sorted(names)]

    def vip_owner(self, vip: str) -> ServiceView | None:
        claims = [self.m.services[ns][n] for ns, n in sorted(self.m.vip_claims.get(vip, ()))]
        self.read.update(s.namespace for s in claims)
        return min(claims, key=lambda s: s.order, default=None)


K = TypeVar("K")


def _unindex(index: dict[K, set[str]], key: K, name: str) -> None:
    """`name` out of an index, and a key left empty too (pods roll with labels of their own: kept, they grew)."""
    names = index.get(key)
    if names is not None:
        names.discard(name)
        if not names:
            del index[key]


class ClusterModel:
    def __init__(self, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> None:
        self.trust_domain = trust_domain
        self.namespaces: dict[str, NamespaceView] = {}
        self.nodes: dict[str, NodeView] = {}
        self.pods: dict[tuple[str, str], PodView] = {}
        self.pods_by_node: dict[str, set[tuple[str, str]]] = defaultdict(set)
        # (namespace, label key, value) -> pod names: what a Service's selector selects, without a scan
        self.pods_by_label: dict[tuple[str, str, str], set[str]] = defaultdict(set)
        self.services: dict[str, dict[str, ServiceView]] = defaultdict(dict)
        self.slices: dict[str, dict[str, SliceView]] = defaultdict(dict)
        self.slices_by_service: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.routes: dict[str, dict[str, RouteView]] = defaultdict(dict)
        self.grants: dict[str, dict[str, GrantView]] = defaultdict(dict)
        self.exports: dict[str, dict[str, ExportView]] = defaultdict(dict)  # ServiceExports
        self.imports: dict[str, dict[str, ImportView]] = defaultdict(dict)  # ServiceImports
        self.peers: dict[str, PeerView] = {}  # MeshPeers (cluster-scoped)
        self.vip_claims: dict[str, set[tuple[str, str]]] = defaultdict(set)  # ClusterIP -> Services with it
        self.results: dict[str, NamespaceResult] = {}
        self.readers: dict[str, set[str]] = defaultdict(set)  # namespace -> results that read it
        self.reads: dict[str, frozenset[str]] = {}
        self.node_deps: dict[str, frozenset[str]] = {}
        self.dependents: dict[str, set[str]] = defaultdict(set)  # namespace -> nodes depending on it
        self.dirty_ns: set[str] = set()
        self.dirty_nodes: set[str] = set()
        self.all_deps_dirty = False
        self.known_nodes: set[str] = set()
        self.discards: set[tuple[str, str, str]] = set()

    # ---- feeding -----------------------------------------------------------------------------
    def apply(self, kind: Kind, key: tuple[str, str], view: View | None) -> None:
        """Insert/replace (view) or delete (None) one object; key is (namespace or "", name)."""
        ns, name = key
        if kind == "namespace":
            old = self.namespaces.pop(name, None)
            if isinstance(view, NamespaceView):
                self.namespaces[name] = view
            if old != view:
                self.dirty_ns.add(name)
                self.all_deps_dirty = True
        elif kind == "node":
            self.nodes.pop(name, None)
            if isinstance(view, NodeView):
                self.nodes[name] = view
            self.dirty_nodes.add(name)
        elif kind == "pod":
            old_pod = self.pods.pop(key, None)
            for k, v in old_pod.labels if old_pod is not None else ():
                _unindex(self.pods_by_label, (ns, k, v), name)
            if old_pod is not None and old_pod.node:
                self.pods_by_node[old_pod.node].discard(key)
                self.dirty_nodes.add(old_pod.node)
            if isinstance(view, PodView):
                self.pods[key] = view
                for k, v in view.labels:
                    self.pods_by_label[(ns, k, v)].add(name)
                if view.node:
                    self.pods_by_node[view.node].add(key)
                    self.dirty_nodes.add(view.node)
            if old_pod != view:
                self.dirty_ns.add(ns)
        elif kind == "slice":
            old_slice = self.slices[ns].pop(name, None)
            if old_slice is not None and old_slice.service:
                _unindex(self.slices_by_service, (ns, old_slice.service), name)
            if isinstance(view, SliceView):
                self.slices[ns][name] = view
                if view.service:
                    self.slices_by_service[(ns, view.service)].add(name)
            self.dirty_ns.add(ns)
        elif kind == "service":
            old_svc = self.services[ns].pop(name, None)
            for vip in old_svc.vips if old_svc is not None else ():
                self._claim(vip, key, False)
            if isinstance(view, ServiceView):
                self.services[ns][name] = view
                for vip in view.vips:  # every family's ClusterIP
                    self._claim(vip, key, True)
        elif kind == "route":
            self.routes[ns].pop(name, None)
            if isinstance(view, RouteView):
                self.routes[ns][name] = view
        elif kind == "grant":
            self.grants[ns].pop(name, None)
            if isinstance(view, GrantView):
                self.grants[ns][name] = view
        else:
            self._apply_multicluster(kind, key, view)
        if kind in ("service", "route", "grant"):
            self.dirty_ns.add(ns)

    def _apply_multicluster(self, kind: Kind, key: tuple[str, str], view: View | None) -> None:
        """ServiceExports and ServiceImports dirty their namespace; a MeshPeer every namespace that looked one up."""
        ns, name = key
        if kind == "export":
            absent = self.exports[ns].pop(name, None) is None
            if isinstance(view, ExportView):
                self.exports[ns][name] = view
            self.dirty_ns.add(ns)
            if absent != (view is None):  # what the gateway nodes depend on may change
                self.dirty_nodes.update(n for n, v in self.nodes.items() if v.gateway is not None)
        elif kind == "import":
            self.imports[ns].pop(name, None)
            if isinstance(view, ImportView):
                self.imports[ns][name] = view
            self.dirty_ns.add(ns)
        elif kind == "peer":
            old = self.peers.pop(name, None)
            if isinstance(view, PeerView):
                self.peers[name] = view
            if old != view:
                self.dirty_ns.add(PEERS)

    def _claim(self, vip: str, key: tuple[str, str], add: bool) -> None:
        """Track who claims a ClusterIP; every namespace with a claimant is recomputed (the owner may change)."""
        claims = self.vip_claims[vip]
        if add:
            claims.add(key)
        else:
            claims.discard(key)
        self.dirty_ns.update(n for n, _ in claims)
        if not claims:
            del self.vip_claims[vip]

    def apply_raw(self, kind: Kind, obj: dict[str, Any], deleted: bool = False) -> None:
        """apply() from a raw API object (what tests and benchmarks feed)."""
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        self.apply(kind, key, None if deleted else PARSERS[kind](obj))

    # ---- reconciling -------------------------------------------------------------------------
    def mesh_namespaces(self) -> frozenset[str]:
        return frozenset(n for n, v in self.namespaces.items() if v.meshed)

    def _all_namespaces(self) -> set[str]:
        every = set(self.namespaces) | set(self.services) | set(self.routes) | set(self.pods_ns())
        return every | set(self.exports) | set(self.imports)

    def pods_ns(self) -> set[str]:
        return {ns for ns, _ in self.pods}

    def reconcile(self, full: bool = False) -> Output:
        out = Output()
        if full:
            self.dirty_ns |= self._all_namespaces() | set(self.results)
            self.dirty_nodes |= set(self.nodes) | self.known_nodes
            self.all_deps_dirty = True
        todo = set(self.dirty_ns)
        for ns in self.dirty_ns:
            todo |= self.readers.get(ns, set())
        todo.discard(PEERS)  # not a namespace: its readers are
        changed_ns: set[str] = set()
        shaped: set[str] = set()  # changed in what a MeshNode shows (not an endpoint moving inside a slice)
        for ns in sorted(todo):
            reader = _Reader(self)
            result = compute_namespace(reader, ns)
            for old in self.reads.get(ns, frozenset()):
                self.readers[old].discard(ns)
            self.reads[ns] = frozenset(reader.read)
            for r in reader.read:
                self.readers[r].add(ns)
            old_result = self.results.get(ns)
            if old_result != result or full:
                changed_ns.add(ns)
                if full or old_result is None or old_result.shape != result.shape:
                    shaped.add(ns)
                self.results[ns] = result
                before = old_result.slices if old_result is not None else {}
                for name, spec in result.slices.items():
                    if full or before.get(name) != spec:
                        out.slices[name] = spec
                for name in set(before) - set(result.slices):
                    out.slices[name] = None
                old_routes = set(old_result.route_verdicts) if old_result else set()
                for rkey in old_routes - set(result.route_verdicts):
                    out.routes[rkey] = ()
                out.routes.update(result.route_verdicts)
        self.dirty_ns.clear()
        nodes = set(self.dirty_nodes)
        if self.all_deps_dirty:
            nodes |= set(self.nodes)
        for ns in changed_ns:
            if ns in shaped:  # what a MeshNode shows of it moved (slice names, counts): its dependents' statuses
                nodes |= self.dependents.get(ns, set())
        mesh = self.mesh_namespaces()
        tables: dict[frozenset[str], Tables] = {}  # one per dependency set in this pass
        for node in sorted(nodes):
            if node not in self.nodes:
                if node in self.known_nodes:
                    out.removed_nodes.add(node)
                    self.known_nodes.discard(node)
                self._set_deps(node, frozenset())
                continue
            pods = meshed_pods((self.pods[k] for k in self.pods_by_node.get(node, ())), self.namespaces)
            deps = dependency_set(pods, self.namespaces, mesh) | self._exporting(node, mesh)
            self._set_deps(node, deps)
            shared = tables.get(deps)
            if shared is None:
                results = tuple(self.results[d] for d in sorted(deps) if d in self.results)
                shared = tables[deps] = Tables(results, bool(deps) and deps == mesh)
            out.desired[node] = NodeDesired(
                tuple(pods),
                shared.results,
                self.trust_domain,
                shared.every_mesh_namespace,
                shared,
                self.nodes[node].addresses,
                gateway=self.nodes[node].gateway,
            )
            self.known_nodes.add(node)
        self.dirty_nodes.clear()
        self.all_deps_dirty = False
        if changed_ns:
            current = set().union(*(r.discards for r in self.results.values()))
            out.new_discards = current - self.discards
            self.discards = current
        return out

    def _exporting(self, node: str, mesh: frozenset[str]) -> frozenset[str]:
        """A gateway node also depends on every mesh namespace with a ServiceExport: what it exports."""
        if self.nodes[node].gateway is None:
            return frozenset()
        return frozenset(ns for ns, exports in self.exports.items() if exports and ns in mesh)

    def _set_deps(self, node: str, deps: frozenset[str]) -> None:
        old = self.node_deps.get(node, frozenset())
        if old == deps:
            return
        for ns in old - deps:
            self.dependents[ns].discard(node)
        for ns in deps - old:
            self.dependents[ns].add(node)
        self.node_deps[node] = deps
