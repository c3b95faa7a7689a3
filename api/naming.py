"""Names that the operator, the xds sidecar and Envoy must agree on: clusters, SPIFFE IDs, mesh hostnames."""

from __future__ import annotations

from typing import Final

DEFAULT_TRUST_DOMAIN: Final = "cluster.local"
DEFAULT_MESH_DOMAIN: Final = "mesh.aether.internal"
BLACKHOLE_CLUSTER: Final = "blackhole"


def ref(namespace: str, name: str) -> str:
    """`<namespace>/<name>`: how status fields name a namespaced object."""
    return f"{namespace}/{name}"


def udp_cluster(namespace: str, service: str) -> str:
    return f"udp:{namespace}/{service}"


def tcp_cluster(namespace: str, service: str) -> str:
    return f"tcp:{namespace}/{service}"


def h2_cluster(namespace: str, service: str) -> str:
    return f"h2:{namespace}/{service}"


def quic_twin(namespace: str, service: str, source_sa: str, source_namespace: str | None = None) -> str:
    """The per-source QUIC twin of a destination: `quic:<ns>/<svc>@<source sa>` for a source ServiceAccount in the
    destination's namespace, `quic:<ns>/<svc>@<source ns>/<source sa>` for one in another namespace.

    One name per (source identity, destination): ServiceAccount names never hold a `/`, so the two spellings cannot
    meet, and `default` in two namespaces gets two twins."""
    if source_namespace is None or source_namespace == namespace:
        return f"quic:{namespace}/{service}@{source_sa}"
    return f"quic:{namespace}/{service}@{source_namespace}/{source_sa}"


def spiffe_id(namespace: str, service_account: str, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> str:
    return f"spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}"


def mesh_host(namespace: str, service: str, mesh_domain: str = DEFAULT_MESH_DOMAIN) -> str:
    """What a pod dials: `<svc>.<ns>.<mesh-domain>`."""
    return f"{service}.{namespace}.{mesh_domain}"


def quic_sni(port: int, dest_sa: str, namespace: str, mesh_domain: str = DEFAULT_MESH_DOMAIN) -> str:
    """QUIC SNI `<port>.<dest sa>.<ns>.<mesh-domain>`: built from the ServiceAccount (the QUIC client checks the
    server leaf's DNS SANs `<sa>.<ns>.<domain>` / `*.<sa>.<ns>.<domain>` against it)."""
    return f"{port}.{dest_sa}.{namespace}.{mesh_domain}"
