"""Names that the operator, the xds sidecar and Envoy must agree on: clusters, SPIFFE IDs, mesh hostnames."""

from __future__ import annotations

import re
from typing import Final, NamedTuple

DEFAULT_TRUST_DOMAIN: Final = "cluster.local"
DEFAULT_MESH_DOMAIN: Final = "mesh.aether.internal"
BLACKHOLE_CLUSTER: Final = "blackhole"
QUIC_TWIN_PREFIX: Final = "quic:"


def ref(namespace: str, name: str) -> str:
    """`<namespace>/<name>`: how status fields name a namespaced object."""
    return f"{namespace}/{name}"


def udp_cluster(namespace: str, service: str) -> str:
    return f"udp:{namespace}/{service}"


def in_family(cluster: str, family: str) -> str:
    """The cluster of one IP family (`IPv4` or `IPv6`, the API's spelling): a cluster carries one family's endpoints,
    so a dual-stack Service's two VIPs name two clusters. IPv4's keeps the plain name (`udp:<ns>/<svc>`), IPv6's is
    `<name>@ipv6`: a name never depends on which family a Service lists first, so a backend's cluster is one
    whichever parent points at it."""
    return cluster if family == "IPv4" else f"{cluster}@{family.lower()}"


def udp_split_cluster(namespace: str, service: str) -> str:
    """The cluster of a weighted UDP arm: the parent Service's own, one locality per backendRef."""
    return f"udp-split:{namespace}/{service}"


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


class QuicTwinName(NamedTuple):
    """A twin name taken apart: the destination `<namespace>/<service>` and the source `<source ns>/<source sa>`."""

    namespace: str
    service: str
    source_namespace: str
    source_sa: str


_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # namespaces and Services: DNS-1123 labels
_SUBDOMAIN: Final = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?")  # ServiceAccounts: DNS-1123 subdomains


def parse_quic_twin(name: str) -> QuicTwinName:
    """The inverse of `quic_twin`: `quic:<ns>/<svc>@<sa>` or `quic:<ns>/<svc>@<source ns>/<sa>`; ValueError for
    anything `quic_twin` cannot produce (another shape, a part that is not a Kubernetes name, or the long spelling
    for a same-namespace source): `quic_twin(t.namespace, t.service, t.source_sa, t.source_namespace) == n` for
    `t = parse_quic_twin(n)`."""
    if not name.startswith(QUIC_TWIN_PREFIX):
        raise ValueError(f"{name!r}: not a twin name (expected {QUIC_TWIN_PREFIX}<ns>/<svc>@[<source ns>/]<sa>)")
    dest, at, source = name[len(QUIC_TWIN_PREFIX) :].partition("@")
    namespace, _, service = dest.partition("/")
    source_namespace, slash, source_sa = source.rpartition("/")
    if not slash:
        source_namespace = namespace
    elif source_namespace == namespace:
        raise ValueError(f"{name!r}: a same-namespace source is spelled @<sa>, not @<ns>/<sa>")
    if not (at and _LABEL.fullmatch(namespace) and _LABEL.fullmatch(service) and _LABEL.fullmatch(source_namespace)):
        raise ValueError(f"{name!r}: not a twin name (expected {QUIC_TWIN_PREFIX}<ns>/<svc>@[<source ns>/]<sa>)")
    if not _SUBDOMAIN.fullmatch(source_sa):
        raise ValueError(f"{name!r}: {source_sa!r} is not a ServiceAccount name")
    return QuicTwinName(namespace, service, source_namespace, source_sa)


def spiffe_id(namespace: str, service_account: str, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> str:
    return f"spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}"


def mesh_host(namespace: str, service: str, mesh_domain: str = DEFAULT_MESH_DOMAIN) -> str:
    """What a pod dials: `<svc>.<ns>.<mesh-domain>`."""
    return f"{service}.{namespace}.{mesh_domain}"


def quic_sni(port: int, dest_sa: str, namespace: str, mesh_domain: str = DEFAULT_MESH_DOMAIN) -> str:
    """QUIC SNI `<port>.<dest sa>.<ns>.<mesh-domain>`: built from the ServiceAccount (the QUIC client checks the
    server leaf's DNS SANs `<sa>.<ns>.<domain>` / `*.<sa>.<ns>.<domain>` against it)."""
    return f"{port}.{dest_sa}.{namespace}.{mesh_domain}"
