"""Typed, minimal views of the cluster objects the operator reads, parsed tolerantly from raw API bodies.

Parsing never raises: a field that cannot be used becomes a `problems` entry on the view, so a hostile object
gets a condition saying why instead of crashing the operator."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from aether.api.addresses import unroutable_vip
from aether.api.meshnode import UDP_DATAPLANES, UdpDataplane
from aether.api.multicluster import GATEWAY_NODE_LABEL

MESH_LABEL = "mesh.aether.dev/enabled"
EGRESS_ANNOTATION = "mesh.aether.dev/egress"
# a Service's own UDP session idle timeout (docs/operations.md): a duration such as 5s, 500ms, 2m, 1m30s
UDP_IDLE_TIMEOUT_ANNOTATION = "mesh.aether.dev/udp-idle-timeout"
UDP_IDLE_TIMEOUT_BOUNDS = (1.0, 86_400.0)  # seconds: shorter churns sessions under a slow reply; a day at most
UDP_DATAPLANE_ANNOTATION = "mesh.aether.dev/udp-dataplane"  # envoy | kernel (docs/operations.md)
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
GATEWAY_GROUP = "gateway.networking.k8s.io"
# Our own bounds, the v1alpha2 UDPRoute CRD's (16 rules x 16 backendRefs, 32 parentRefs): a route the CRD admits is
# never refused for its size; one beyond them (a server without the schema) is refused naming the number.
MAX_BACKEND_REFS = 256
MAX_PARENT_REFS = 32

Raw = dict[str, Any]


def _d(value: Any) -> Raw:
    return value if isinstance(value, dict) else {}


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _s(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _meta(obj: Raw) -> Raw:
    return _d(obj.get("metadata"))


def _ip(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return None


def family_of(ip: str) -> str:
    """`IPv4` or `IPv6`: the API's spelling of an address's family (Service ipFamilies, EndpointSlice addressType)."""
    return "IPv6" if ":" in ip else "IPv4"


def _ips(values: Any, key: str | None = None) -> tuple[str, ...]:
    """The valid, distinct IPs of a list (of strings, or of objects holding one under `key`), in order."""
    out: list[str] = []
    for v in _l(values):
        ip = _ip(_d(v).get(key) if key is not None else v)
        if ip is not None and ip not in out:
            out.append(ip)
    return tuple(out)


def _port(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535 else None


@dataclass(frozen=True, slots=True)
class NamespaceView:
    name: str
    meshed: bool
    egress: frozenset[str] | None  # None: every mesh namespace
    uid: str = ""  # the owner of the namespace's MeshServiceSlices


def parse_namespace(obj: Raw) -> NamespaceView:
    meta = _meta(obj)
    labels, annotations = _d(meta.get("labels")), _d(meta.get("annotations"))
    egress_raw = annotations.get(EGRESS_ANNOTATION)
    egress: frozenset[str] | None = None
    if isinstance(egress_raw, str) and egress_raw.strip() not in ("", "*"):
        egress = frozenset(p.strip() for p in egress_raw.split(",") if p.strip())
    return NamespaceView(
        str(meta.get("name", "")), labels.get(MESH_LABEL) == "true", egress, str(meta.get("uid") or "")
    )


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    uid: str
    addresses: tuple[str, ...] = ()  # status.addresses of type InternalIP, both families, in the kubelet's order
    gateway: str | None = None  # the address its proxy plays the east-west gateway on (_gateway_address)


def parse_node(obj: Raw) -> NodeView:
    meta = _meta(obj)
    internal = [a for a in _l(_d(obj.get("status")).get("addresses")) if _d(a).get("type") == "InternalIP"]
    return NodeView(
        str(meta.get("name", "")), str(meta.get("uid", "")), _ips(internal, "address"), gateway=_gateway_address(obj)
    )


def _gateway_address(obj: Raw) -> str | None:
    """The node's first InternalIP when it is labelled mesh.aether.dev/east-west-gateway=true (its proxy plays the
    east-west gateway there), else None; a labelled node without an InternalIP plays no gateway."""
    if _d(_meta(obj).get("labels")).get(GATEWAY_NODE_LABEL) != "true":
        return None
    for a in _l(_d(obj.get("status")).get("addresses")):
        if _d(a).get("type") == "InternalIP" and (ip := _ip(_d(a).get("address"))) is not None:
            return ip
    return None


@dataclass(frozen=True, slots=True)
class PodView:
    uid: str
    namespace: str
    name: str
    node: str | None
    ip: str | None
    service_account: str
    phase: str
    host_network: bool
    labels: frozenset[tuple[str, str]] = frozenset()  # metadata.labels: what Service selectors match
    ips: tuple[str, ...] = ()  # status.podIPs (one per family; the first is podIP), or (podIP,) without them

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def running(self) -> bool:
        return self.phase == "Running"

    @property
    def placed(self) -> bool:
        """On a node, in its own netns and not finished: the node proxy serves it."""
        return bool(self.node) and not self.host_network and self.phase not in ("Succeeded", "Failed")


def parse_pod(obj: Raw) -> PodView:
    meta, spec, status = _meta(obj), _d(obj.get("spec")), _d(obj.get("status"))
    sa = _s(spec.get("serviceAccountName")) or _s(spec.get("serviceAccount")) or "default"
    ip = _ip(status.get("podIP"))
    ips = _ips(status.get("podIPs"), "ip") or ((ip,) if ip else ())
    return PodView(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node=_s(spec.get("nodeName")),
        ip=ip or (ips[0] if ips else None),
        service_account=sa,
        phase=str(status.get("phase") or "Pending"),
        host_network=spec.get("hostNetwork") is True,
        labels=_labels(meta.get("labels")),
        ips=ips,
    )


def _labels(value: Any) -> frozenset[tuple[str, str]]:
    """A label map (or a Service's `spec.selector`) as a set of pairs; entries that are not strings are dropped."""
    return frozenset((k, v) for k, v in _d(value).items() if isinstance(k, str) and isinstance(v, str))


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_idle_timeout(value: Any) -> tuple[float | None, str | None]:
    """The annotation's value -> (seconds, None), or (None, why it is refused). A duration as Kubernetes and Go
    spell them: one or more <number><unit>, units ms, s, m, h (`5s`, `500ms`, `1m30s`), within
    UDP_IDLE_TIMEOUT_BOUNDS."""
    where = f"annotation {UDP_IDLE_TIMEOUT_ANNOTATION}"
    if not isinstance(value, str) or not value.strip():
        return None, f"{where} {value!r} is not a duration (e.g. 5s, 500ms, 2m)"
    text = value.strip()
    pos, total = 0, 0.0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            return None, f"{where} {value!r} is not a duration (e.g. 5s, 500ms, 2m; units ms, s, m, h)"
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    low, high = UDP_IDLE_TIMEOUT_BOUNDS
    if not low <= total <= high:
        return None, f"{where} {value!r} is outside {low:g}s..{high:g}s"
    return round(total, 3), None


def parse_dataplane(annotations: Raw) -> tuple[UdpDataplane | None, str | None]:
    """UDP_DATAPLANE_ANNOTATION -> (envoy or kernel, None); (None, None) when absent; (None, why it is refused)."""
    value = annotations.get(UDP_DATAPLANE_ANNOTATION)
    text = value.strip().lower() if isinstance(value, str) else value
    found = next((c for c in UDP_DATAPLANES if c == text), None)
    if value is None or found is not None:
        return found, None
    return None, f"annotation {UDP_DATAPLANE_ANNOTATION} {value!r} is not one of {', '.join(UDP_DATAPLANES)}"


@dataclass(frozen=True, slots=True)
class ServicePort:
    name: str
    port: int
    protocol: str


@dataclass(frozen=True, slots=True)
class ServiceView:
    namespace: str
    name: str
    cluster_ip: str | None
    ports: tuple[ServicePort, ...]
    problems: tuple[str, ...] = ()
    created: str = ""  # creationTimestamp: of two Services with one ClusterIP the older keeps it
    bad_vip: bool = False  # spec.clusterIP is set but unusable (a problem says why): not headless
    udp_idle_timeout_s: float | None = None  # UDP_IDLE_TIMEOUT_ANNOTATION; None: the node's default
    idle_timeout_problem: str | None = None  # the annotation is set but refused (the arm keeps the default)
    external_name: str | None = None  # spec.externalName of a type ExternalName Service (a DNS alias, no ClusterIP)
    # spec.selector: empty means selector-less (its EndpointSlices are written by someone else), as the API says
    selector: frozenset[tuple[str, str]] = frozenset()
    # spec.clusterIPs: one VIP per family, the primary (ipFamilies[0], = cluster_ip) first; one arm each
    cluster_ips: tuple[str, ...] = ()
    ip_family_policy: str | None = None  # SingleStack, PreferDualStack or RequireDualStack
    udp_dataplane: UdpDataplane | None = None  # UDP_DATAPLANE_ANNOTATION; None: the node's default
    dataplane_problem: str | None = None  # the annotation is set but refused (the arm keeps the node's default)

    @property
    def vips(self) -> tuple[str, ...]:
        """Every VIP of the Service, primary first (an object with clusterIP only has that one)."""
        return self.cluster_ips or ((self.cluster_ip,) if self.cluster_ip else ())

    def selects(self, pod: PodView) -> bool:
        """Whether the Service's selector matches `pod` (same namespace, every selector label on the pod)."""
        return bool(self.selector) and pod.namespace == self.namespace and self.selector <= pod.labels

    @property
    def no_vip(self) -> str:
        """Why a Service without a ClusterIP has none, in words: headless, or an ExternalName alias."""
        if self.external_name is not None:
            return f"ExternalName Service (a DNS alias of {self.external_name or '?'}): no ClusterIP, no VIP to match"
        return "headless Service: no VIP to match"

    @property
    def order(self) -> tuple[str, str, str]:
        """Who keeps a duplicated ClusterIP: the oldest Service, ties by namespace/name."""
        return (self.created, self.namespace, self.name)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def ports_of(self, protocol: str) -> tuple[ServicePort, ...]:
        """Ports of one protocol, ordered by name then number (the first is the one an arm uses)."""
        return tuple(sorted((p for p in self.ports if p.protocol == protocol), key=lambda p: (p.name, p.port)))


def _cluster_ips(spec: Raw, problems: list[str]) -> tuple[tuple[str, ...], bool]:
    """spec.clusterIPs (spec.clusterIP alone on a server or object without them) -> (the usable VIPs, primary first,
    at most one per family; whether one is set but unusable). `None` and empty are headless, not a problem."""
    raw = _l(spec.get("clusterIPs")) or [spec.get("clusterIP")]
    vips: list[str] = []
    bad = False
    for i, value in enumerate(raw):
        where = f"spec.clusterIPs[{i}]" if i else "spec.clusterIP"  # the API keeps clusterIPs[0] == clusterIP
        ip = _ip(value)
        if value in (None, "", "None"):
            continue
        if ip is None:
            problems.append(f"{where} {value!r} is not an IP address")
            bad = True
        elif (why := unroutable_vip(ip)) is not None:
            problems.append(f"{where} {value!r} is {why}: no pod can dial it as a Service VIP")
            bad = True
        elif any(family_of(v) == family_of(ip) for v in vips):
            problems.append(f"{where} {value!r}: a second {family_of(ip)} ClusterIP (one per family)")
        else:
            vips.append(ip)
    return tuple(vips), bad


def parse_service(obj: Raw) -> ServiceView:
    meta, spec = _meta(obj), _d(obj.get("spec"))
    problems: list[str] = []
    cluster_ips, bad_vip = _cluster_ips(spec, problems)
    ports = []
    for i, p in enumerate(_l(spec.get("ports"))):
        p = _d(p)
        number = _port(p.get("port"))
        protocol = p.get("protocol", "TCP")
        if number is None:
            problems.append(f"spec.ports[{i}].port {p.get('port')!r} is not a port number")
            continue
        if protocol not in ("TCP", "UDP", "SCTP"):
            problems.append(f"spec.ports[{i}].protocol {protocol!r} is not TCP, UDP or SCTP")
            continue
        ports.append(ServicePort(str(p.get("name") or ""), number, protocol))
    idle_s, idle_problem = None, None
    annotations = _d(meta.get("annotations"))
    if UDP_IDLE_TIMEOUT_ANNOTATION in annotations:
        idle_s, idle_problem = parse_idle_timeout(annotations[UDP_IDLE_TIMEOUT_ANNOTATION])
    plane, plane_problem = parse_dataplane(annotations)
    return ServiceView(
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        cluster_ips[0] if cluster_ips and not bad_vip else None,
        tuple(ports),
        tuple(problems),
        str(meta.get("creationTimestamp") or ""),
        bad_vip,
        idle_s,
        idle_problem,
        str(spec.get("externalName") or "") if spec.get("type") == "ExternalName" else None,
        _labels(spec.get("selector")) if spec.get("type") != "ExternalName" else frozenset(),
        cluster_ips if not bad_vip else (),
        _s(spec.get("ipFamilyPolicy")),
        plane,
        plane_problem,
    )


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    """One address of an EndpointSlice endpoint, with its conditions as the API defines them: `ready` absent is
    ready; `serving` absent defers to `ready`; `terminating` absent is false."""

    ip: str
    ready: bool
    pod: str | None  # targetRef Pod name (same namespace)
    serving: bool = False
    terminating: bool = False

    @property
    def draining(self) -> bool:
        """Terminating but still serving (its pod got SIGTERM and answers until it exits): no new flow should pick
        it, the ones on it finish."""
        return not self.ready and self.serving and self.terminating


@dataclass(frozen=True, slots=True)
class SliceView:
    namespace: str
    name: str
    service: str | None
    ports: tuple[ServicePort, ...]
    endpoints: tuple[SliceEndpoint, ...]
    # addressType: IPv4 or IPv6 (the EndpointSlice controller writes one slice per family of the pods' podIPs);
    # FQDN, or a type the operator does not know, holds no endpoint it can use (the Service's shapes say so);
    # "" (not set: an object no API server validated): its IPs of either family
    address_type: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def holds_ips(self) -> bool:
        return self.address_type in ("", "IPv4", "IPv6")


def parse_slice(obj: Raw) -> SliceView:
    meta = _meta(obj)
    address_type = _s(obj.get("addressType")) or ""
    ports = []
    for p in _l(obj.get("ports")):
        p = _d(p)
        number = _port(p.get("port"))
        if number is not None:
            ports.append(ServicePort(str(p.get("name") or ""), number, str(p.get("protocol") or "TCP")))
    endpoints = []
    for e in _l(obj.get("endpoints")):
        e = _d(e)
        conditions = _d(e.get("conditions"))
        ready = conditions.get("ready") is not False
        serving = ready if conditions.get("serving") is None else conditions.get("serving") is True
        terminating = conditions.get("terminating") is True
        ref = _d(e.get("targetRef"))
        pod = _s(ref.get("name")) if ref.get("kind", "Pod") == "Pod" else None
        for a in _l(e.get("addresses")):
            ip = _ip(a)
            if ip is not None and address_type in ("", family_of(ip)):  # an FQDN slice's names are never used
                endpoints.append(SliceEndpoint(ip, ready, pod, serving, terminating))
    return SliceView(
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        _s(_d(meta.get("labels")).get(SERVICE_NAME_LABEL)),
        tuple(ports),
        tuple(endpoints),
        address_type,
    )
