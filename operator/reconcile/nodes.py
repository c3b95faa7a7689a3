"""One node's MeshNode status from its pods and the results of the namespaces it depends on (pure): the node's
own state (pods, identities, conditions, counts) and the names of the MeshServiceSlices that hold the shared
service tables it reads (`serviceSlices`), never the tables themselves.

A node's dependency set is the namespaces its meshed pods may dial: each pod namespace's
`mesh.aether.dev/egress` annotation (comma-separated namespaces; absent or `*` = every mesh namespace),
plus the pod's own namespace, restricted to mesh namespaces."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from aether.api.meshnode import Condition, EffectiveStatus, GatewayRole, L4Status, MeshPod, QuicStatus, Summary
from aether.api.naming import DEFAULT_TRUST_DOMAIN, spiffe_id
from aether.api.slices import MANAGED_BY, MANAGED_BY_LABEL, NAMESPACE_LABEL
from aether.operator.reconcile.namespace import NamespaceResult
from aether.operator.reconcile.views import NamespaceView, PodView


def dependency_set(
    pods: Iterable[PodView], namespaces: Mapping[str, NamespaceView], mesh: frozenset[str]
) -> frozenset[str]:
    deps: set[str] = set()
    for ns_name in {p.namespace for p in pods}:
        ns = namespaces.get(ns_name)
        if ns is None or not ns.meshed:
            continue
        deps.add(ns_name)
        deps.update(mesh if ns.egress is None else ns.egress & mesh)
    return frozenset(deps)


def meshed_pods(pods: Iterable[PodView], namespaces: Mapping[str, NamespaceView]) -> list[PodView]:
    out = []
    for p in pods:
        ns = namespaces.get(p.namespace)
        if ns is not None and ns.meshed and p.placed:
            out.append(p)
    return sorted(out, key=lambda p: (p.namespace, p.name))


def _conditions(pods: int, namespaces: int, slices: int, degraded: list[str]) -> list[Condition]:
    listed = ", ".join(degraded[:10]) + (f" and {len(degraded) - 10} more" if len(degraded) > 10 else "")
    return [
        Condition(
            type="Ready",
            status="True",
            reason="Reconciled",
            message=f"{pods} pods; the Services of {namespaces} namespaces in {slices} MeshServiceSlices",
        ),
        Condition(
            type="Degraded",
            status="True" if degraded else "False",
            reason="UnsupportedShapes" if degraded else "AsExpected",
            message=f"unsupported shapes in {listed} (see udp/tcp.unsupportedShapes in their slices)"
            if degraded
            else "",
        ),
    ]


def identities(pods: Iterable[PodView], trust_domain: str) -> list[str]:
    return sorted({spiffe_id(p.namespace, p.service_account, trust_domain) for p in pods if p.running})


SELECTOR_NAMESPACES = 20  # up to this many namespaces the selector lists them; beyond, "every mesh namespace"


def selector(namespaces: list[str], every_mesh_namespace: bool) -> str:
    """A label selector for `kubectl get meshserviceslices -l` that lists the slices of `namespaces`."""
    if every_mesh_namespace or len(namespaces) > SELECTOR_NAMESPACES:
        return f"{MANAGED_BY_LABEL}={MANAGED_BY}" + ("" if every_mesh_namespace else f",{NAMESPACE_LABEL}")
    return f"{NAMESPACE_LABEL} in ({','.join(namespaces)})"


@dataclass(frozen=True, eq=False)
class Tables:
    """What a MeshNode shows of the namespaces it depends on (slice names, counts), computed once per dependency
    set and shared by every node with that set (with the default egress, every node)."""

    results: tuple[NamespaceResult, ...]  # sorted by namespace
    every_mesh_namespace: bool = False  # the dependency set is every mesh namespace (default egress)

    @cached_property
    def degraded(self) -> list[str]:
        return [r.namespace for r in self.results if r.degraded]

    @cached_property
    def refs(self) -> dict[str, Any]:
        namespaces = [r.namespace for r in self.results]
        return {
            "selector": selector(namespaces, self.every_mesh_namespace),
            "namespaces": namespaces,
            "names": [n for r in self.results for n in r.slices],
        }

    @cached_property
    def digest(self) -> str:
        h = hashlib.blake2b(str(self.every_mesh_namespace).encode(), digest_size=16)
        for r in self.results:
            h.update(f"|{r.namespace}:{r.shape}".encode())
        return h.hexdigest()


def _pod_wire(p: PodView) -> dict[str, Any]:
    """MeshPod's wire form, built directly (thousands per pass)."""
    out: dict[str, Any] = {"uid": p.uid or f"{p.namespace}/{p.name}", "namespace": p.namespace, "name": p.name}
    if p.ip is not None:
        out["ip"] = p.ip
    out["serviceAccount"] = p.service_account
    if len(p.ips) > 1:  # a dual-stack pod: MeshPod.ips, both families
        out["ips"] = list(p.ips)
    return out


@dataclass(frozen=True, eq=False)
class NodeDesired:
    """One node's desired status, kept as references to shared namespace results: `.owned` is the wire form
    the operator writes (the node's own state and the names of the slices it reads), `.digest` a cheap change
    detector (what of each namespace result the MeshNode shows, plus this node's own pods), `.status()` the whole
    desired state as a pydantic model (the MeshNode with every slice's tables inline: what the sidecar programs)."""

    pods: tuple[PodView, ...]
    results: tuple[NamespaceResult, ...]  # sorted by namespace
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    every_mesh_namespace: bool = False  # the dependency set is every mesh namespace (default egress)
    tables: Tables | None = None  # shared with the nodes of the same dependency set (built here when absent)
    addresses: tuple[str, ...] = ()  # the Node's InternalIPs, both families (MeshNode status.addresses)
    gateway: str | None = None  # the node plays the east-west gateway on this address (MeshNode status.gateway)

    @cached_property
    def shared(self) -> Tables:
        return self.tables if self.tables is not None else Tables(self.results, self.every_mesh_namespace)

    def status(self) -> EffectiveStatus:
        status = assemble(list(self.pods), self.results, self.trust_domain)
        status.addresses = list(self.addresses)
        status.gateway = GatewayRole(address=self.gateway) if self.gateway else None
        return status

    @cached_property
    def digest(self) -> str:
        own = json.dumps(
            [[p.uid, p.namespace, p.name, p.ip, p.ips, p.service_account, p.running] for p in self.pods]
            + [list(self.addresses)]
        )
        h = hashlib.blake2b(own.encode(), digest_size=16)
        h.update(f"{self.trust_domain}|{self.shared.digest}|{self.gateway}".encode())
        return h.hexdigest()

    @cached_property
    def owned(self) -> dict[str, Any]:
        refs = self.shared.refs
        conditions = _conditions(len(self.pods), len(refs["namespaces"]), len(refs["names"]), self.shared.degraded)
        return {
            "conditions": [c.wire() for c in conditions],
            "pods": [_pod_wire(p) for p in self.pods],
            **({"addresses": list(self.addresses)} if self.addresses else {}),
            "quic": {"identities": identities(self.pods, self.trust_domain), "destinations": [], "ineligible": []},
            "serviceSlices": refs,
            **({"gateway": {"address": self.gateway}} if self.gateway else {}),
            "summary": {"pods": len(self.pods), "namespaces": len(refs["namespaces"]), "slices": len(refs["names"])},
        }


def assemble(
    pods: list[PodView], results: Iterable[NamespaceResult], trust_domain: str = DEFAULT_TRUST_DOMAIN
) -> EffectiveStatus:
    """The node's whole desired state with every table inline (what api.slices.effective gives the sidecar from
    the MeshNode and its slices; tests read it). pods: meshed_pods; results: its dependency set's results."""
    rs = sorted(results, key=lambda r: r.namespace)
    udp = L4Status(
        services=[a for r in rs for a in r.tables.udp_arms],
        unsupported_shapes=[s for r in rs for s in r.tables.udp_shapes],
    )
    tcp = L4Status(
        services=[a for r in rs for a in r.tables.tcp_arms],
        unsupported_shapes=[s for r in rs for s in r.tables.tcp_shapes],
    )
    quic = QuicStatus(
        identities=identities(pods, trust_domain),
        destinations=[d for r in rs for d in r.tables.destinations],
        ineligible=[i for r in rs for i in r.tables.ineligible],
    )
    names = [n for r in rs for n in r.slices]
    conditions = _conditions(len(pods), len(rs), len(names), [r.namespace for r in rs if r.degraded])
    return EffectiveStatus(
        conditions=conditions,
        pods=[MeshPod.model_validate(_pod_wire(p)) for p in pods],
        udp=udp,
        tcp=tcp,
        quic=quic,
        summary=Summary(pods=len(pods), namespaces=len(rs), slices=len(names)),
    )
