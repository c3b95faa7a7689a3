"""Discovery across clusters: the multicluster Services API's names (KEP-1645, sigs.k8s.io/mcs-api v0.5.0, whose
ServiceExport and ServiceImport CRDs are vendored unchanged in crds/mcs-api/) and our one resource beside it,
`MeshPeer` (docs/architecture.md#discovery-across-clusters).

A MeshPeer (cluster-scoped, named after the remote cluster as ServiceImport's `status.clusters[].cluster` names it)
says where that cluster's east-west gateways listen and which trust domain its workloads' SPIFFE IDs are in:

    apiVersion: mesh.aether.dev/v1alpha1
    kind: MeshPeer
    metadata: {name: cluster-a}
    spec:
      gateways: [192.0.2.10, 192.0.2.11]     # the exporting cluster's gateway nodes (TCP/UDP 18009)
      trustDomain: cluster.local              # optional: this cluster's own trust domain (a shared root)
      transports: [h2]                        # optional, default [h3, h2]: its gateways have no QUIC half

A ServiceImport (namespaced, the name and namespace of the exported Service) names its peer and the exported
Service's ServiceAccount in two annotations (KEP-1645 leaves how imports are made to the implementation); its
`spec.ports` (TCP) and `spec.type: ClusterSetIP` are upstream's. This *is* the MeshPeer CRD schema (crdgen).
"""

from __future__ import annotations

import ipaddress
from typing import Final, Literal

from pydantic import Field, field_validator

from aether.api.meshnode import API_GROUP, GatewayTransport, MeshObject, ObjectMeta, _Model, both_transports

MCS_GROUP: Final = "multicluster.x-k8s.io"
MCS_VERSION: Final = "v1beta1"  # v0.5.0 stores v1beta1 and still serves v1alpha1
SERVICE_EXPORTS: Final = "serviceexports"
SERVICE_IMPORTS: Final = "serviceimports"
SERVICE_IMPORT_KIND: Final = "ServiceImport"

PEER_KIND: Final = "MeshPeer"
PEER_PLURAL: Final = "meshpeers"
# on a ServiceImport: the MeshPeer (remote cluster) it comes from, and the exported Service's ServiceAccount (the
# SNI `<port>.<sa>.<ns>.<mesh domain>` and the pinned SPIFFE ID the source verifies come from it)
PEER_ANNOTATION: Final = f"{API_GROUP}/peer"
SERVICE_ACCOUNT_ANNOTATION: Final = f"{API_GROUP}/service-account"
# on a Node: its node proxy plays the east-west gateway (docs/architecture.md#the-east-west-gateway)
GATEWAY_NODE_LABEL: Final = f"{API_GROUP}/east-west-gateway"
MAX_GATEWAYS: Final = 16
# what a MeshPeer's gateways offer on 18009 when spec.transports is not given: HTTP/3 (UDP) and h2 (TCP)
TRANSPORTS: Final[tuple[GatewayTransport, ...]] = ("h3", "h2")

# ServiceExport conditions and reasons, as KEP-1645 / mcs-api v1beta1 name them
VALID, READY, CONFLICT = "Valid", "Ready", "Conflict"
REASON_VALID, NO_SERVICE, INVALID_SERVICE_TYPE = "Valid", "NoService", "InvalidServiceType"
EXPORTED, PENDING, NO_CONFLICT = "Exported", "Pending", "NoConflict"
# ServiceImport Ready reasons: upstream's Ready/Pending, and ours for what makes an import unusable
UNKNOWN_PEER, NO_PORTS, NO_SERVICE_ACCOUNT, NO_PEER, LOCAL_SERVICE, INVALID_TYPE = (
    "UnknownPeer",
    "NoPorts",
    "NoServiceAccount",
    "NoPeer",
    "LocalService",
    "UnsupportedType",
)


class PeerSpec(_Model):
    gateways: list[str] = Field(
        min_length=1,
        max_length=MAX_GATEWAYS,
        description="IP addresses of the remote cluster's east-west gateways (its gateway nodes), reached on 18009",
    )
    trust_domain: str | None = Field(
        default=None,
        min_length=1,
        description="the remote cluster's SPIFFE trust domain; only this cluster's own is accepted (one trust "
        "domain with a shared root; federation is docs/architecture.md's design, not built)",
    )

    transports: list[GatewayTransport] = Field(
        default_factory=both_transports,
        min_length=1,
        max_length=2,
        description="what the remote gateways offer on 18009: h2 (TCP, always) and h3 (UDP, their QUIC half); "
        "without h3 sources reach the peer's Services over h2 only (no QUIC twin)",
    )

    @field_validator("transports")
    @classmethod
    def _h2_always(cls, value: list[str]) -> list[str]:
        if "h2" not in value:
            raise ValueError("h2 must be listed: every east-west gateway serves TCP 18009")
        return value

    @field_validator("gateways")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for g in value:
            ipaddress.ip_address(g)  # ValueError -> a validation problem
        return value


class MeshPeer(MeshObject):
    kind: Literal["MeshPeer"] = "MeshPeer"
    metadata: ObjectMeta
    spec: PeerSpec
