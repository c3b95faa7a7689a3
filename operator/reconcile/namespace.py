"""Everything one namespace contributes to the mesh: its Services' UDP/TCP arms and shapes, its QUIC
destinations, and the verdicts of its UDPRoutes. A pure function of a World; nodes assemble these."""

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
    shapes_of,
)
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

    @cached_property
    def fragments(self) -> dict[str, list[dict[str, Any]]]:
        """The wire form of each list this namespace contributes to a MeshNode, built once and shared by
        every node that depends on it (never mutate)."""
        return {
            "udp_arms": [a.wire() for a in self.udp_arms],
            "udp_shapes": [x.wire() for x in self.udp_shapes],
            "tcp_arms": [a.wire() for a in self.tcp_arms],
            "tcp_shapes": [x.wire() for x in self.tcp_shapes],
            "destinations": [d.wire() for d in self.destinations],
            "ineligible": [d.wire() for d in self.ineligible],
        }

    @cached_property
    def digest(self) -> str:
        body = json.dumps(self.fragments, sort_keys=True).encode()
        return hashlib.blake2b(body, digest_size=16).hexdigest()


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


def compute_namespace(world: World, namespace: str) -> NamespaceResult:
    winners, rejected = attach_routes(world, namespace)
    verdicts: dict[tuple[str, str, int], Verdict] = dict(rejected)
    udp_arms: list[ServiceArm] = []
    udp_shapes: list[UnsupportedShape] = []
    tcp_arms: list[ServiceArm] = []
    tcp_shapes: list[UnsupportedShape] = []
    dests: list[QuicDestination] = []
    inel: list[IneligibleDestination] = []
    discards: set[tuple[str, str, str]] = set()
    meshed = mesh_member(world, namespace)
    for svc in sorted(world.services_in(namespace), key=lambda s: s.name):
        sref = ref(svc.namespace, svc.name)
        owner = world.vip_owner(svc.cluster_ip) if svc.cluster_ip else None
        lost = owner is not None and owner.key != svc.key
        route = None if lost else winners.get(svc.key)
        if lost and owner is not None:
            if meshed:
                udp_shapes.append(duplicate_vip(svc, owner))
        elif route is not None:
            found: tuple[ServiceArm, Verdict] | None = None
            for i, parent in enumerate(route.parents):
                if (parent.namespace or route.namespace, parent.name) == svc.key and parent.ours:
                    arm, verdict = resolve_route_on(world, route, parent, svc)
                    verdicts[(route.namespace, route.name, i)] = verdict
                    found = found or (arm, verdict)
            if found is not None:
                udp_arms.append(found[0])
                udp_shapes.extend(shapes_of(route, found[1]))
                discards.update((ref(*route.key), b, r) for b, r in found[1].discarded)
        elif meshed:
            udp_arm, shapes = _plain_arm(world, svc, "UDP")
            if udp_arm is not None:
                udp_arms.append(udp_arm)
            udp_shapes.extend(shapes)
        if not meshed:
            continue
        if svc.problems:
            udp_shapes.append(UnsupportedShape(route=sref, reason=INVALID_SERVICE, message="; ".join(svc.problems)))
        if svc.idle_timeout_problem and svc.ports_of("UDP"):
            udp_shapes.append(
                UnsupportedShape(
                    route=sref,
                    reason=INVALID_IDLE_TIMEOUT,
                    message=f"{svc.idle_timeout_problem}: the Service keeps the node's default idle timeout",
                )
            )
        if not lost:
            tcp_arm, shapes = _plain_arm(world, svc, "TCP")
            if tcp_arm is not None:
                tcp_arms.append(tcp_arm)
            tcp_shapes.extend(shapes)
        q = _quic(world, svc)
        if isinstance(q, QuicDestination):
            dests.append(q)
        elif q is not None:
            inel.append(q)
    # every shape still unsupported is counted once (aether_udp_unsupported_total): each discarded part, or the
    # object itself when the shape discards none
    discards.update((x.route, d, x.reason) for x in udp_shapes for d in (x.discarded or [x.route]))
    by_route: dict[tuple[str, str], list[Verdict]] = {}
    for (rns, rname, _), v in sorted(verdicts.items()):
        by_route.setdefault((rns, rname), []).append(v)
    for route in world.routes_in(namespace):
        by_route.setdefault(route.key, [])
    return NamespaceResult(
        namespace=namespace,
        udp_arms=tuple(udp_arms),
        udp_shapes=tuple(udp_shapes),
        tcp_arms=tuple(tcp_arms),
        tcp_shapes=tuple(tcp_shapes),
        destinations=tuple(dests),
        ineligible=tuple(inel),
        route_verdicts={k: tuple(v) for k, v in by_route.items()},
        discards=frozenset(discards),
    )
