"""The MeshNode model: one per Kubernetes node, the node's desired state in `status`.

This *is* the CRD schema (crds/ is generated from it). The operator writes everything in `status` except
`status.quic.pairs` and `status.quic.dormantPairs`, which only the node's xds sidecar writes. Field names
are camelCase on the wire (aliases) and snake_case in Python.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

API_GROUP = "mesh.aether.dev"
API_VERSION = "v1alpha1"
KIND = "MeshNode"
PLURAL = "meshnodes"
BLACKHOLE_CLUSTER = "blackhole"  # same as aether.api.naming.BLACKHOLE_CLUSTER
UdpDataplane = Literal["envoy", "kernel"]  # a UDP arm's data path (docs/operations.md#the-udp-data-path)
UDP_DATAPLANES: tuple[UdpDataplane, ...] = ("envoy", "kernel")


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_assignment=False
    )

    def wire(self) -> dict[str, Any]:
        """The JSON-ready form with camelCase keys, as stored in the API."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class Condition(_Model):
    type: Literal["Ready", "Programmed", "Degraded"] | str
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(min_length=1)
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class MeshPod(_Model):
    uid: str = Field(min_length=1)
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    ip: str | None = None
    service_account: str = "default"
    ips: list[str] = Field(
        default_factory=list,
        exclude_if=lambda v: len(v) < 2,
        description="every address of the pod (status.podIPs: one per IP family, the first is `ip`); written only "
        "when the pod has more than one, so a single-stack pod's entry is as before (readers: `ips` or [`ip`])",
    )

    @property
    def addresses(self) -> list[str]:
        """Every address of the pod, `ip` first."""
        return list(self.ips) or ([self.ip] if self.ip else [])


class Endpoint(_Model):
    ip: str
    port: int = Field(ge=1, le=65535)
    draining: bool = Field(
        default=False,
        exclude_if=lambda v: not v,
        description="true: terminating but still serving (EndpointSlice conditions serving and terminating) while "
        "the Service has a ready endpoint: no new flow picks it, flows on it move at their next datagram; absent: "
        "ready",
    )


class ArmBackend(_Model):
    """One backendRef of a weighted arm: the share of new sessions it takes (udp_proxy picks a backend once per
    session, by weight; the datagrams of one session all go to that backend)."""

    backend: str = Field(description="<namespace>/<name> of the backend Service, as the backendRef names it")
    weight: int = Field(ge=0, description="the backendRef's weight")
    share: float = Field(ge=0, le=100, description="percent of new sessions: weight / the sum of the arm's weights")
    endpoints: list[Endpoint] = Field(default_factory=list)
    reason: str | None = Field(
        default=None,
        description="why this backend takes no new session: Drained (weight 0: existing sessions finish), or the "
        "ResolvedRefs reason of an invalid backendRef (BackendNotFound, RefNotPermitted, InvalidKind, "
        "UnsupportedValue: its share is dropped, not given to the others)",
    )


class ServiceArm(_Model):
    """One matcher arm: a dialled VIP (on port 18082) -> the cluster that carries it."""

    service: str = Field(description="<namespace>/<name> of the Service dialled")
    vip: str = Field(description="the Service's ClusterIP: the arm's match key")
    cluster: str = Field(description="udp:<ns>/<svc> or tcp:<ns>/<svc> of the backend, or 'blackhole'")
    backend: str | None = Field(default=None, description="<namespace>/<name> of the Service traffic goes to")
    route: str | None = Field(default=None, description="<namespace>/<name> of the route that re-pointed it")
    endpoints: list[Endpoint] = Field(default_factory=list)
    reason: str | None = Field(default=None, description="why the arm is blackholed, e.g. NoHealthyBackend")
    backends: list[ArmBackend] | None = Field(
        default=None,
        description="a weighted split (a UDPRoute's backendRefs): the arm's own cluster spreads new sessions over "
        "these by weight; absent: the cluster is one backend's and `endpoints` are its (absent rather than empty, "
        "so plain arms cost no bytes in the status)",
    )
    idle_timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        description="UDP session idle timeout for this Service (annotation mesh.aether.dev/udp-idle-timeout); "
        "unset: the node's default",
    )
    dataplane: UdpDataplane | None = Field(
        default=None,
        description="the UDP data path pods take to this Service (annotation mesh.aether.dev/udp-dataplane): envoy "
        "(the node proxy) or kernel (nft rules in each client pod's netns); unset: the node's default "
        "(aether xds --udp-dataplane)",
    )


class UnsupportedShape(_Model):
    route: str = Field(description="<namespace>/<name> of the route or Service with the shape")
    reason: str
    discarded: list[str] = Field(default_factory=list)
    message: str = ""


class L4Status(_Model):
    services: list[ServiceArm] = Field(default_factory=list)
    unsupported_shapes: list[UnsupportedShape] = Field(default_factory=list)


_GUARD_NOTE = (
    "a MeshAuthorizationPolicy on the Service still guards these pods' inbound, so a pod that takes no traffic "
    "is never served open"
)


def _unwritten_when_empty(description: str) -> Any:
    """A list field that is left out of what is written while it is empty."""
    return Field(default_factory=list, exclude_if=lambda v: not v, description=description)


GatewayTransport = Literal["h3", "h2"]  # what an east-west gateway offers on 18009: HTTP/3 (UDP), h2 (TCP)


def both_transports() -> list[GatewayTransport]:
    return ["h3", "h2"]


class QuicDestination(_Model):
    service: str
    service_account: str
    ports: list[int] = Field(default_factory=list)
    endpoints: list[Endpoint] = Field(default_factory=list)
    unready_ips: list[str] = _unwritten_when_empty(
        "IPs of the Service's other endpoints (not ready, or terminating; on a dual-stack Service, those of the family "
        "after its primary one, since h2 and HTTP/3 dial a pod on its primary family's address) and of the pods its "
        "selector selects that no EndpointSlice lists: no traffic goes to them; " + _GUARD_NOTE
    )
    gateways: list[str] = _unwritten_when_empty(
        "addresses of the east-west gateways of the cluster the Service runs in, when that is not this one: sources "
        "reach it through them on TCP 18009, over h2 (no twin). The operator writes it for a ServiceImport from its "
        "MeshPeer's spec.gateways (docs/architecture.md#discovery-across-clusters)"
    )
    gateway_transports: list[GatewayTransport] = Field(
        default_factory=both_transports,
        min_length=1,
        exclude_if=lambda v: set(v) == {"h3", "h2"},
        description="what the gateways in `gateways` offer (their MeshPeer's spec.transports; written only when not "
        "both): without h3 the Service gets no QUIC twin, its sources reach it over h2 on TCP 18009",
    )
    exported: bool = Field(
        default=False,
        exclude_if=lambda v: not v,
        description="a ServiceExport names this Service: this cluster's east-west gateways export it (written only "
        "when true)",
    )


class IneligibleDestination(_Model):
    service: str
    reason: str
    ports: list[int] = _unwritten_when_empty("the Service's TCP ports")
    endpoint_ips: list[str] = _unwritten_when_empty(
        "IPs of every endpoint of the Service, whatever its conditions, and of every pod its selector selects: "
        + _GUARD_NOTE
    )


class PairEvidence(_Model):
    """Evidence that a request used a pair's twin (docs/pairs.md)."""

    kind: Literal["Fetch", "Resubscribe", "Held"] | str = Field(
        description="Fetch: an on-demand request for the twin; Resubscribe: a fresh proxy stream subscribed it by "
        "name; Held: a fresh stream said it holds the twin"
    )
    time: str = Field(description="when the sidecar saw it (RFC 3339, UTC)")


class QuicPair(_Model):
    """Sidecar-owned: a (source ServiceAccount, destination) pair that has dialled over HTTP/3, and its twin."""

    source: str = Field(description="the source's SPIFFE ID")
    destination: str = Field(description="<namespace>/<name> of the destination Service")
    twin: str = Field(description="the twin cluster: quic:<ns>/<svc>@<source sa>")
    since: str | None = Field(default=None, description="when the pair was admitted (RFC 3339, UTC)")
    evidence: str | None = Field(default=None, description="what admitted it: Fetch or Resubscribe")
    last_evidence: PairEvidence | None = Field(default=None, description="the last evidence of use")


class QuicStatus(_Model):
    identities: list[str] = Field(default_factory=list)
    destinations: list[QuicDestination] = Field(default_factory=list)
    ineligible: list[IneligibleDestination] = Field(default_factory=list)
    pairs: list[QuicPair] = Field(default_factory=list)
    dormant_pairs: list[QuicPair] = Field(default_factory=list)
    pair_count: int | None = Field(default=None, description="sidecar-owned: len(pairs), for printer columns")
    dormant_pair_count: int | None = Field(default=None, description="sidecar-owned: len(dormantPairs)")


class Summary(_Model):
    """Counts for `kubectl get meshnodes` printer columns (JSONPath cannot count a list). Per node, not per Service:
    a Service added elsewhere changes a slice, never every MeshNode's counts."""

    pods: int = 0
    namespaces: int = 0
    slices: int = 0


class ServiceSlices(_Model):
    """Which MeshServiceSlices (api/slices.py) hold the shared service tables this node depends on."""

    selector: str = Field(description="the slices of the namespaces below: kubectl get meshserviceslices -l '<this>'")
    namespaces: list[str] = Field(default_factory=list, description="the node's dependency set")
    names: list[str] = Field(default_factory=list, description="every slice in effect on this node")


class AuthorizationSummary(_Model):
    """Operator-owned: the MeshAuthorizationPolicies guarding this node's pods (aether.operator.policies)."""

    guarded_services: int = Field(default=0, description="Services with an endpoint here that a policy targets")
    policies: int = Field(default=0, description="the policies targeting them")
    not_accepted: int = Field(default=0, description="of those, the ones not Accepted (they allow nothing)")


class GatewayRole(_Model):
    """The operator's: this node's proxy plays the east-west gateway (its Node is labelled
    mesh.aether.dev/east-west-gateway=true) and exports the QUIC destinations a ServiceExport names (`exported`)."""

    address: str = Field(
        min_length=1,
        description="the node's InternalIP the gateway listens on (TCP and UDP 18009), which the "
        "other clusters' MeshPeers name",
    )


class MeshNodeStatus(_Model):
    """A MeshNode's status as the API stores it (the CRD's status schema): what is the node's own. Its service
    tables (UDP and TCP arms with their unsupported shapes, QUIC destinations) are in the MeshServiceSlices that
    `serviceSlices` names (api/slices.py); EffectiveStatus is this status with them inline."""

    conditions: list[Condition] = Field(default_factory=list)
    pods: list[MeshPod] = Field(default_factory=list)
    addresses: list[str] = _unwritten_when_empty(
        "the node's InternalIP addresses (Node status.addresses), of both IP families on a dual-stack node, in the "
        "kubelet's order"
    )
    quic: QuicStatus = Field(default_factory=QuicStatus)
    service_slices: ServiceSlices | None = None
    gateway: GatewayRole | None = None
    summary: Summary | None = None
    authorization: AuthorizationSummary | None = None
    observed_generation: int | None = None


class EffectiveStatus(MeshNodeStatus):
    """A node's whole desired state, its UDP and TCP tables inline: what the sidecar programs (api.slices.effective
    joins a MeshNode and the slices it names) and what a MeshNode state file may hold (`aether xds --state`: how
    tests and the demo drive the sidecar without a cluster). Not in the CRD: a MeshNode in the API has no `udp` or
    `tcp`, its tables are in the slices."""

    udp: L4Status = Field(default_factory=L4Status)
    tcp: L4Status = Field(default_factory=L4Status)


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)


class MeshObject(BaseModel):
    """An object of our API group and version (MeshNode, MeshServiceSlice, MeshAuthorizationPolicy): each adds its
    `kind`, `metadata`, `spec` and `status`, after `apiVersion`."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    api_version: Literal["mesh.aether.dev/v1alpha1"] = Field(default="mesh.aether.dev/v1alpha1", alias="apiVersion")

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class MeshNode(MeshObject):
    kind: Literal["MeshNode"] = "MeshNode"
    metadata: ObjectMeta
    spec: dict[str, Any] = Field(default_factory=dict)
    status: EffectiveStatus = Field(default_factory=EffectiveStatus)


# libyaml's C loader when present: a 1,000-service state file parses ~10x faster than with pure Python.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class MeshNodeFileError(ValueError):
    """A MeshNode file that cannot be used: names the file, the path of the bad field and why."""


def validation_problems(exc: ValidationError) -> list[str]:
    """Each error of a model's validation as `<field path>: <message>` (`<root>` for the object itself)."""
    return [f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()]


def parse_meshnode(data: Any, source: str = "<input>") -> MeshNode:
    try:
        return MeshNode.model_validate(data)
    except ValidationError as exc:
        raise MeshNodeFileError("; ".join(f"{source}: {p}" for p in validation_problems(exc))) from exc


def load_meshnode_file(path: str | Path) -> MeshNode:
    p = Path(path)
    data = read_document(p)
    if not isinstance(data, dict):
        raise MeshNodeFileError(f"{p}: <root>: expected a MeshNode object, got {type(data).__name__}")
    return parse_meshnode(data, str(p))


def read_document(p: Path) -> Any:
    """One YAML or JSON document (JSON when the name ends in .json), or a MeshNodeFileError saying why not."""
    try:
        text = p.read_text()
    except OSError as exc:
        raise MeshNodeFileError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.load(text, Loader=_YAML_LOADER)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise MeshNodeFileError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {exc}") from exc
    return data
