"""One node's MeshNode status from its pods and the results of the namespaces it depends on (pure).

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

from aether.api.meshnode import Condition, L4Status, MeshNodeStatus, MeshPod, QuicStatus, Summary
from aether.api.naming import DEFAULT_TRUST_DOMAIN, spiffe_id
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


def _conditions(pods: int, udp: int, tcp: int, shapes: int) -> list[Condition]:
    return [
        Condition(
            type="Ready",
            status="True",
            reason="Reconciled",
            message=f"{pods} pods, {udp} UDP and {tcp} TCP arms",
        ),
        Condition(
            type="Degraded",
            status="True" if shapes else "False",
            reason="UnsupportedShapes" if shapes else "AsExpected",
            message=f"{shapes} unsupported shapes (see udp/tcp.unsupportedShapes)" if shapes else "",
        ),
    ]


def _mesh_pods(pods: Iterable[PodView]) -> list[MeshPod]:
    return [
        MeshPod(
            uid=p.uid or f"{p.namespace}/{p.name}",
            namespace=p.namespace,
            name=p.name,
            ip=p.ip,
            service_account=p.service_account,
        )
        for p in pods
    ]


def identities(pods: Iterable[PodView], trust_domain: str) -> list[str]:
    return sorted({spiffe_id(p.namespace, p.service_account, trust_domain) for p in pods if p.running})


@dataclass(frozen=True, eq=False)
class NodeDesired:
    """One node's desired status, kept as references to shared namespace results: `.owned` is the wire form
    the operator writes (built from the results' shared fragments), `.digest` a cheap change detector
    (the namespace results' digests plus this node's own pods), `.status()` the pydantic model."""

    pods: tuple[PodView, ...]
    results: tuple[NamespaceResult, ...]  # sorted by namespace
    trust_domain: str = DEFAULT_TRUST_DOMAIN

    def status(self) -> MeshNodeStatus:
        return assemble(list(self.pods), self.results, self.trust_domain)

    @cached_property
    def digest(self) -> str:
        own = json.dumps([[p.uid, p.namespace, p.name, p.ip, p.service_account, p.running] for p in self.pods])
        h = hashlib.blake2b(own.encode(), digest_size=16)
        h.update(self.trust_domain.encode())
        for r in self.results:
            h.update(f"|{r.namespace}:{r.digest}".encode())
        return h.hexdigest()

    @cached_property
    def owned(self) -> dict[str, Any]:
        f = [r.fragments for r in self.results]
        udp = [a for x in f for a in x["udp_arms"]]
        tcp = [a for x in f for a in x["tcp_arms"]]
        udp_shapes = [s for x in f for s in x["udp_shapes"]]
        tcp_shapes = [s for x in f for s in x["tcp_shapes"]]
        shapes = len(udp_shapes) + len(tcp_shapes)
        return {
            "conditions": [c.wire() for c in _conditions(len(self.pods), len(udp), len(tcp), shapes)],
            "pods": [p.wire() for p in _mesh_pods(self.pods)],
            "udp": {"services": udp, "unsupportedShapes": udp_shapes},
            "tcp": {"services": tcp, "unsupportedShapes": tcp_shapes},
            "quic": {
                "identities": identities(self.pods, self.trust_domain),
                "destinations": [d for x in f for d in x["destinations"]],
                "ineligible": [d for x in f for d in x["ineligible"]],
            },
            "summary": {
                "pods": len(self.pods),
                "udpServices": len(udp),
                "tcpServices": len(tcp),
                "unsupportedShapes": shapes,
            },
        }


def assemble(
    pods: list[PodView], results: Iterable[NamespaceResult], trust_domain: str = DEFAULT_TRUST_DOMAIN
) -> MeshNodeStatus:
    """pods: the node's meshed pods (meshed_pods); results: its dependency set's namespace results."""
    rs = sorted(results, key=lambda r: r.namespace)
    udp = L4Status(
        services=[a for r in rs for a in r.udp_arms], unsupported_shapes=[s for r in rs for s in r.udp_shapes]
    )
    tcp = L4Status(
        services=[a for r in rs for a in r.tcp_arms], unsupported_shapes=[s for r in rs for s in r.tcp_shapes]
    )
    quic = QuicStatus(
        identities=identities(pods, trust_domain),
        destinations=[d for r in rs for d in r.destinations],
        ineligible=[i for r in rs for i in r.ineligible],
    )
    shapes = len(udp.unsupported_shapes) + len(tcp.unsupported_shapes)
    conditions = _conditions(len(pods), len(udp.services), len(tcp.services), shapes)
    return MeshNodeStatus(
        conditions=conditions,
        pods=_mesh_pods(pods),
        udp=udp,
        tcp=tcp,
        quic=quic,
        summary=Summary(
            pods=len(pods), udp_services=len(udp.services), tcp_services=len(tcp.services), unsupported_shapes=shapes
        ),
    )
