"""What the east-west builders work from, extracted from the MeshNode and the pod records (pure).

- local pods: listed in the MeshNode with an IP *and* with a CNI record (the netns to bind into);
- destinations: `status.quic.destinations`, with the VIP taken from the service's L4 arm when it has one;
- identities: the local pods' SPIFFE IDs (those are the sources; `status.quic.identities` is the operator's copy);
- the pair environment (`pair_environment`): what the pair machine checks a twin name against, from the same parts
  (sources: `<ns>/<sa>` of the local pods; destinations: the QUIC destinations; ineligible: `status.quic.ineligible`);
- twin pairs (`twin_pairs`): the (destination, source SPIFFE ID) pairs whose twin is built: `status.quic.pairs`
  (the sidecar puts its machine's published pairs there) whose source is local and destination listed.

- guarded Services (`guarded`): every Service a MeshAuthorizationPolicy can target on a local pod: each QUIC
  destination with its endpoints and its `unreadyIps`, and each ineligible one with its `endpointIps` (a pod that
  takes no traffic, because it is not ready, terminating, or its Service is ineligible, is still guarded).

Application ports of a local pod (the inbound routes to them): the ports of every guarded Service whose IPs
include the pod's IP, else `EastWestOptions.app_ports[pod uid]`, else `EastWestOptions.default_app_ports`. The
MeshNode has no per-pod port list yet; the first port is the primary one (the default route).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from aether.api.meshnode import MeshNode
from aether.api.naming import parse_quic_twin, ref, spiffe_id
from aether.netns.contract import EAST_WEST_PORT, INBOUND_PORT
from aether.netns.records import PodRecord
from aether.xds.pairs.values import Environment


@dataclass(frozen=True)
class EastWestOptions:
    """Knobs of the east-west builders (beside `TranslateOptions`' mesh and trust domains)."""

    quic: bool = True  # build twins (False: every destination over h2, "twin absent")
    default_app_ports: tuple[int, ...] = (8080,)
    app_ports: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # by pod uid
    prefer_gro: bool = True
    access_log_json: bool = True  # the inbound's JSON access log on Envoy's stdout (docs/operations.md)
    access_log_path: str | None = None  # a text log file besides (tests log %PROTOCOL% here); None: none
    odcds_timeout_s: float = 2.0
    connect_timeout_s: float = 2.0
    # How long a source's connection to a destination (its h2 pool's, its twin's) may carry no request before it
    # closes (the clusters' HTTP idle_timeout; Envoy's own default is an hour). The h2 pools are per source identity,
    # so a ServiceAccount's connections outlive its last pod until this fires (docs/architecture.md).
    idle_timeout_s: float = 300.0
    # Where SDS secrets, EDS and RDS come from: ADS unless a test points them elsewhere.
    config_source: Mapping[str, Any] | None = None
    # Only the negative control of the identity-leak gate changes this; aether.xds.gates.quic rejects anything else.
    identity_factory: str = "envoy.hashable_string"
    http_outbound_route: str = "http-outbound"
    # Services of another cluster (`<ns>/<svc>` -> that cluster's east-west gateway addresses): reached through
    # its gateway (`through_gateways`): h2 on TCP 18009, each source's QUIC twin on UDP 18009. A minimal model:
    # discovery across clusters (which Services, which gateway) is not built here (docs/limits.md).
    remote_gateways: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class LocalPod:
    uid: str
    namespace: str
    name: str
    service_account: str
    ip: str
    netns: str
    identity: str  # its SPIFFE ID
    app_ports: tuple[int, ...]
    ips: tuple[str, ...] = ()  # every address of the pod (`ip` first: one per IP family), () when only `ip`

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every address of the pod, `ip` first."""
        return self.ips or (self.ip,)


@dataclass(frozen=True)
class Destination:
    namespace: str
    service: str
    service_account: str
    identity: str
    ports: tuple[int, ...]
    endpoints: tuple[tuple[str, int], ...]
    vip: str | None
    gateways: tuple[str, ...] = ()  # the east-west gateways it is reached through (another cluster); () here
    h3: bool = True  # HTTP/3 reaches it: False when its gateways offer h2 only (no QUIC half), so no twin

    @property
    def primary_port(self) -> int:
        return self.ports[0] if self.ports else 80


@dataclass(frozen=True)
class Guarded:
    """A Service whose policies guard the inbound of the pods at `ips` (its endpoints, whatever their conditions)."""

    namespace: str
    service: str
    ports: tuple[int, ...]
    ips: frozenset[str]


def _split(ref: str) -> tuple[str, str]:
    ns, _, name = ref.partition("/")
    if not ns or not name:
        raise ValueError(f"{ref!r}: expected <namespace>/<name>")
    return ns, name


def destinations(node: MeshNode, trust_domain: str) -> list[Destination]:
    vips: dict[str, str] = {}
    for arm in (*node.status.tcp.services, *node.status.udp.services):
        vips.setdefault(arm.service, arm.vip)
    out = []
    for d in sorted(node.status.quic.destinations, key=lambda d: d.service):
        ns, svc = _split(d.service)
        out.append(
            Destination(
                namespace=ns,
                service=svc,
                service_account=d.service_account,
                identity=spiffe_id(ns, d.service_account, trust_domain),
                ports=tuple(d.ports),
                endpoints=tuple((e.ip, e.port or INBOUND_PORT) for e in d.endpoints),
                vip=vips.get(d.service),
                gateways=tuple(d.gateways),
                h3=not d.gateways or "h3" in d.gateway_transports,
            )
        )
    return out


def through_gateways(dests: Sequence[Destination], remote: Mapping[str, tuple[str, ...]]) -> list[Destination]:
    """`dests` with every remote one's endpoints replaced by its gateways on `EAST_WEST_PORT`: the source's TLS
    (SNI, the destination's pinned SPIFFE ID, its own SVID) is unchanged, only the address it dials moves. Remote:
    named in `remote` (`EastWestOptions.remote_gateways`, which wins), or carrying `gateways` from the MeshNode
    (`status.quic.destinations[].gateways`). A remote Service not among `dests` is not invented: its SNI and
    ServiceAccount come from the destination entry. Its `h3` stays the destination entry's (a gateway offering h2
    only: `gateway_transports`)."""
    out = []
    for d in dests:
        gateways = remote.get(ref(d.namespace, d.service)) or d.gateways
        if gateways:
            d = replace(d, endpoints=tuple((g, EAST_WEST_PORT) for g in gateways), gateways=tuple(gateways))
        out.append(d)
    return out


def guarded(node: MeshNode) -> list[Guarded]:
    """The destinations (endpoints and unready IPs), then the ineligible Services (every endpoint IP), in order."""
    out = []
    for d in sorted(node.status.quic.destinations, key=lambda d: d.service):
        ns, svc = _split(d.service)
        out.append(Guarded(ns, svc, tuple(d.ports), frozenset([*(e.ip for e in d.endpoints), *d.unready_ips])))
    for i in sorted(node.status.quic.ineligible, key=lambda i: i.service):
        ns, _, svc = i.service.partition("/")
        if i.endpoint_ips and ns and svc:  # a name no policy can target guards nothing
            out.append(Guarded(ns, svc, tuple(i.ports), frozenset(i.endpoint_ips)))
    return out


def local_pods(
    node: MeshNode,
    records: Mapping[str, PodRecord],
    trust_domain: str,
    options: EastWestOptions,
    services: Sequence[Guarded] | None = None,
) -> list[LocalPod]:
    """`services`: `guarded(node)`, when the caller has it already."""
    ports_by_ip: dict[str, list[int]] = {}  # the ports of every guarded Service an IP backs, in order
    for g in guarded(node) if services is None else services:
        for addr in sorted(g.ips):
            seen = ports_by_ip.setdefault(addr, [])
            seen += [p for p in g.ports if p not in seen]
    out = []
    for pod in sorted(node.status.pods, key=lambda p: (p.namespace, p.name)):
        rec = records.get(pod.uid)
        ip = pod.ip or (rec.ips[0] if rec and rec.ips else None)
        if rec is None or not ip:
            continue
        addresses = tuple(dict.fromkeys([ip, *pod.addresses]))
        ports = next((list(ports_by_ip[a]) for a in addresses if a in ports_by_ip), [])
        if not ports:
            ports = list(options.app_ports.get(pod.uid, options.default_app_ports))
        out.append(
            LocalPod(
                uid=pod.uid,
                namespace=pod.namespace,
                name=pod.name,
                service_account=pod.service_account,
                ip=ip,
                netns=rec.netns,
                identity=spiffe_id(pod.namespace, pod.service_account, trust_domain),
                app_ports=tuple(ports),
                ips=addresses if len(addresses) > 1 else (),
            )
        )
    return out


def identities(pods: list[LocalPod]) -> list[str]:
    return sorted({p.identity for p in pods})


def pair_environment(pods: list[LocalPod], dests: list[Destination], node: MeshNode) -> Environment:
    return Environment(
        sources=frozenset(ref(p.namespace, p.service_account) for p in pods),
        destinations=frozenset(ref(d.namespace, d.service) for d in dests),
        ineligible=frozenset(i.service for i in node.status.quic.ineligible),
    )


def twin_pairs(
    node: MeshNode, pods: list[LocalPod], dests: list[Destination], twins: Iterable[str] | None = None
) -> list[tuple[Destination, str]]:
    """(destination, source SPIFFE ID) for every listed pair the node can serve, sorted by twin; a pair whose twin
    name does not parse, whose source or destination is not here, or whose destination HTTP/3 cannot reach (`h3`:
    a remote gateway without its QUIC half), builds nothing. `twins`: these twin names
    instead of the ones `status.quic.pairs` lists."""
    by_ref = {ref(d.namespace, d.service): d for d in dests}
    local = {ref(p.namespace, p.service_account): p.identity for p in pods}
    out: dict[str, tuple[Destination, str]] = {}
    for twin in (p.twin for p in node.status.quic.pairs) if twins is None else twins:
        try:
            t = parse_quic_twin(twin)
        except ValueError:
            continue
        dest, source = by_ref.get(ref(t.namespace, t.service)), local.get(ref(t.source_namespace, t.source_sa))
        if dest is not None and source is not None and dest.h3:
            out[twin] = (dest, source)
    return [out[t] for t in sorted(out)]
