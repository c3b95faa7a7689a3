"""Everything one namespace contributes to the mesh: its Services' UDP/TCP arms and shapes, its QUIC
destinations (per Service: `contributions`, split into MeshServiceSlices by slicing.py), and the verdicts of its
UDPRoutes. A pure function of a World; nodes reference the slices, the sidecar reads them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from aether.api.meshnode import (
    Endpoint,
    IneligibleDestination,
    QuicDestination,
    ServiceArm,
    UnsupportedShape,
)
from aether.api.naming import ref, tcp_cluster, udp_cluster
from aether.netns.contract import INBOUND_PORT
from aether.operator.reconcile.routes import (
    Verdict,
    attach_routes,
    endpoints_at,
    mesh_member,
    resolve_route_on,
)
from aether.operator.reconcile.slicing import Contribution, plan
from aether.operator.reconcile.views import ServiceView
from aether.operator.reconcile.world import World

MULTIPLE_UDP_PORTS, MULTIPLE_TCP_PORTS = "MultipleUDPPorts", "MultipleTCPPorts"
INVALID_SERVICE, NO_CLUSTER_IP, DUPLICATE_VIP = "InvalidService", "NoClusterIP", "DuplicateVIP"
INVALID_IDLE_TIMEOUT = "InvalidIdleTimeout"
NO_READY_ENDPOINTS, MIXED_SERVICE_ACCOUNTS, UNKNOWN_ENDPOINT_PODS = (
    "NoReadyEndpoints",
    "MixedServiceAccounts",
    "UnknownEndpointPods",
)


@dataclass(frozen=True)
class NamespaceResult:
    namespace: str
    udp_arms: tuple[ServiceArm, ...] = ()
    udp_shapes: tuple[UnsupportedShape, ...] = ()
    tcp_arms: tuple[ServiceArm, ...] = ()
    tcp_shapes: tuple[UnsupportedShape, ...] = ()
    destinations: tuple[QuicDestination, ...] = ()
    ineligible: tuple[IneligibleDestination, ...] = ()
    route_verdicts: dict[tuple[str, str], tuple[Verdict, ...]] = field(default_factory=dict)
    discards: frozenset[tuple[str, str, str]] = frozenset()  # (route, backend, reason): each counted once
    meshed: bool = False  # a mesh namespace: only these are published in slices (nodes depend on no other)
    contributions: tuple[Contribution, ...] = ()  # the lists above, per Service

    @cached_property
    def slices(self) -> dict[str, dict[str, Any]]:
        """The namespace's MeshServiceSlices: name -> spec (wire form; shared, never mutate)."""
        return plan(self.namespace, self.contributions) if self.meshed else {}

    @cached_property
    def shape(self) -> str:
        """What a MeshNode says about this namespace (its slice names, whether it has unsupported shapes),
        digested: it changes when a node's own status would, not when a Service or an endpoint changes."""
        body = json.dumps([sorted(self.slices), self.degraded]).encode()
        return hashlib.blake2b(body, digest_size=16).hexdigest()

    @property
    def degraded(self) -> bool:
        """A mesh namespace with shapes the data path cannot express (its slices' unsupportedShapes)."""
        return self.meshed and bool(self.udp_shapes or self.tcp_shapes)


def _plain_arm(world: World, svc: ServiceView, protocol: str) -> tuple[ServiceArm | None, list[UnsupportedShape]]:
    ports = svc.ports_of(protocol)
    if not ports:
        return None, []
    sref = ref(svc.namespace, svc.name)
    if svc.cluster_ip is None:
        if protocol == "UDP" and not svc.bad_vip:  # a bad one is reported as InvalidService
            return None, [
                UnsupportedShape(route=sref, reason=NO_CLUSTER_IP, message="headless Service: no VIP to match")
            ]
        return None, []
    shapes = []
    if len(ports) > 1:
        reason = MULTIPLE_UDP_PORTS if protocol == "UDP" else MULTIPLE_TCP_PORTS
        shapes.append(
            UnsupportedShape(
                route=sref,
                reason=reason,
                discarded=[f"{sref}:{p.name or p.port}" for p in ports[1:]],
                message=f"one arm per Service; using port {ports[0].name or ports[0].port}",
            )
        )
    cluster = udp_cluster(svc.namespace, svc.name) if protocol == "UDP" else tcp_cluster(svc.namespace, svc.name)
    arm = ServiceArm(
        service=sref,
        vip=svc.cluster_ip,
        cluster=cluster,
        backend=sref,
        endpoints=list(endpoints_at(world, svc, ports[0])),
        idle_timeout_seconds=svc.udp_idle_timeout_s if protocol == "UDP" else None,
    )
    return arm, shapes


def duplicate_vip(svc: ServiceView, owner: ServiceView) -> UnsupportedShape:
    """The shape of a Service whose ClusterIP an older Service keeps: no UDP or TCP arm, the winner named."""
    return UnsupportedShape(
        route=ref(svc.namespace, svc.name),
        reason=DUPLICATE_VIP,
        discarded=[ref(svc.namespace, svc.name)],
        message=f"ClusterIP {svc.cluster_ip} is also Service {ref(owner.namespace, owner.name)}'s, which keeps it "
        "(the older Service, ties by namespace/name): this Service gets no arm",
    )


def _quic(world: World, svc: ServiceView) -> QuicDestination | IneligibleDestination | None:
    tcp = svc.ports_of("TCP")
    if not tcp:
        return None
    sref = ref(svc.namespace, svc.name)
    ips: set[str] = set()
    accounts: set[str] = set()
    unknown: list[str] = []
    for sl in world.slices_of(svc.namespace, svc.name):
        for ep in sl.endpoints:
            if not ep.ready:
                continue
            ips.add(ep.ip)
            pod = world.pod(svc.namespace, ep.pod) if ep.pod else None
            if pod is None:
                unknown.append(ep.ip)
            else:
                accounts.add(pod.service_account)
    if not ips:
        return IneligibleDestination(service=sref, reason=NO_READY_ENDPOINTS)
    if unknown:
        return IneligibleDestination(service=sref, reason=UNKNOWN_ENDPOINT_PODS)
    if len(accounts) != 1:
        return IneligibleDestination(service=sref, reason=MIXED_SERVICE_ACCOUNTS)
    return QuicDestination(
        service=sref,
        service_account=next(iter(accounts)),
        ports=sorted({p.port for p in tcp}),
        endpoints=[Endpoint(ip=ip, port=INBOUND_PORT) for ip in sorted(ips)],
    )


@dataclass
class _Lists:
    verdicts: dict[tuple[str, str, int], Verdict]
    udp_arms: list[ServiceArm] = field(default_factory=list)
    udp_shapes: list[UnsupportedShape] = field(default_factory=list)
    tcp_arms: list[ServiceArm] = field(default_factory=list)
    tcp_shapes: list[UnsupportedShape] = field(default_factory=list)
    dests: list[QuicDestination] = field(default_factory=list)
    inel: list[IneligibleDestination] = field(default_factory=list)
    discards: set[tuple[str, str, str]] = field(default_factory=set)

    def marks(self) -> tuple[int, ...]:
        return tuple(
            len(x) for x in (self.udp_arms, self.udp_shapes, self.tcp_arms, self.tcp_shapes, self.dests, self.inel)
        )

    def since(self, service: str, m: tuple[int, ...]) -> Contribution:
        return Contribution(
            service,
            tuple(self.udp_arms[m[0] :]),
            tuple(self.udp_shapes[m[1] :]),
            tuple(self.tcp_arms[m[2] :]),
            tuple(self.tcp_shapes[m[3] :]),
            tuple(self.dests[m[4] :]),
            tuple(self.inel[m[5] :]),
        )


def compute_namespace(world: World, namespace: str) -> NamespaceResult:
    winners, rejected = attach_routes(world, namespace)
    acc = _Lists(verdicts=dict(rejected))
    meshed = mesh_member(world, namespace)
    contributions: list[Contribution] = []
    for svc in sorted(world.services_in(namespace), key=lambda s: s.name):
        marks = acc.marks()
        _one_service(world, svc, meshed, winners, acc)
        contributions.append(acc.since(svc.name, marks))
    # every shape still unsupported is counted once (aether_udp_unsupported_total): each discarded part, or the
    # object itself when the shape discards none
    acc.discards.update((x.route, d, x.reason) for x in acc.udp_shapes for d in (x.discarded or [x.route]))
    by_route: dict[tuple[str, str], list[Verdict]] = {}
    for (rns, rname, _), v in sorted(acc.verdicts.items()):
        by_route.setdefault((rns, rname), []).append(v)
    for route in world.routes_in(namespace):
        by_route.setdefault(route.key, [])
    return NamespaceResult(
        namespace=namespace,
        udp_arms=tuple(acc.udp_arms),
        udp_shapes=tuple(acc.udp_shapes),
        tcp_arms=tuple(acc.tcp_arms),
        tcp_shapes=tuple(acc.tcp_shapes),
        destinations=tuple(acc.dests),
        ineligible=tuple(acc.inel),
        route_verdicts={k: tuple(v) for k, v in by_route.items()},
        discards=frozenset(acc.discards),
        meshed=meshed,
        contributions=tuple(contributions),
    )


def _one_service(world: World, svc: ServiceView, meshed: bool, winners: Any, acc: _Lists) -> None:
    """What one Service adds to the namespace's lists (appended to `acc`)."""
    sref = ref(svc.namespace, svc.name)
    owner = world.vip_owner(svc.cluster_ip) if svc.cluster_ip else None
    lost = owner is not None and owner.key != svc.key
    route = None if lost else winners.get(svc.key)
    if lost and owner is not None:
        if meshed:
            acc.udp_shapes.append(duplicate_vip(svc, owner))
    elif route is not None:
        found: tuple[ServiceArm, Verdict] | None = None
        for i, parent in enumerate(route.parents):
            if (parent.namespace or route.namespace, parent.name) == svc.key and parent.ours:
                arm, verdict = resolve_route_on(world, route, parent, svc)
                acc.verdicts[(route.namespace, route.name, i)] = verdict
                found = found or (arm, verdict)
        if found is not None:
            acc.udp_arms.append(found[0])
    elif meshed:
        udp_arm, shapes = _plain_arm(world, svc, "UDP")
        if udp_arm is not None:
            acc.udp_arms.append(udp_arm)
        acc.udp_shapes.extend(shapes)
    if not meshed:
        return
    if svc.problems:
        acc.udp_shapes.append(UnsupportedShape(route=sref, reason=INVALID_SERVICE, message="; ".join(svc.problems)))
    if svc.idle_timeout_problem and svc.ports_of("UDP"):
        acc.udp_shapes.append(
            UnsupportedShape(
                route=sref,
                reason=INVALID_IDLE_TIMEOUT,
                message=f"{svc.idle_timeout_problem}: the Service keeps the node's default idle timeout",
            )
        )
    if not lost:
        tcp_arm, shapes = _plain_arm(world, svc, "TCP")
        if tcp_arm is not None:
            acc.tcp_arms.append(tcp_arm)
        acc.tcp_shapes.extend(shapes)
    q = _quic(world, svc)
    if isinstance(q, QuicDestination):
        acc.dests.append(q)
    elif q is not None:
        acc.inel.append(q)
