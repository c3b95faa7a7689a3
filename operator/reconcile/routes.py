"""GAMMA UDPRoutes on mesh Services: which route owns a parent, where its arm points, and each route's verdict.

Weights split new sessions (Gateway API): a route with one valid backendRef of positive weight points the arm at
that backend's own cluster; any other route gives the arm its own cluster (`udp-split:<ns>/<parent>`) whose
localities spread new sessions by weight (`aether.operator.reconcile.split` computes the shares; the MeshNode arm
lists each backend with weight, share and reason; the sidecar builds the localities). Weight 0 drains (no new
session, open ones finish); an invalid backendRef keeps its share and that share is dropped, with ResolvedRefs=False
and the spec's reason. Every backendRef refused sends the arm to the blackhole with the refusal's reason. A backend
always resolves to its own endpoints (routes are never chained), so route loops cannot form. Two routes on one
parent: the older carries the traffic (creationTimestamp, then namespace/name); both are Accepted (the spec defines no
route reason for a conflict, and upstream's multiple-routes conformance test expects both Accepted), the newer's
message saying it carries none."""

from __future__ import annotations

from dataclasses import dataclass, replace

from aether.api.meshnode import ArmBackend, Endpoint, ServiceArm
from aether.api.naming import BLACKHOLE_CLUSTER, in_family, ref, udp_cluster, udp_split_cluster
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.operator.reconcile.gateway import BackendRef, ParentRef, RouteView
from aether.operator.reconcile.split import Share, SplitRef, compute_split
from aether.operator.reconcile.views import ServicePort, ServiceView, family_of
from aether.operator.reconcile.world import World

# Gateway API reasons (Accepted / ResolvedRefs) and ours for discarded backends.
# Only reasons Gateway API v1.6.1 defines for routes (apis/v1/shared_types.go); it has none for a conflict.
ACCEPTED, NO_MATCHING_PARENT, UNSUPPORTED_VALUE = "Accepted", "NoMatchingParent", "UnsupportedValue"
RESOLVED, REF_NOT_PERMITTED, INVALID_KIND, BACKEND_NOT_FOUND = (
    "ResolvedRefs",
    "RefNotPermitted",
    "InvalidKind",
    "BackendNotFound",
)
DRAINED, NO_HEALTHY_BACKEND = "Drained", "NoHealthyBackend"
NOT_A_SERVICE_PARENT = "NotAServiceParent"  # the reason of the hint Event (an Event's, not a condition's)
SERVICE_KINDS = ("service", "services", "svc")


def near_miss(world: World, route: RouteView, parent: ParentRef, i: int) -> str | None:
    """Why a parentRef that is not ours looks meant for a mesh Service, or None (a Gateway parent of another name
    is another controller's business: silent). Told in a Warning Event on the route, never in status.parents:
    status under our controllerName is only for parents we are responsible for."""
    where, ns = f"spec.parentRefs[{i}]", parent.namespace or route.namespace
    group = parent.group or '""'
    if parent.kind == "Service":
        return (
            f"{where} names Service {ns}/{parent.name} in group {group} (the CRD's default when group is left out): "
            'aether serves Service parents of the core group only; write group: "" to attach to the Service'
        )
    if parent.kind.lower() in SERVICE_KINDS:
        return f'{where} names kind {parent.kind!r}: a Service parent is group: "", kind: Service'
    svc = world.service(ns, parent.name)
    if parent.kind == "Gateway" and svc is not None and mesh_member(world, ns):
        return (
            f"{where} names Gateway {ns}/{parent.name} (kind and group default to Gateway, gateway.networking.k8s.io) "
            f'and mesh Service {ns}/{parent.name} exists: to attach to the Service, write group: "", kind: Service'
        )
    return None


@dataclass(frozen=True, slots=True)
class Verdict:
    """Our status for one (route, parentRef)."""

    parent: ParentRef
    accepted: bool
    accepted_reason: str
    accepted_message: str
    resolved: bool = True
    resolved_reason: str = RESOLVED
    resolved_message: str = "all backendRefs resolved"
    chosen: str | None = None
    routing: bool = True  # False: Accepted, but an older route on the parent carries its traffic
    hint: bool = False  # a parent that is not ours but looks meant for the mesh: an Event only, never status


def rules_note(rules: int) -> str:
    """What the Accepted message adds for a route with more than one rule (v1alpha2 admits up to 16, v1 one; a
    route stored through v1alpha2 reads the same through v1). A UDPRoute rule has no matches, so every rule applies to every datagram: the rules' backendRefs are
    one set of backends for the parent, resolved and chosen among together."""
    if rules <= 1:
        return ""
    return f"; {rules} rules: UDPRoute rules have no matches, so their backendRefs are served as one set (v1: one rule)"


def endpoints_at(world: World, svc: ServiceView, port: ServicePort, family: str | None = None) -> tuple[Endpoint, ...]:
    """The endpoints of svc for one of its ports (matched to slice ports by name and protocol): the ready ones, and
    the terminating ones still serving marked `draining` (an address ready in any slice is ready). With no ready
    endpoint, the serving terminating ones take new flows unmarked, as kube-proxy does. `family` (IPv4, IPv6): only
    that family's addresses, what the Service's VIP of that family carries (its slices of that addressType)."""
    found: dict[tuple[str, int], bool] = {}  # (ip, port) -> draining
    for sl in world.slices_of(svc.namespace, svc.name):
        numbers = [p.port for p in sl.ports if p.name == port.name and p.protocol == port.protocol]
        if not numbers or not sl.holds_ips:
            continue
        for ep in sl.endpoints:
            if family is not None and family_of(ep.ip) != family:
                continue
            if ep.ready or ep.draining:
                key = (ep.ip, numbers[0])
                found[key] = found.get(key, True) and ep.draining
    if all(found.values()):
        found = dict.fromkeys(found, False)
    return tuple(Endpoint(ip=ip, port=p, draining=d) for (ip, p), d in sorted(found.items()))


def mesh_member(world: World, namespace: str) -> bool:
    ns = world.namespace(namespace)
    return ns is not None and ns.meshed


def _parent_mismatch(svc: ServiceView | None, parent: ParentRef, route: RouteView, world: World) -> str | None:
    target = f"Service {parent.namespace or route.namespace}/{parent.name}"
    if parent.problem:
        return parent.problem
    if parent.namespace not in (None, route.namespace):
        return (
            f"{target}: cross-namespace (consumer) routes are not supported; put the route in the Service's namespace"
        )
    if svc is None:
        return f"{target} does not exist"
    if not mesh_member(world, svc.namespace):
        return f"{target} is not in a mesh namespace (label mesh.aether.dev/enabled=true)"
    if svc.cluster_ip is None:
        return (
            f"{target} has no usable ClusterIP: {'; '.join(svc.problems)}"
            if svc.bad_vip
            else f"{target} has no ClusterIP ({svc.no_vip})"
        )
    owner = world.vip_owner(svc.cluster_ip)
    if owner is not None and owner.key != svc.key:
        return (
            f"{target}: its ClusterIP {svc.cluster_ip} is kept by the older Service {owner.namespace}/{owner.name} "
            "(DuplicateVIP)"
        )
    if not svc.ports_of("UDP"):
        return f"{target} has no UDP port"
    if scoped_port(svc, parent) is None:
        named = [f"named {parent.section_name!r}"] if parent.section_name is not None else []
        numbered = [f"numbered {parent.port}"] if parent.port is not None else []
        return f"{target} has no UDP port {' and '.join(named + numbered)}"
    return None


def describe(port: ServicePort) -> str:
    return f"{port.name} ({port.port}/{port.protocol})" if port.name else f"{port.port}/{port.protocol}"


def carried_port(svc: ServiceView) -> ServicePort | None:
    """The one UDP port of a Service the mesh carries: pods dial every Service on L4_OUTBOUND_PORT, so an arm is
    one per VIP, not per port; the first UDP port by name, then number."""
    udp = svc.ports_of("UDP")
    return udp[0] if udp else None


def scoped_port(svc: ServiceView, parent: ParentRef) -> ServicePort | None:
    """The UDP port a parentRef selects (its `port` and `sectionName`: when both are set the port must match both),
    the carried one for a parentRef that names neither (GEP-1294: the route is associated with every port, and the
    mesh carries one of them); None when no UDP port matches."""
    if parent.port is None and parent.section_name is None:
        return carried_port(svc)
    return next(
        (p for p in svc.ports_of("UDP") if parent.port in (None, p.port) and parent.section_name in (None, p.name)),
        None,
    )


def carries(svc: ServiceView, parent: ParentRef) -> bool:
    """Whether a parentRef on svc is scoped to the port the mesh carries (or to none)."""
    port = scoped_port(svc, parent)
    return port is not None and port == carried_port(svc)


def _ports_note(svc: ServiceView, parent: ParentRef) -> str:
    """What an unscoped route's Accepted message adds on a Service with several UDP ports: the one it is on."""
    carried = carried_port(svc)
    if carried is None or len(svc.ports_of("UDP")) < 2 or parent.port is not None or parent.section_name:
        return ""
    return f"; of its UDP ports the mesh carries {describe(carried)} (one per Service, dialled on {L4_OUTBOUND_PORT})"


@dataclass(frozen=True, slots=True)
class _Candidate:
    backend: BackendRef
    cluster: str
    endpoints: tuple[Endpoint, ...]


def _resolve_backend(
    world: World, route: RouteView, b: BackendRef, family: str = "IPv4"
) -> tuple[_Candidate | None, str, str]:
    """-> (candidate, reason, message); candidate None when the ref cannot be used."""
    if b.problem:
        return None, UNSUPPORTED_VALUE, b.problem
    if b.group not in ("", "core") or b.kind != "Service":
        return None, INVALID_KIND, f"backendRef {b.ref}: kind {b.group or 'core'}/{b.kind} is not a Service"
    if b.namespace != route.namespace and not any(
        g.permits(route.namespace, b.name) for g in world.grants_in(b.namespace)
    ):
        return None, REF_NOT_PERMITTED, f"backendRef {b.ref}: no ReferenceGrant in {b.namespace} allows it"
    svc = world.service(b.namespace, b.name)
    if svc is None:
        return None, BACKEND_NOT_FOUND, f"backendRef {b.ref}: Service not found"
    if b.port is None:
        return None, BACKEND_NOT_FOUND, f"backendRef {b.ref}: port is required"
    ports = [p for p in svc.ports_of("UDP") if p.port == b.port]
    if not ports:
        return None, BACKEND_NOT_FOUND, f"backendRef {b.ref}: Service has no UDP port {b.port}"
    cluster = in_family(udp_cluster(b.namespace, b.name), family)
    return _Candidate(b, cluster, endpoints_at(world, svc, ports[0], family)), RESOLVED, ""


def _split_message(shares: tuple[Share, ...]) -> str:
    return ", ".join(f"{s.backend} {s.share:g}%" + (f" ({s.reason})" if s.reason else "") for s in shares)


def resolve_route_on(
    world: World, route: RouteView, parent: ParentRef, svc: ServiceView, vip: str | None = None
) -> tuple[ServiceArm, Verdict]:
    """The arm a route gives its parent Service's VIP `vip` (its primary ClusterIP when None), and the route's
    verdict for that parent. The arm carries the backends' endpoints of the VIP's family only."""
    vip = vip or svc.cluster_ip or ""
    family = family_of(vip) if vip else "IPv4"
    bad: list[tuple[str, str, str]] = []  # (ref, reason, message)
    usable: list[_Candidate] = []
    refs: list[SplitRef] = []
    endpoints: dict[tuple[str, int | None], tuple[Endpoint, ...]] = {}
    for b in route.backends:
        cand, reason, message = _resolve_backend(world, route, b, family)
        if cand is None:
            bad.append((b.ref, reason, message))
            refs.append(SplitRef(b.ref, b.port, b.weight, reason))
        else:
            usable.append(cand)
            refs.append(SplitRef(b.ref, b.port, b.weight))
            endpoints[(b.ref, b.port)] = cand.endpoints
    sref, route_ref = ref(svc.namespace, svc.name), ref(route.namespace, route.name)
    resolved_reason = RESOLVED
    for r in (REF_NOT_PERMITTED, INVALID_KIND, BACKEND_NOT_FOUND, UNSUPPORTED_VALUE):
        if any(reason == r for _, reason, _ in bad):
            resolved_reason = r
            break
    idle = svc.udp_idle_timeout_s
    shares = compute_split(refs)
    # one backend (refs naming it more than once are one) of positive weight: its own cluster, no split needed
    one = shares[0] if len(shares) == 1 and shares[0].reason is None else None
    single = next(c for c in usable if (c.backend.ref, c.backend.port) == (one.backend, one.port)) if one else None
    if not usable:  # every backendRef refused: the refusal's reason
        arm = ServiceArm(service=sref, vip=vip, cluster=BLACKHOLE_CLUSTER, route=route_ref, reason=resolved_reason)
        message, chosen = f"no usable backend: the arm goes to the blackhole ({resolved_reason})", None
    elif single is not None and not single.endpoints:
        arm = ServiceArm(service=sref, vip=vip, cluster=BLACKHOLE_CLUSTER, route=route_ref, reason=NO_HEALTHY_BACKEND)
        message, chosen = "no live backend: the arm goes to the blackhole (NoHealthyBackend)", None
    elif single is not None:
        arm = ServiceArm(
            service=sref,
            vip=vip,
            cluster=single.cluster,
            backend=single.backend.ref,
            route=route_ref,
            endpoints=list(single.endpoints),
            idle_timeout_seconds=idle,
        )
        message, chosen = f"routes {sref} to {single.cluster}", single.cluster
    else:
        cluster = in_family(udp_split_cluster(svc.namespace, svc.name), family)
        backends = [
            ArmBackend(
                backend=s.backend,
                weight=s.weight,
                share=s.share,
                endpoints=list(endpoints.get((s.backend.partition(":")[0], s.port), ()))
                if s.reason in (None, DRAINED)
                else [],
                reason=s.reason,
            )
            for s in shares
        ]
        arm = ServiceArm(
            service=sref, vip=vip, cluster=cluster, route=route_ref, backends=backends, idle_timeout_seconds=idle
        )
        message, chosen = f"splits new sessions of {sref} by weight: {_split_message(shares)}", cluster
    verdict = Verdict(
        parent=parent,
        accepted=True,
        accepted_reason=ACCEPTED,
        accepted_message=message + _ports_note(svc, parent) + rules_note(route.rules),
        resolved=not bad,
        resolved_reason=resolved_reason,
        resolved_message="; ".join(m for _, _, m in bad) or "all backendRefs resolved",
        chosen=chosen,
    )
    return arm, verdict


def parent_service_key(route: RouteView, parent: ParentRef) -> tuple[str, str]:
    return (parent.namespace or route.namespace, parent.name)


def attach_routes(
    world: World, namespace: str
) -> tuple[dict[tuple[str, str], tuple[RouteView, tuple[int, ...]]], dict[tuple[str, str, int], Verdict]]:
    """For the routes in `namespace`: per parent Service, the route that carries its arm (the oldest of those on the
    port the mesh carries) with the indexes of its parentRefs on it, and a verdict for every (route, parent index)
    we own that is not decided by resolve_route_on (rejected, on a port the mesh does not carry, or not routing)."""
    verdicts: dict[tuple[str, str, int], Verdict] = {}
    claims: dict[tuple[str, str], list[tuple[RouteView, int]]] = {}
    for route in sorted(world.routes_in(namespace), key=lambda r: r.order):
        if not route.parents:  # nothing to attach to, but the route still gets a condition saying why
            placeholder = ParentRef("", "Service", "", None, None, None, "; ".join(route.problems))
            verdicts[(route.namespace, route.name, 0)] = Verdict(
                placeholder, False, UNSUPPORTED_VALUE, "; ".join(route.problems) or "no parentRefs"
            )
            continue
        for i, parent in enumerate(route.parents):
            key = (route.namespace, route.name, i)
            if not (parent.ours or parent.problem):
                hint = near_miss(world, route, parent, i)
                if hint is not None:
                    verdicts[key] = Verdict(parent, False, NOT_A_SERVICE_PARENT, hint, hint=True)
                continue
            if route.problems:
                verdicts[key] = Verdict(parent, False, UNSUPPORTED_VALUE, "; ".join(route.problems))
                continue
            skey = parent_service_key(route, parent)
            svc = world.service(*skey) if parent.namespace in (None, route.namespace) else None
            problem = _parent_mismatch(svc, parent, route, world)
            if problem is not None:
                reason = (
                    UNSUPPORTED_VALUE
                    if parent.problem or parent.namespace not in (None, route.namespace)
                    else NO_MATCHING_PARENT
                )
                verdicts[key] = Verdict(parent, False, reason, problem)
            elif svc is not None and not carries(svc, parent):
                verdicts[key] = _not_carried(world, route, parent, svc)
            else:
                claims.setdefault(skey, []).append((route, i))
    winners: dict[tuple[str, str], tuple[RouteView, tuple[int, ...]]] = {}
    for skey, claimants in claims.items():
        first = claimants[0][0]
        winners[skey] = (first, tuple(i for r, i in claimants if r.key == first.key))
        svc = world.service(*skey)
        for route, i in claimants:
            if route.key != first.key and svc is not None:
                verdicts[(route.namespace, route.name, i)] = _not_routing(world, route, route.parents[i], svc, first)
    return winners, verdicts


def _not_carried(world: World, route: RouteView, parent: ParentRef, svc: ServiceView) -> Verdict:
    """A parentRef scoped to a UDP port of svc the mesh does not carry: another parent than the carried port
    (GEP-1294: a route whose parentRef sets `port` MUST be associated only with that port), so it takes nothing
    from the routes there. Accepted=False NoMatchingParent (the spec's reason for a parentRef whose port or
    sectionName matches nothing the implementation serves), naming the carried port; its backendRefs resolved as
    for any route."""
    _arm, v = resolve_route_on(world, route, parent, svc)
    port, carried = scoped_port(svc, parent), carried_port(svc)
    assert port is not None and carried is not None  # _parent_mismatch found the port
    message = (
        f"Service {svc.namespace}/{svc.name} port {describe(port)} is not carried by the mesh: pods dial a Service "
        f"on {L4_OUTBOUND_PORT}, one UDP port per Service, and the port carried is {describe(carried)} (the first "
        f"by name); a route on it names that port (sectionName {carried.name!r}) or none"
        if carried.name
        else f"Service {svc.namespace}/{svc.name} port {describe(port)} is not carried by the mesh: pods dial a "
        f"Service on {L4_OUTBOUND_PORT}, one UDP port per Service, and the port carried is {describe(carried)}; a "
        f"route on it names that port (port {carried.port}) or none"
    )
    return replace(
        v, accepted=False, accepted_reason=NO_MATCHING_PARENT, accepted_message=message, chosen=None, routing=False
    )


def _not_routing(world: World, route: RouteView, parent: ParentRef, svc: ServiceView, first: RouteView) -> Verdict:
    """A newer route on a parent the older `first` routes: Accepted (the Gateway API defines no route reason for a
    conflict; upstream's UDPRouteMultipleRoutesAttachment expects both routes Accepted, only the oldest carrying
    traffic), its backendRefs resolved as for any route, and the message saying it carries no traffic."""
    _arm, v = resolve_route_on(world, route, parent, svc)
    message = (
        f"Service {svc.namespace}/{svc.name} is routed by the older UDPRoute {first.namespace}/{first.name} "
        "(the oldest route on a parent wins): this route carries no traffic for it while that one is attached"
    )
    return replace(v, accepted_message=message + rules_note(route.rules), chosen=None, routing=False)
