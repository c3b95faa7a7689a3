"""One node's MeshNode status from its pods and the results of the namespaces it depends on (pure).

A node's dependency set is the namespaces its meshed pods may dial: each pod namespace's
`mesh.aether.dev/egress` annotation (comma-separated namespaces; absent or `*` = every mesh namespace),
plus the pod's own namespace, restricted to mesh namespaces."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from aether.naming import DEFAULT_TRUST_DOMAIN, spiffe_id
from aether.operator.meshnode import Condition, L4Status, MeshNodeStatus, MeshPod, QuicStatus, Summary

from .namespace import NamespaceResult
from .views import NamespaceView, PodView


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
    identities = sorted({spiffe_id(p.namespace, p.service_account, trust_domain) for p in pods if p.running})
    quic = QuicStatus(
        identities=identities,
        destinations=[d for r in rs for d in r.destinations],
        ineligible=[i for r in rs for i in r.ineligible],
    )
    shapes = len(udp.unsupported_shapes) + len(tcp.unsupported_shapes)
    conditions = [
        Condition(
            type="Ready",
            status="True",
            reason="Reconciled",
            message=f"{len(pods)} pods, {len(udp.services)} UDP and {len(tcp.services)} TCP arms",
        ),
        Condition(
            type="Degraded",
            status="True" if shapes else "False",
            reason="UnsupportedShapes" if shapes else "AsExpected",
            message=f"{shapes} unsupported shapes (see udp/tcp.unsupportedShapes)" if shapes else "",
        ),
    ]
    return MeshNodeStatus(
        conditions=conditions,
        pods=[
            MeshPod(
                uid=p.uid or f"{p.namespace}/{p.name}",
                namespace=p.namespace,
                name=p.name,
                ip=p.ip,
                service_account=p.service_account,
            )
            for p in pods
        ],
        udp=udp,
        tcp=tcp,
        quic=quic,
        summary=Summary(
            pods=len(pods), udp_services=len(udp.services), tcp_services=len(tcp.services), unsupported_shapes=shapes
        ),
    )
