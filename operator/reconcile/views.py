"""Typed, minimal views of the cluster objects the operator reads, parsed tolerantly from raw API bodies.

Parsing never raises: a field that cannot be used becomes a `problems` entry on the view, so a hostile object
gets a condition saying why instead of crashing the operator."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

MESH_LABEL = "mesh.aether.dev/enabled"
EGRESS_ANNOTATION = "mesh.aether.dev/egress"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
GATEWAY_GROUP = "gateway.networking.k8s.io"
MAX_BACKEND_REFS = 64
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


def _port(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535 else None


@dataclass(frozen=True, slots=True)
class NamespaceView:
    name: str
    meshed: bool
    egress: frozenset[str] | None  # None: every mesh namespace


def parse_namespace(obj: Raw) -> NamespaceView:
    meta = _meta(obj)
    labels, annotations = _d(meta.get("labels")), _d(meta.get("annotations"))
    egress_raw = annotations.get(EGRESS_ANNOTATION)
    egress: frozenset[str] | None = None
    if isinstance(egress_raw, str) and egress_raw.strip() not in ("", "*"):
        egress = frozenset(p.strip() for p in egress_raw.split(",") if p.strip())
    return NamespaceView(str(meta.get("name", "")), labels.get(MESH_LABEL) == "true", egress)


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    uid: str


def parse_node(obj: Raw) -> NodeView:
    meta = _meta(obj)
    return NodeView(str(meta.get("name", "")), str(meta.get("uid", "")))


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
    return PodView(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node=_s(spec.get("nodeName")),
        ip=_ip(status.get("podIP")),
        service_account=sa,
        phase=str(status.get("phase") or "Pending"),
        host_network=spec.get("hostNetwork") is True,
    )


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

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def ports_of(self, protocol: str) -> tuple[ServicePort, ...]:
        """Ports of one protocol, ordered by name then number (the first is the one an arm uses)."""
        return tuple(sorted((p for p in self.ports if p.protocol == protocol), key=lambda p: (p.name, p.port)))


def parse_service(obj: Raw) -> ServiceView:
    meta, spec = _meta(obj), _d(obj.get("spec"))
    problems: list[str] = []
    raw_ip = spec.get("clusterIP")
    cluster_ip = _ip(raw_ip)
    if raw_ip not in (None, "", "None") and cluster_ip is None:
        problems.append(f"spec.clusterIP {raw_ip!r} is not an IP address")
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
    return ServiceView(
        str(meta.get("namespace", "")), str(meta.get("name", "")), cluster_ip, tuple(ports), tuple(problems)
    )


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    ip: str
    ready: bool
    pod: str | None  # targetRef Pod name (same namespace)


@dataclass(frozen=True, slots=True)
class SliceView:
    namespace: str
    name: str
    service: str | None
    ports: tuple[ServicePort, ...]
    endpoints: tuple[SliceEndpoint, ...]

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def parse_slice(obj: Raw) -> SliceView:
    meta = _meta(obj)
    ports = []
    for p in _l(obj.get("ports")):
        p = _d(p)
        number = _port(p.get("port"))
        if number is not None:
            ports.append(ServicePort(str(p.get("name") or ""), number, str(p.get("protocol") or "TCP")))
    endpoints = []
    for e in _l(obj.get("endpoints")):
        e = _d(e)
        ready = _d(e.get("conditions")).get("ready") is not False
        ref = _d(e.get("targetRef"))
        pod = _s(ref.get("name")) if ref.get("kind", "Pod") == "Pod" else None
        for a in _l(e.get("addresses")):
            ip = _ip(a)
            if ip is not None:
                endpoints.append(SliceEndpoint(ip, ready, pod))
    return SliceView(
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        _s(_d(meta.get("labels")).get(SERVICE_NAME_LABEL)),
        tuple(ports),
        tuple(endpoints),
    )


@dataclass(frozen=True, slots=True)
class ParentRef:
    """A parentRef as written (echoed back in status) and whether it names a Service (ours)."""

    group: str
    kind: str
    name: str
    namespace: str | None
    port: int | None
    section_name: str | None
    problem: str | None = None

    @property
    def ours(self) -> bool:
        return self.kind == "Service" and self.group in ("", "core")

    def echo(self) -> Raw:
        out: Raw = {"group": self.group, "kind": self.kind, "name": self.name}
        if self.namespace is not None:
            out["namespace"] = self.namespace
        if self.port is not None:
            out["port"] = self.port
        if self.section_name is not None:
            out["sectionName"] = self.section_name
        return out


@dataclass(frozen=True, slots=True)
class BackendRef:
    group: str
    kind: str
    name: str
    namespace: str
    port: int | None
    weight: int
    problem: str | None = None  # a value problem (weight, port, name) found while parsing

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class RouteView:
    namespace: str
    name: str
    generation: int
    created: str
    parents: tuple[ParentRef, ...]
    backends: tuple[BackendRef, ...]
    problems: tuple[str, ...] = ()
    status_parents: tuple[Raw, ...] = field(default=(), compare=False, hash=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def order(self) -> tuple[str, str, str]:
        """Conflict order: the older route wins (creationTimestamp, then namespace/name)."""
        return (self.created, self.namespace, self.name)


def _parent_ref(raw: Any, i: int) -> ParentRef:
    if not isinstance(raw, dict):
        return ParentRef("", "Service", "", None, None, None, f"spec.parentRefs[{i}] is not an object")
    group = raw.get("group", GATEWAY_GROUP)
    kind = raw.get("kind", "Gateway")
    name = raw.get("name")
    problem = None
    if not isinstance(group, str) or not isinstance(kind, str):
        problem = f"spec.parentRefs[{i}] group/kind must be strings"
        group, kind = "", "Service"
    if not isinstance(name, str) or not name:
        problem = problem or f"spec.parentRefs[{i}].name is missing"
        name = ""
    port = raw.get("port")
    if port is not None and _port(port) is None:
        problem = problem or f"spec.parentRefs[{i}].port {port!r} is not a port number"
        port = None
    ns = raw.get("namespace")
    section = raw.get("sectionName")
    return ParentRef(
        group,
        kind,
        name,
        ns if isinstance(ns, str) and ns else None,
        port,
        section if isinstance(section, str) and section else None,
        problem,
    )


def _backend_ref(raw: Any, route_ns: str, where: str) -> BackendRef:
    if not isinstance(raw, dict):
        return BackendRef("", "Service", "", route_ns, None, 1, f"{where} is not an object")
    group, kind = raw.get("group", ""), raw.get("kind", "Service")
    name, ns = raw.get("name"), raw.get("namespace", route_ns)
    weight, port = raw.get("weight", 1), raw.get("port")
    problem = None
    if not isinstance(group, str) or not isinstance(kind, str):
        problem, group, kind = f"{where} group/kind must be strings", "", "Service"
    if not isinstance(name, str) or not name:
        problem, name = problem or f"{where}.name is missing", ""
    if not isinstance(ns, str) or not ns:
        problem, ns = problem or f"{where}.namespace must be a non-empty string", route_ns
    if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= 1_000_000:
        problem, weight = problem or f"{where}.weight {weight!r} is not an integer in [0, 1000000]", 0
    if port is not None and _port(port) is None:
        problem, port = problem or f"{where}.port {port!r} is not a port number", None
    return BackendRef(group, kind, name, ns, port, weight, problem)


def parse_route(obj: Raw) -> RouteView:
    meta, spec = _meta(obj), obj.get("spec")
    ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    problems: list[str] = []
    if not isinstance(spec, dict):
        problems.append("spec is missing or not an object")
        spec = {}
    raw_parents = spec.get("parentRefs")
    if not isinstance(raw_parents, list) or not raw_parents:
        problems.append("spec.parentRefs is missing or empty")
        raw_parents = []
    if len(raw_parents) > MAX_PARENT_REFS:
        problems.append(f"spec.parentRefs has {len(raw_parents)} entries; at most {MAX_PARENT_REFS}")
        raw_parents = raw_parents[:MAX_PARENT_REFS]
    parents = tuple(_parent_ref(p, i) for i, p in enumerate(raw_parents))
    backends: list[BackendRef] = []
    raw_rules = spec.get("rules")
    if not isinstance(raw_rules, list):
        problems.append("spec.rules is missing or not a list")
        raw_rules = []
    total = sum(len(_l(_d(r).get("backendRefs"))) for r in raw_rules)
    if total > MAX_BACKEND_REFS:
        problems.append(f"{total} backendRefs; at most {MAX_BACKEND_REFS} are supported")
    else:
        for ri, rule in enumerate(raw_rules):
            refs = _d(rule).get("backendRefs")
            if not isinstance(refs, list):
                problems.append(f"spec.rules[{ri}].backendRefs is missing or not a list")
                continue
            for bi, b in enumerate(refs):
                backends.append(_backend_ref(b, ns, f"spec.rules[{ri}].backendRefs[{bi}]"))
    if not backends and not problems:
        problems.append("the route has no backendRefs")
    generation = meta.get("generation")
    status_parents = tuple(p for p in _l(_d(obj.get("status")).get("parents")) if isinstance(p, dict))
    return RouteView(
        ns,
        name,
        generation if isinstance(generation, int) else 0,
        str(meta.get("creationTimestamp") or ""),
        parents,
        tuple(backends),
        tuple(problems),
        status_parents,
    )


@dataclass(frozen=True, slots=True)
class GrantView:
    namespace: str
    name: str
    from_: tuple[tuple[str, str, str], ...]  # (group, kind, namespace)
    to: tuple[tuple[str, str, str | None], ...]  # (group, kind, name or None = any)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def permits(self, route_ns: str, service: str) -> bool:
        src = any(g == GATEWAY_GROUP and k == "UDPRoute" and n == route_ns for g, k, n in self.from_)
        dst = any(g in ("", "core") and k == "Service" and n in (None, service) for g, k, n in self.to)
        return src and dst


def parse_grant(obj: Raw) -> GrantView:
    meta, spec = _meta(obj), _d(obj.get("spec"))
    from_ = tuple(
        (str(f.get("group", "")), str(f.get("kind", "")), str(f.get("namespace", "")))
        for f in map(_d, _l(spec.get("from")))
    )
    to = tuple(
        (str(t.get("group", "")), str(t.get("kind", "")), _s(t.get("name"))) for t in map(_d, _l(spec.get("to")))
    )
    return GrantView(str(meta.get("namespace", "")), str(meta.get("name", "")), from_, to)


PARSERS: dict[str, Any] = {
    "namespace": parse_namespace,
    "node": parse_node,
    "pod": parse_pod,
    "service": parse_service,
    "slice": parse_slice,
    "route": parse_route,
    "grant": parse_grant,
}
