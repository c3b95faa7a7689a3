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
from aether.api.naming import in_family, ref, tcp_cluster, udp_cluster
from aether.netns.contract import INBOUND_PORT
from aether.operator.reconcile.gateway import RouteView
from aether.operator.reconcile.multicluster import import_verdict
from aether.operator.reconcile.routes import (
    Verdict,
    attach_routes,
    endpoints_at,
    mesh_member,
    resolve_route_on,
)
from aether.operator.reconcile.slicing import Contribution, plan
from aether.operator.reconcile.views import ServiceView, family_of
from aether.operator.reconcile.world import World

MULTIPLE_UDP_PORTS, MULTIPLE_TCP_PORTS = "MultipleUDPPorts", "MultipleTCPPorts"
INVALID_SERVICE, NO_CLUSTER_IP, DUPLICATE_VIP = "InvalidService", "NoClusterIP", "DuplicateVIP"
INVALID_IDLE_TIMEOUT, NO_ENDPOINTS_IN_FAMILY = "InvalidIdleTimeout", "NoEndpointsInFamily"
INVALID_UDP_DATAPLANE = "InvalidUdpDataplane"
UNSUPPORTED_ADDRESS_TYPE = "UnsupportedAddressType"
NO_READY_ENDPOINTS, MIXED_SERVICE_ACCOUNTS, UNKNOWN_ENDPOINT_PODS = (
    "NoReadyEndpoints",
    "MixedServiceAccounts",
    "UnknownEndpointPods",
)


@dataclass(frozen=True)
class NamespaceResult:
    namespace: str
    contributions: tuple[Contribution, ...] = ()  # what each Service adds, in name order
    route_verdicts: dict[tuple[str, str], tuple[Verdict, ...]] = field(default_factory=dict)
    meshed: bool = False  # a mesh namespace: only these are published in slices (nodes depend on no other)

    @cached_property
    def tables(self) -> Contribution:
        """The namespace's whole tables: its Services' contributions end to end."""
        return Contribution.joined("", self.contributions)

    @cached_property
    def discards(self) -> frozenset[tuple[str, str, str]]:
        """(route, backend, reason) of every UDP shape still unsupported, each counted once
        (aether_udp_unsupported_total): each discarded part, or the object itself when the shape discards none."""
        return frozenset((x.route, d, x.reason) for x in self.tables.udp_shapes for d in (x.discarded or [x.route]))

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
        return self.meshed and bool(self.tables.udp_shapes or self.tables.tcp_shapes)


def _plain_arms(world: World, svc: ServiceView, protocol: str) -> tuple[list[ServiceArm], list[UnsupportedShape]]:
    """One arm per ClusterIP (spec.clusterIPs: one per IP family), each carrying its family's endpoints only."""
    ports = svc.ports_of(protocol)
    if not ports:
        return [], []
    sref = ref(svc.namespace, svc.name)
    if svc.cluster_ip is None:
        if protocol == "UDP" and not svc.bad_vip:  # a bad one is reported as InvalidService
            return [], [UnsupportedShape(route=sref, reason=NO_CLUSTER_IP, message=svc.no_vip)]
        return [], []
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
    arms = [
        ServiceArm(
            service=sref,
            vip=vip,
            cluster=in_family(cluster, family_of(vip)),
            backend=sref,
            endpoints=list(endpoints_at(world, svc, ports[0], family_of(vip))),
            idle_timeout_seconds=svc.udp_idle_timeout_s if protocol == "UDP" else None,
        )
        for vip in svc.vips
    ]
    return arms, shapes


def family_gaps(svc: ServiceView, arms: list[ServiceArm], protocol: str) -> list[UnsupportedShape]:
    """A dual-stack Service whose VIP of one family has no endpoint while the other's has some (its pods have no
    address of that family, or a route's backends are single-stack): that family's datagrams and connections go
    nowhere, and the Service says so (NoEndpointsInFamily) rather than looking served."""

    def count(arm: ServiceArm) -> int:
        return len(arm.endpoints) + sum(len(b.endpoints) for b in arm.backends or ())

    if len(arms) < 2 or not any(count(a) for a in arms):
        return []
    return [
        UnsupportedShape(
            route=ref(svc.namespace, svc.name),
            reason=NO_ENDPOINTS_IN_FAMILY,
            discarded=[a.vip],
            message=f"{protocol} ClusterIP {a.vip} ({family_of(a.vip)}) has no {family_of(a.vip)} endpoint while "
            f"the Service's other family has some: dialled on that VIP, nothing answers (its pods have no "
            f"{family_of(a.vip)} podIP, or its backends are single-stack)",
        )
        for a in arms
        if not count(a)
    ]


def _not_ip_slices(world: World, svc: ServiceView) -> list[UnsupportedShape]:
    """EndpointSlices of the Service whose addressType is not IPv4 or IPv6 (FQDN: names, which a VIP's datagrams
    cannot be sent to without a resolver; deprecated by the API): their endpoints are not used, and it says so."""
    odd = sorted((sl.name, sl.address_type) for sl in world.slices_of(svc.namespace, svc.name) if not sl.holds_ips)
    if not odd:
        return []
    return [
        UnsupportedShape(
            route=ref(svc.namespace, svc.name),
            reason=UNSUPPORTED_ADDRESS_TYPE,
            discarded=[name for name, _ in odd],
            message="EndpointSlices of addressType "
            + ", ".join(f"{name}: {kind}" for name, kind in odd)
            + ": the mesh sends to IPv4 and IPv6 endpoints only, so their endpoints are not used",
        )
    ]


def duplicate_vip(svc: ServiceView, owner: ServiceView) -> UnsupportedShape:
    """The shape of a Service whose ClusterIP (of any family) an older Service keeps: no UDP or TCP arm, the winner
    named."""
    shared = next((v for v in svc.vips if v in owner.vips), svc.cluster_ip)
    return UnsupportedShape(
        route=ref(svc.namespace, svc.name),
        reason=DUPLICATE_VIP,
        discarded=[ref(svc.namespace, svc.name)],
        message=f"ClusterIP {shared} is also Service {ref(owner.namespace, owner.name)}'s, which keeps it "
        "(the older Service, ties by namespace/name): this Service gets no arm",
    )


def selected_ips(world: World, svc: ServiceView) -> set[str]:
    """The IPs of the running or pending pods (in their own netns, with an IP) the Service's selector selects: the
    pods a policy on the Service guards besides every endpoint of its EndpointSlices (docs/identity.md)."""
    if not svc.selector:
        return set()
    return {p.ip for p in world.pods_matching(svc.namespace, svc.selector) if p.ip and p.placed and svc.selects(p)}


def _quic(world: World, svc: ServiceView) -> QuicDestination | IneligibleDestination | None:
    tcp = svc.ports_of("TCP")
    if not tcp:
        return None
    sref = ref(svc.namespace, svc.name)
    ips: set[str] = set()
    every: set[str] = set()  # whatever their conditions: the pods a policy on the Service guards
    accounts: set[str] = set()
    unknown: list[str] = []
    every.update(selected_ips(world, svc))  # a pod the selector selects is guarded whatever the slices say
    # h2/h3 east-west dials a pod on its address of the Service's primary family (ipFamilies[0]); a policy guards
    # every family's
    primary = family_of(svc.cluster_ip) if svc.cluster_ip else None
    for sl in world.slices_of(svc.namespace, svc.name):
        for ep in sl.endpoints:
            every.add(ep.ip)
            if not ep.ready or primary not in (None, family_of(ep.ip)):
                continue
            ips.add(ep.ip)
            pod = world.pod(svc.namespace, ep.pod) if ep.pod else None
            if pod is None:
                unknown.append(ep.ip)
            else:
                accounts.add(pod.service_account)
    ports = sorted({p.port for p in tcp})
    reason = None
    if not ips:
        reason = NO_READY_ENDPOINTS
    elif unknown:
        reason = UNKNOWN_ENDPOINT_PODS
    elif len(accounts) != 1:
        reason = MIXED_SERVICE_ACCOUNTS
    if reason is not None:
        return IneligibleDestination(
            service=sref, reason=reason, ports=ports if every else [], endpoint_ips=sorted(every)
        )
    return QuicDestination(
        service=sref,
        service_account=next(iter(accounts)),
        ports=ports,
        endpoints=[Endpoint(ip=ip, port=INBOUND_PORT) for ip in sorted(ips)],
        unready_ips=sorted(every - ips),
    )


def compute_namespace(world: World, namespace: str) -> NamespaceResult:
    winners, rejected = attach_routes(world, namespace)
    verdicts = dict(rejected)
    meshed = mesh_member(world, namespace)
    contributions = tuple(
        _one_service(world, svc, meshed, winners, verdicts)
        for svc in sorted(world.services_in(namespace), key=lambda s: s.name)
    )
    if meshed:
        contributions = tuple(sorted((*contributions, *_imported(world, namespace)), key=lambda c: c.service))
    by_route: dict[tuple[str, str], list[Verdict]] = {}
    for (rns, rname, _), v in sorted(verdicts.items()):
        by_route.setdefault((rns, rname), []).append(v)
    for route in world.routes_in(namespace):
        by_route.setdefault(route.key, [])
    return NamespaceResult(
        namespace=namespace,
        contributions=contributions,
        route_verdicts={k: tuple(v) for k, v in by_route.items()},
        meshed=meshed,
    )


def _imported(world: World, namespace: str) -> list[Contribution]:
    """The namespace's ServiceImports that are Ready, each a QUIC destination through its peer's gateways (what
    is not Ready is in the import's status: multicluster.import_verdict)."""
    out = []
    for imp in sorted(world.imports_in(namespace), key=lambda i: i.name):
        peer = world.peer(imp.peer) if imp.peer else None
        verdict = import_verdict(imp, peer, world.service(namespace, imp.name), world.trust_domain)
        if verdict.destination is not None:
            out.append(Contribution(imp.name, destinations=(verdict.destination,)))
    return out


def _one_service(
    world: World,
    svc: ServiceView,
    meshed: bool,
    winners: dict[tuple[str, str], tuple[RouteView, tuple[int, ...]]],
    verdicts: dict[tuple[str, str, int], Verdict],
) -> Contribution:
    """What one Service adds to the namespace's tables; the verdicts of a route attached to it go into `verdicts`."""
    sref = ref(svc.namespace, svc.name)
    udp_arms: list[ServiceArm] = []
    udp_shapes: list[UnsupportedShape] = []
    tcp_arms: list[ServiceArm] = []
    tcp_shapes: list[UnsupportedShape] = []
    owner = next((o for v in svc.vips if (o := world.vip_owner(v)) is not None and o.key != svc.key), None)
    lost = owner is not None
    winner = None if lost else winners.get(svc.key)
    if lost and owner is not None:
        if meshed:
            udp_shapes.append(duplicate_vip(svc, owner))
    elif winner is not None:
        route, indexes = winner
        found: tuple[ServiceArm, Verdict] | None = None
        for i in indexes:  # the route's parentRefs on the port the mesh carries
            arm, verdict = resolve_route_on(world, route, route.parents[i], svc)
            verdicts[(route.namespace, route.name, i)] = verdict
            found = found or (arm, verdict)
        if found is not None:  # and the arm of each other family's VIP, from the same parentRef
            udp_arms.append(found[0])
            first = route.parents[indexes[0]]
            udp_arms.extend(resolve_route_on(world, route, first, svc, vip)[0] for vip in svc.vips[1:])
    elif meshed:
        arms, shapes = _plain_arms(world, svc, "UDP")
        udp_arms.extend(arms)
        udp_shapes.extend(shapes)
    if svc.udp_dataplane is not None:  # the dialled Service's choice, whatever a route re-points it to
        udp_arms = [a.model_copy(update={"dataplane": svc.udp_dataplane}) for a in udp_arms]
    if not meshed:
        return Contribution(svc.name, tuple(udp_arms))
    if svc.problems:
        udp_shapes.append(UnsupportedShape(route=sref, reason=INVALID_SERVICE, message="; ".join(svc.problems)))
    udp_shapes.extend(_not_ip_slices(world, svc))
    annotation_problems = (
        (svc.idle_timeout_problem, INVALID_IDLE_TIMEOUT, "the Service keeps the node's default idle timeout"),
        (svc.dataplane_problem, INVALID_UDP_DATAPLANE, "the Service keeps the node's default UDP data path"),
    )
    for problem, reason, kept in annotation_problems:
        if problem and svc.ports_of("UDP"):
            udp_shapes.append(UnsupportedShape(route=sref, reason=reason, message=f"{problem}: {kept}"))
    if not lost:
        arms, shapes = _plain_arms(world, svc, "TCP")
        tcp_arms.extend(arms)
        tcp_shapes.extend(shapes)
    udp_shapes.extend(family_gaps(svc, udp_arms, "UDP"))
    tcp_shapes.extend(family_gaps(svc, tcp_arms, "TCP"))
    q = _quic(world, svc)
    if isinstance(q, QuicDestination) and world.export(svc.namespace, svc.name) is not None:
        q = q.model_copy(update={"exported": True})
    return Contribution(
        svc.name,
        tuple(udp_arms),
        tuple(udp_shapes),
        tuple(tcp_arms),
        tuple(tcp_shapes),
        (q,) if isinstance(q, QuicDestination) else (),
        (q,) if isinstance(q, IneligibleDestination) else (),
    )
