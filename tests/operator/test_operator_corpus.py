"""The bad-input corpus against the real control plane (or the validating API test bed) and the real operator: what a user sees for each hostile
object, and that nothing unrelated moved. Long because: one table of cases per kind (routes the schema refuses,
routes the operator rejects, Services, EndpointSlices, ReferenceGrants, status tampering), each a few lines.

- `REFUSED`: the API refuses the write (422 Invalid) naming the field; nothing is stored.
- `ROUTES`: the route is stored; our status says why (condition type, status, reason, a message).
- `SERVICES` / `SLICES`: the node's MeshNode says it (a shape with its reason, the arm or its endpoints).
- `GRANTS`: a cross-namespace backendRef resolves exactly when a ReferenceGrant permits it.
- `TAMPER`: a user's patch of what the operator writes is undone (or refused by the schema).
After every case the control namespace's arms are what they were."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.dynamic.exceptions import UnprocessibleEntityError

from aether.operator.routestatus import CONTROLLER_NAME
from aether.testing.apitestbed import TestBed
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.faults import Faults
from aether.testing.apitestbed.harness import MERGE, READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.wait import wait_for

UDP = [("dns", 53, "UDP")]
SL = [("dns", 5353, "UDP")]
GW = "gateway.networking.k8s.io/v1alpha2"
MN = "mesh.aether.dev/v1alpha1"
_vips = (f"10.97.{i // 250}.{i % 250 + 1}" for i in itertools.count())


class Bed:
    def __init__(self, k: Cluster) -> None:
        self.k = k
        # the API test bed allocates nothing and validates no built-in kind: shapes a real server refuses reach the
        # operator only there (on the real control plane such a case asserts the server's refusal instead)
        self.emulated = isinstance(k.bed, TestBed)
        self.ctl, self.ns, self.other, self.node = unique("cc"), unique("cx"), unique("cy"), unique("cnode")
        self.plain = unique("cplain")
        for ns in (self.ctl, self.ns, self.other):
            k.apply(o.namespace(ns))
        k.apply(o.namespace(self.plain, meshed=False))
        k.apply(o.node(self.node))
        k.apply(o.pod(self.ctl, "client", self.node), status=o.pod_status("10.97.200.2"))
        for name in ("front", "back"):
            self.service(name, ns=self.ctl)
        k.apply(o.udproute(self.ctl, "control", "front", [o.backend("back", 53)]))
        self.before = wait_for(self.control_ready, what="control arms", ignore=READ_ERRORS)

    def service(
        self, name: str, ns: str | None = None, vip: str | None = None, ready: bool = True, ports: Any = UDP
    ) -> str:
        ns = ns or self.ns
        self.k.apply(o.service(ns, name, vip or next(_vips), ports))
        self.k.apply(o.endpoint_slice(ns, name, SL, [(f"10.97.{201 + len(name) % 50}.9", ready, None)]))
        return name

    def stored(self, body: dict[str, Any]) -> bool:
        """Apply a built-in object; on a real server a 422 naming the field is the case's outcome (False): it never
        reaches the operator (the server's message is what the user sees). The emulator stores everything."""
        if self.emulated:
            self.k.apply(body)
            return True
        try:
            self.k.apply(body)
        except UnprocessibleEntityError as exc:
            status: dict[str, Any] = json.loads(str(exc.body))
            assert status["details"]["causes"], status
            return False
        return True

    def mn(self) -> dict[str, Any]:
        return self.k.state(self.node)

    def arms(self, ns: str | None = None) -> dict[str, dict[str, Any]]:
        prefix = f"{ns or self.ns}/"
        return {
            a["service"]: a
            for a in (self.mn().get("udp") or {}).get("services") or []
            if a["service"].startswith(prefix)
        }

    def control_ready(self) -> dict[str, dict[str, Any]] | None:
        arms = self.arms(self.ctl)
        return arms if len(arms) == 2 and all(a["cluster"] == f"udp:{self.ctl}/back" for a in arms.values()) else None

    def shapes(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for s in (self.mn().get("udp") or {}).get("unsupportedShapes") or []:
            out.setdefault(s["route"], []).append(s)
        return out

    def conditions(self, name: str, ns: str | None = None) -> dict[str, dict[str, Any]]:
        r = self.k.route(ns or self.ns, name) or {}
        ours = [p for p in (r.get("status") or {}).get("parents") or [] if p.get("controllerName") == CONTROLLER_NAME]
        return {c["type"]: c for p in ours for c in p.get("conditions") or []}

    def unmoved(self) -> None:
        assert self.arms(self.ctl) == self.before, "an unrelated arm moved"


@pytest.fixture(scope="module")
def bed(api: tuple[str, Faults | None]) -> Iterator[Bed]:
    op = InProcessOperator(api[0])
    op.start()
    try:
        yield Bed(Cluster(*api))
        assert op.alive()
    finally:
        op.stop()


@pytest.fixture(autouse=True)
def _unrelated_never_move(bed: Bed) -> Iterator[None]:
    yield
    bed.unmoved()


def refused(fn: Callable[[], Any]) -> list[str]:
    with pytest.raises(UnprocessibleEntityError) as info:
        fn()
    status: dict[str, Any] = json.loads(str(info.value.body))
    assert status["code"] == 422 and status["reason"] == "Invalid" and status["message"], status
    return [c["field"] for c in status["details"]["causes"]]


# ---- the API refuses (the Gateway API schema) -------------------------------------------------------------------
def parent(name: str = "front", **extra: Any) -> dict[str, Any]:
    return {"group": "", "kind": "Service", "name": name, **extra}


def spec(parents: Any = None, backends: Any = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "parentRefs": [parent()] if parents is None else parents,
        "rules": [{"backendRefs": [o.backend("front", 53)] if backends is None else backends}],
    }
    return {**out, **extra}


REFUSED: list[tuple[str, Any, str]] = [
    ("weight-negative", spec(backends=[o.backend("front", 53, -1)]), "spec.rules[0].backendRefs[0].weight"),
    ("weight-huge", spec(backends=[o.backend("front", 53, 1_000_001)]), "spec.rules[0].backendRefs[0].weight"),
    (
        "weight-string",
        spec(backends=[{"name": "front", "port": 53, "weight": "x"}]),
        "spec.rules[0].backendRefs[0].weight",
    ),
    ("backend-port-0", spec(backends=[o.backend("front", 0)]), "spec.rules[0].backendRefs[0].port"),
    ("backend-port-65536", spec(backends=[o.backend("front", 65536)]), "spec.rules[0].backendRefs[0].port"),
    ("backend-port-string", spec(backends=[{"name": "front", "port": "53"}]), "spec.rules[0].backendRefs[0].port"),
    ("backend-no-name", spec(backends=[{"port": 53}]), "spec.rules[0].backendRefs[0].name"),
    ("backend-empty-name", spec(backends=[{"name": "", "port": 53}]), "spec.rules[0].backendRefs[0].name"),
    ("backend-bad-kind", spec(backends=[{"name": "f", "port": 53, "kind": "9x"}]), "spec.rules[0].backendRefs[0].kind"),
    (
        "backend-bad-group",
        spec(backends=[{"name": "f", "port": 53, "group": "Bad Group"}]),
        "spec.rules[0].backendRefs[0].group",
    ),
    (
        "backend-bad-ns",
        spec(backends=[{"name": "f", "port": 53, "namespace": "UPPER"}]),
        "spec.rules[0].backendRefs[0].namespace",
    ),
    (
        "backend-empty-ns",
        spec(backends=[{"name": "f", "port": 53, "namespace": ""}]),
        "spec.rules[0].backendRefs[0].namespace",
    ),
    ("backend-not-object", spec(backends=[42]), "spec.rules[0].backendRefs[0]"),
    ("backends-17", spec(backends=[o.backend("front", 53)] * 17), "spec.rules[0].backendRefs"),
    ("backends-empty", spec(backends=[]), "spec.rules[0].backendRefs"),
    ("backends-not-list", spec(backends="front"), "spec.rules[0].backendRefs"),
    ("rules-17", {"parentRefs": [parent()], "rules": [{"backendRefs": [o.backend("front", 53)]}] * 17}, "spec.rules"),
    ("rules-empty", {"parentRefs": [parent()], "rules": []}, "spec.rules"),
    ("rules-missing", {"parentRefs": [parent()]}, "spec.rules"),
    ("rules-not-list", {"parentRefs": [parent()], "rules": {"a": 1}}, "spec.rules"),
    (
        "rule-bad-name",
        spec(**{"rules": [{"name": "Bad!", "backendRefs": [o.backend("front", 53)]}]}),
        "spec.rules[0].name",
    ),
    ("parents-33", spec(parents=[parent()] * 33), "spec.parentRefs"),
    ("parents-not-list", spec(parents="front"), "spec.parentRefs"),
    ("parent-no-name", spec(parents=[{"group": "", "kind": "Service"}]), "spec.parentRefs[0].name"),
    ("parent-empty-name", spec(parents=[parent("")]), "spec.parentRefs[0].name"),
    ("parent-port-0", spec(parents=[parent(port=0)]), "spec.parentRefs[0].port"),
    ("parent-port-70000", spec(parents=[parent(port=70000)]), "spec.parentRefs[0].port"),
    ("parent-bad-kind", spec(parents=[parent(kind="")]), "spec.parentRefs[0].kind"),
    ("parent-bad-section", spec(parents=[parent(sectionName="Bad_Name")]), "spec.parentRefs[0].sectionName"),
    ("parent-bad-ns", spec(parents=[parent(namespace="No")]), "spec.parentRefs[0].namespace"),
    ("parent-not-object", spec(parents=[42]), "spec.parentRefs[0]"),
    ("spec-missing", ..., "spec"),
    ("spec-string", "🙃", "spec"),
]


@pytest.mark.parametrize(("name", "body", "field"), REFUSED, ids=[c[0] for c in REFUSED])
def test_the_api_refuses_naming_the_field(bed: Bed, name: str, body: Any, field: str) -> None:
    route: dict[str, Any] = {"apiVersion": GW, "kind": "UDPRoute", "metadata": {"name": name, "namespace": bed.ns}}
    if body is not ...:
        route["spec"] = body
    assert field in refused(lambda: bed.k.apply(route))
    assert bed.k.route(bed.ns, name) is None


# ---- the operator rejects or resolves (stored routes) ----------------------------------------------------------
RouteCase = tuple[str, Callable[[Bed, str], dict[str, Any]], tuple[str, str, str]]


def _r(parents: list[dict[str, Any]], backends: list[dict[str, Any]]) -> Callable[[Bed, str], dict[str, Any]]:
    def build(b: Bed, name: str) -> dict[str, Any]:
        return {
            "apiVersion": GW,
            "kind": "UDPRoute",
            "metadata": {"name": name, "namespace": b.ns},
            "spec": {"parentRefs": parents, "rules": [{"backendRefs": backends}]},
        }

    return build


def _own(backends: Callable[[Bed, str], list[dict[str, Any]]], **pextra: Any) -> Callable[[Bed, str], dict[str, Any]]:
    """A route on its own fresh parent Service `<name>-p`, with backends built per case."""

    def build(b: Bed, name: str) -> dict[str, Any]:
        b.service(f"{name}-p")
        return _r([parent(f"{name}-p", **pextra)], backends(b, name))(b, name)

    return build


def _fresh(ready: bool = True, ports: Any = UDP) -> Callable[[Bed, str], list[dict[str, Any]]]:
    def make(b: Bed, name: str) -> list[dict[str, Any]]:
        b.service(f"{name}-b", ready=ready, ports=ports)
        return [o.backend(f"{name}-b", 53)]

    return make


def _raw(*refs: dict[str, Any]) -> Callable[[Bed, str], list[dict[str, Any]]]:
    return lambda b, name: [dict(r) for r in refs]


def _elsewhere(grant: str | None) -> Callable[[Bed, str], list[dict[str, Any]]]:
    """A backend in the other namespace, with a ReferenceGrant naming `grant` (None: no grant; '*': any Service)."""

    def make(b: Bed, name: str) -> list[dict[str, Any]]:
        far = unique("cz")  # its own namespace: another case's grant must not permit this one
        b.k.apply(o.namespace(far))
        b.service(f"{name}-far", ns=far)
        if grant is not None:
            svc = None if grant == "*" else (f"{name}-far" if grant == "it" else grant)
            b.k.apply(o.reference_grant(far, f"{name}-g", b.ns, svc))
        return [o.backend(f"{name}-far", 53, namespace=far)]

    return make


def _conflict(b: Bed, name: str) -> dict[str, Any]:
    b.service(f"{name}-p")
    # the same second as the older one is likely: a tie goes by name, so the first sorts first
    b.k.apply(_r([parent(f"{name}-p")], [o.backend("front", 53)])(b, f"a-{name}"))
    wait_for(lambda: b.conditions(f"a-{name}").get("Accepted"), what="the older route", ignore=READ_ERRORS)
    return _r([parent(f"{name}-p")], [o.backend("front", 53)])(b, name)


def _not_carried(b: Bed, name: str) -> dict[str, Any]:
    """A parentRef on a UDP port of its Service the mesh does not carry (it carries alt, the first by name)."""
    b.service(f"{name}-p", ports=[("dns", 53, "UDP"), ("alt", 54, "UDP")])
    return _r([parent(f"{name}-p", sectionName="dns")], [o.backend("front", 53)])(b, name)


def _duplicate_parent(b: Bed, name: str) -> dict[str, Any]:
    vip = next(_vips)
    b.service(f"{name}-old", vip=vip)
    wait_for(lambda: f"{b.ns}/{name}-old" in b.arms(), what="the older Service's arm", ignore=READ_ERRORS)
    if b.emulated:
        b.service(f"{name}-p", vip=vip)
    else:  # the allocator refuses a taken ClusterIP: the route's parent is a Service that does not exist
        assert "spec.clusterIPs" in refused(lambda: b.service(f"{name}-p", vip=vip))
    return _r([parent(f"{name}-p")], [o.backend("front", 53)])(b, name)


def _headless(b: Bed, name: str) -> dict[str, Any]:
    b.k.apply(o.service(b.ns, f"{name}-p", "None", UDP))
    return _r([parent(f"{name}-p")], [o.backend("front", 53)])(b, name)


def _in(ns_attr: str) -> Callable[[Bed, str], dict[str, Any]]:
    def build(b: Bed, name: str) -> dict[str, Any]:
        ns = getattr(b, ns_attr)
        b.service(f"{name}-p", ns=ns)
        return _r([parent(f"{name}-p", namespace=ns)], [o.backend("front", 53)])(b, name)

    return build


def _two_backends(b: Bed, name: str) -> list[dict[str, Any]]:
    b.service(f"{name}-b1")
    b.service(f"{name}-b2")
    return [o.backend(f"{name}-b1", 53, 5), o.backend(f"{name}-b2", 53, 1)]


ACC_T, NOMATCH, UNSUP = (
    ("Accepted", "True", "Accepted"),
    ("Accepted", "False", "NoMatchingParent"),
    (
        "Accepted",
        "False",
        "UnsupportedValue",
    ),
)
ROUTES: list[RouteCase] = [
    ("plain", _own(_fresh()), ACC_T),
    ("parent-missing", _r([parent("nope")], [o.backend("front", 53)]), NOMATCH),
    ("parent-non-mesh", _in("plain"), UNSUP),
    ("parent-cross-ns", _in("other"), UNSUP),
    ("parent-headless", _headless, NOMATCH),
    ("parent-duplicate-vip", _duplicate_parent, NOMATCH),
    ("parent-port-mismatch", _own(_fresh(), port=99), NOMATCH),
    ("parent-section-mismatch", _own(_fresh(), sectionName="nope"), NOMATCH),
    ("parent-tcp-only", _r([parent("ctl-tcp")], [o.backend("front", 53)]), NOMATCH),
    ("parent-port-not-carried", _not_carried, NOMATCH),
    ("conflicted", _conflict, ("Accepted", "True", "Accepted")),  # the older carries the traffic
    ("backend-pod", _own(_raw({"kind": "Pod", "name": "p", "port": 53})), ("ResolvedRefs", "False", "InvalidKind")),
    (
        "backend-other-group",
        _own(_raw({"group": "example.com", "kind": "Thing", "name": "t", "port": 53})),
        ("ResolvedRefs", "False", "InvalidKind"),
    ),
    ("backend-missing", _own(_raw(o.backend("ghost", 53))), ("ResolvedRefs", "False", "BackendNotFound")),
    ("backend-no-port", _own(_raw({"name": "front"})), ("ResolvedRefs", "False", "BackendNotFound")),
    ("backend-port-mismatch", _own(_raw(o.backend("front", 54))), ("ResolvedRefs", "False", "BackendNotFound")),
    ("backend-tcp-only", _own(_fresh(ports=[("http", 80, "TCP")])), ("ResolvedRefs", "False", "BackendNotFound")),
    ("backend-not-ready", _own(_fresh(ready=False)), ACC_T),
    ("backend-drained", _own(_raw(o.backend("front", 53, 0))), ACC_T),  # a drain is supported: no shape
    ("backend-split", _own(_two_backends), ACC_T),  # so is a weighted split
    ("cross-ns-no-grant", _own(_elsewhere(None)), ("ResolvedRefs", "False", "RefNotPermitted")),
    ("cross-ns-grant-any", _own(_elsewhere("*")), ("ResolvedRefs", "True", "ResolvedRefs")),
    ("cross-ns-grant-it", _own(_elsewhere("it")), ("ResolvedRefs", "True", "ResolvedRefs")),
    ("cross-ns-grant-other-name", _own(_elsewhere("someone-else")), ("ResolvedRefs", "False", "RefNotPermitted")),
    (
        "two-parents-one-missing",
        lambda b, n: _r([parent("front-x"), parent("nope")], [o.backend("front", 53)])(b, n),
        NOMATCH,
    ),
    ("unicode-backend", _own(_raw(o.backend("bäckend-☃", 53))), ("ResolvedRefs", "False", "BackendNotFound")),
]


# upstream Gateway API v1.6.1's CEL rules refuse these (the emulator, without CEL, stores them): case -> field
REFUSED_BY_UPSTREAM_CEL = {"backend-no-port": "spec.rules[0].backendRefs[0]"}


@pytest.mark.parametrize(("name", "build", "want"), ROUTES, ids=[c[0] for c in ROUTES])
def test_a_stored_route_gets_the_condition_that_says_why(
    bed: Bed, name: str, build: Callable[[Bed, str], dict[str, Any]], want: tuple[str, str, str]
) -> None:
    if name == "parent-tcp-only":
        bed.k.apply(o.service(bed.ns, "ctl-tcp", next(_vips), [("http", 80, "TCP")]))
    if name == "two-parents-one-missing":
        bed.service("front-x")
    if name in REFUSED_BY_UPSTREAM_CEL and not bed.emulated:
        assert REFUSED_BY_UPSTREAM_CEL[name] in refused(lambda: bed.k.apply(build(bed, name)))
        return
    bed.k.apply(build(bed, name))

    def found() -> dict[str, Any] | None:
        c = bed.conditions(name).get(want[0])
        return c if c and (c["type"], c["status"], c["reason"]) == want else None

    cond = wait_for(found, what=f"{name}: {want}", ignore=READ_ERRORS)
    assert cond["message"] and cond["observedGeneration"] == 1


# ---- Services and EndpointSlices: the node's MeshNode says it --------------------------------------------------
SERVICES: list[tuple[str, str | None, Any, str, bool]] = [
    # (name, clusterIP (None: a fresh one), ports, shape reason on the Service ("" none), has a UDP arm)
    ("vip-loopback", "127.0.0.1", UDP, "InvalidService", False),
    ("vip-loopback-6", "::1", UDP, "InvalidService", False),
    ("vip-unspecified", "0.0.0.0", UDP, "InvalidService", False),
    ("vip-unspecified-6", "::", UDP, "InvalidService", False),
    ("vip-link-local", "169.254.3.4", UDP, "InvalidService", False),
    ("vip-link-local-6", "fe80::1", UDP, "InvalidService", False),
    ("vip-zoned", "fe80::1%eth0", UDP, "InvalidService", False),
    ("vip-multicast", "224.0.0.251", UDP, "InvalidService", False),
    ("vip-garbage", "not-an-ip", UDP, "InvalidService", False),
    ("vip-headless", "None", UDP, "NoClusterIP", False),
    ("port-0", None, [("x", 0, "UDP"), ("dns", 53, "UDP")], "InvalidService", True),
    ("port-quic", None, [("x", 53, "QUIC"), ("dns", 53, "UDP")], "InvalidService", True),
    ("two-udp-ports", None, [("dns", 53, "UDP"), ("alt", 54, "UDP")], "MultipleUDPPorts", True),
    ("sctp-only", None, [("s", 53, "SCTP")], "", False),
    ("tcp-only", None, [("http", 80, "TCP")], "", False),
    ("ipv6-vip", "fd00::53", UDP, "", True),
]


@pytest.mark.parametrize(("name", "vip", "ports", "reason", "armed"), SERVICES, ids=[c[0] for c in SERVICES])
def test_a_service_shape_on_the_node(
    bed: Bed, name: str, vip: str | None, ports: Any, reason: str, armed: bool
) -> None:
    if not bed.stored(o.service(bed.ns, name, vip or next(_vips), ports)):
        return
    marker = bed.service(f"{name}-mark")  # written after it: once its arm is there, the case's pass is done
    wait_for(lambda: f"{bed.ns}/{marker}" in bed.arms(), what="the marker arm", ignore=READ_ERRORS)
    key = f"{bed.ns}/{name}"
    shapes = [s["reason"] for s in bed.shapes().get(key, [])]
    assert shapes == ([reason] if reason else []), shapes
    if reason:
        assert all(s["message"] for s in bed.shapes()[key])
    assert (key in bed.arms()) == armed


def test_a_duplicate_vip_keeps_the_older_and_names_it(bed: Bed) -> None:
    vip = next(_vips)
    old = bed.service("dup-old", vip=vip)
    wait_for(lambda: f"{bed.ns}/{old}" in bed.arms(), what="the older arm", ignore=READ_ERRORS)
    if not bed.emulated:  # a real allocator never hands out one ClusterIP twice
        assert "spec.clusterIPs" in refused(lambda: bed.service("dup-new", vip=vip, ns=bed.other))
        return
    new = bed.service("dup-new", vip=vip, ns=bed.other)
    wait_for(lambda: bed.shapes().get(f"{bed.other}/{new}"), what="the DuplicateVIP shape", ignore=READ_ERRORS)
    (shape,) = bed.shapes()[f"{bed.other}/{new}"]
    assert shape["reason"] == "DuplicateVIP" and f"{bed.ns}/{old}" in shape["message"]
    assert bed.arms()[f"{bed.ns}/{old}"]["vip"] == vip and f"{bed.other}/{new}" not in bed.arms(bed.other)


SLICES: list[tuple[str, list[tuple[str, bool, str | None]], Any, list[dict[str, Any]]]] = [
    ("eps-bad-ip", [("999.1.1.1", True, None), ("10.97.240.1", True, None)], SL, [{"ip": "10.97.240.1", "port": 5353}]),
    ("eps-not-ready", [("10.97.240.2", False, None)], SL, []),
    ("eps-port-name-mismatch", [("10.97.240.3", True, None)], [("other", 5353, "UDP")], []),
    ("eps-port-tcp", [("10.97.240.4", True, None)], [("dns", 5353, "TCP")], []),
    (
        "eps-mixed",
        [("10.97.240.5", True, None), ("10.97.240.6", False, None)],
        SL,
        [{"ip": "10.97.240.5", "port": 5353}],
    ),
    # an IPv6 slice on an IPv4-only Service: each VIP carries its own family's endpoints (an IPv4 datagram is
    # never sent on to an IPv6 pod address); the IPv6 Service's case is test_operator_dual_stack_model.py's
    ("eps-ipv6-on-an-ipv4-service", [("fd00::5", True, None)], SL, []),
]


@pytest.mark.parametrize(("name", "eps", "ports", "want"), SLICES, ids=[c[0] for c in SLICES])
def test_a_slice_gives_the_arm_exactly_its_usable_endpoints(
    bed: Bed, name: str, eps: list[tuple[str, bool, str | None]], ports: Any, want: list[dict[str, Any]]
) -> None:
    bed.k.apply(o.service(bed.ns, name, next(_vips), UDP))
    if not bed.stored(o.endpoint_slice(bed.ns, name, ports, eps)):
        return
    marker = bed.service(f"{name}-mark")
    wait_for(lambda: f"{bed.ns}/{marker}" in bed.arms(), what="the marker arm", ignore=READ_ERRORS)
    assert bed.arms()[f"{bed.ns}/{name}"]["endpoints"] == want


def test_a_slice_without_its_service_label_is_ignored(bed: Bed) -> None:
    bed.k.apply(o.service(bed.ns, "unlabelled", next(_vips), UDP))
    sl = o.endpoint_slice(bed.ns, "unlabelled", SL, [("10.97.241.1", True, None)])
    sl["metadata"]["labels"] = {}
    bed.k.apply(sl)
    marker = bed.service("unlabelled-mark")
    wait_for(lambda: f"{bed.ns}/{marker}" in bed.arms(), what="the marker arm", ignore=READ_ERRORS)
    assert bed.arms()[f"{bed.ns}/unlabelled"]["endpoints"] == []


# ---- ReferenceGrants the schema refuses -----------------------------------------------------------------------
GRANTS: list[tuple[str, dict[str, Any], str]] = [
    ("grant-no-from", {"to": [{"group": "", "kind": "Service"}]}, "spec.from"),
    ("grant-empty-from", {"from": [], "to": [{"group": "", "kind": "Service"}]}, "spec.from"),
    (
        "grant-from-no-ns",
        {"from": [{"group": "g", "kind": "UDPRoute"}], "to": [{"group": "", "kind": "Service"}]},
        "spec.from[0].namespace",
    ),
    ("grant-empty-to", {"from": [{"group": "g", "kind": "UDPRoute", "namespace": "x"}], "to": []}, "spec.to"),
    (
        "grant-to-no-kind",
        {"from": [{"group": "g", "kind": "UDPRoute", "namespace": "x"}], "to": [{"group": ""}]},
        "spec.to[0].kind",
    ),
    (
        "grant-17-from",
        {"from": [{"group": "g", "kind": "K", "namespace": "x"}] * 17, "to": [{"group": "", "kind": "Service"}]},
        "spec.from",
    ),
]


@pytest.mark.parametrize(("name", "grant_spec", "field"), GRANTS, ids=[c[0] for c in GRANTS])
def test_a_grant_the_schema_refuses(bed: Bed, name: str, grant_spec: dict[str, Any], field: str) -> None:
    body = {
        "apiVersion": "gateway.networking.k8s.io/v1beta1",
        "kind": "ReferenceGrant",
        "metadata": {"name": name, "namespace": bed.other},
        "spec": grant_spec,
    }
    assert field in refused(lambda: bed.k.apply(body))


# ---- status tampering: undone, or refused by the schema ---------------------------------------------------------
def _mn_status(bed: Bed, body: dict[str, Any]) -> None:
    bed.k.res(MN, "MeshNode").subresources["status"].patch(body={"status": body}, name=bed.node, content_type=MERGE)


def _slice_names(bed: Bed) -> list[str]:
    return [n for n in (bed.k.meshnode(bed.node) or {})["status"]["serviceSlices"]["names"] if n.startswith(bed.ctl)]


def _slice_spec(bed: Bed, body: dict[str, Any]) -> None:
    """Merge-patch the spec of the control namespace's slice (behind the operator's back)."""
    res = bed.k.res(MN, "MeshServiceSlice")
    res.patch(body={"spec": body}, name=_slice_names(bed)[0], content_type=MERGE)


def _slice_delete(bed: Bed) -> None:
    for name in _slice_names(bed):
        bed.k.delete(MN, "MeshServiceSlice", name)


def _route_status(bed: Bed, name: str, parents: list[Any]) -> None:
    res = bed.k.res(GW, "UDPRoute").subresources["status"]
    res.patch(body={"status": {"parents": parents}}, name=name, namespace=bed.ns, content_type=MERGE)


GOOD_COND = {
    "type": "Accepted",
    "status": "True",
    "reason": "Accepted",
    "message": "",
    "lastTransitionTime": "2020-01-01T00:00:00Z",
}
TAMPER_REFUSED: list[tuple[str, Callable[[Bed], None], str]] = [
    (
        "mn-condition-status",
        lambda b: _mn_status(b, {"conditions": [{"type": "Ready", "status": "Maybe", "reason": "X"}]}),
        "status.conditions[0].status",
    ),
    (
        "mn-condition-no-reason",
        lambda b: _mn_status(b, {"conditions": [{"type": "Ready", "status": "True"}]}),
        "status.conditions[0].reason",
    ),
    (
        "mn-pod-no-uid",
        lambda b: _mn_status(b, {"pods": [{"namespace": "a", "name": "b"}]}),
        "status.pods[0].uid",
    ),
    (
        "mn-endpoint-port-0",
        lambda b: _mn_status(
            b,
            {
                "quic": {
                    "destinations": [
                        {"service": "a/b", "serviceAccount": "s", "endpoints": [{"ip": "1.1.1.1", "port": 0}]}
                    ]
                }
            },
        ),
        "status.quic.destinations[0].endpoints[0].port",
    ),
    ("mn-summary-string", lambda b: _mn_status(b, {"summary": {"pods": "many"}}), "status.summary.pods"),
    (
        "slice-arm-no-vip",
        lambda b: _slice_spec(b, {"udp": {"services": [{"service": "a/b", "cluster": "c"}]}}),
        "spec.udp.services[0].vip",
    ),
    (
        "route-parent-no-name",
        lambda b: _route_status(
            b, "tamper", [{"parentRef": {"name": ""}, "controllerName": "a.b/c", "conditions": [GOOD_COND]}]
        ),
        "status.parents[0].parentRef.name",
    ),
    (
        "route-bad-controller",
        lambda b: _route_status(
            b, "tamper", [{"parentRef": {"name": "x"}, "controllerName": "nope", "conditions": [GOOD_COND]}]
        ),
        "status.parents[0].controllerName",
    ),
    (
        "route-condition-maybe",
        lambda b: _route_status(
            b,
            "tamper",
            [{"parentRef": {"name": "x"}, "controllerName": "a.b/c", "conditions": [{**GOOD_COND, "status": "Maybe"}]}],
        ),
        "status.parents[0].conditions[0].status",
    ),
    (
        "route-condition-bad-reason",
        lambda b: _route_status(
            b,
            "tamper",
            [
                {
                    "parentRef": {"name": "x"},
                    "controllerName": "a.b/c",
                    "conditions": [{**GOOD_COND, "reason": "no spaces!"}],
                }
            ],
        ),
        "status.parents[0].conditions[0].reason",
    ),
    (
        "route-9-conditions",
        lambda b: _route_status(
            b, "tamper", [{"parentRef": {"name": "x"}, "controllerName": "a.b/c", "conditions": [GOOD_COND] * 9}]
        ),
        "status.parents[0].conditions",
    ),
    (
        "route-33-parents",
        lambda b: _route_status(
            b, "tamper", [{"parentRef": {"name": "x"}, "controllerName": "a.b/c", "conditions": [GOOD_COND]}] * 33
        ),
        "status.parents",
    ),
]


@pytest.fixture(scope="module")
def tamper_route(bed: Bed) -> str:
    bed.service("tamper-p")
    bed.k.apply(_r([parent("tamper-p")], [o.backend("front", 53)])(bed, "tamper"))
    wait_for(lambda: bed.conditions("tamper").get("Accepted"), what="the tamper route's status", ignore=READ_ERRORS)
    return "tamper"


@pytest.mark.parametrize(("name", "tamper", "field"), TAMPER_REFUSED, ids=[c[0] for c in TAMPER_REFUSED])
def test_tampering_the_schema_refuses(
    bed: Bed, tamper_route: str, name: str, tamper: Callable[[Bed], None], field: str
) -> None:
    before = (bed.k.route(bed.ns, tamper_route) or {}).get("status"), bed.mn()
    assert field in refused(lambda: tamper(bed))
    assert ((bed.k.route(bed.ns, tamper_route) or {}).get("status"), bed.mn()) == before


def _arms_of(b: Bed) -> list[Any]:
    return sorted((a["service"], a["cluster"]) for a in (b.mn().get("udp") or {}).get("services") or [])


TAMPER_UNDONE: list[tuple[str, Callable[[Bed], None]]] = [
    (  # the operator writes quic.destinations empty: the tables are in the slices
        "mn-destinations-added",
        lambda b: _mn_status(
            b, {"quic": {"destinations": [{"service": "a/b", "serviceAccount": "s", "ports": [80], "endpoints": []}]}}
        ),
    ),
    ("slice-arms-wiped", lambda b: _slice_spec(b, {"udp": {"services": []}})),
    ("slice-count-lies", lambda b: _slice_spec(b, {"count": 7})),
    ("slice-deleted", _slice_delete),
    (
        "mn-ready-false",
        lambda b: _mn_status(
            b, {"conditions": [{**GOOD_COND, "type": "Ready", "status": "False", "reason": "Hacked"}]}
        ),
    ),
    ("mn-identities-added", lambda b: _mn_status(b, {"quic": {"identities": ["spiffe://evil/ns/x/sa/y"]}})),
    (
        "mn-summary-lies",
        lambda b: _mn_status(b, {"summary": {"pods": 999, "namespaces": 0, "slices": 0}}),
    ),
    ("mn-slice-names-wiped", lambda b: _mn_status(b, {"serviceSlices": {"names": []}})),
    ("mn-pods-wiped", lambda b: _mn_status(b, {"pods": []})),
    ("route-parents-wiped", lambda b: _route_status(b, "tamper", [])),
    (
        "route-fake-ours",
        lambda b: _route_status(
            b,
            "tamper",
            [
                {
                    "parentRef": {"group": "", "kind": "Service", "name": "ghost"},
                    "controllerName": CONTROLLER_NAME,
                    "conditions": [GOOD_COND],
                }
            ],
        ),
    ),
    (
        "route-stale-generation",
        lambda b: _route_status(
            b,
            "tamper",
            [
                {**p, "conditions": [{**c, "observedGeneration": 0} for c in p["conditions"]]}
                for p in ((b.k.route(b.ns, "tamper") or {}).get("status") or {}).get("parents") or []
            ],
        ),
    ),
]


@pytest.mark.parametrize(("name", "tamper"), TAMPER_UNDONE, ids=[c[0] for c in TAMPER_UNDONE])
def test_tampering_is_undone(bed: Bed, tamper_route: str, name: str, tamper: Callable[[Bed], None]) -> None:
    def view() -> Any:
        mn = dict(bed.mn())
        mn["conditions"] = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"}
            for c in mn.get("conditions") or []
            if c["type"] != "Programmed"
        ]
        r = ((bed.k.route(bed.ns, tamper_route) or {}).get("status") or {}).get("parents") or []
        parents = [
            {**p, "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in p["conditions"]]}
            for p in r
        ]
        return mn, parents

    before = view()
    tamper(bed)
    wait_for(lambda: view() == before, timeout=5.0, what=f"{name} undone within the resync bound", ignore=READ_ERRORS)


def test_the_corpus_has_a_hundred_cases() -> None:
    n = len(REFUSED) + len(ROUTES) + len(SERVICES) + 1 + len(SLICES) + 1 + len(GRANTS)
    n += len(TAMPER_REFUSED) + len(TAMPER_UNDONE)
    assert n >= 100, n
