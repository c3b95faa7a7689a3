"""Upstream Gateway API v1.6.1's UDPRoute conformance manifests, unchanged (tests/operator/data/gateway-api-conformance),
re-parented to Services in meshed namespaces as GEP-1294 has a mesh route name its parent: each Gateway becomes a
Service of its name with one port per listener (the listener's name and port; UDP stays UDP, anything else is TCP),
each parentRef to it gets `group: ""`, `kind: Service` (its sectionName and port kept: they now name a Service
port). Backend Services lose their selector (no pods here: an EndpointSlice per Service stands for the Deployment).
Each test makes the status assertions upstream's test makes, and checks the arm the data path is built from where
upstream sends traffic (tests/e2e carry the datagrams)."""

from __future__ import annotations

import copy
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from aether.operator.routestatus import CONTROLLER_NAME
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, unique
from aether.testing.wait import wait_for

DATA = Path(__file__).parent / "data" / "gateway-api-conformance"
INFRA, APP_BACKEND = "gateway-conformance-infra", "gateway-conformance-app-backend"
GATEWAY = "gateway.networking.k8s.io"
Obj = dict[str, Any]
PARENT = "conformance.aether.dev/was-gateway"  # a label on the Services made from upstream's Gateways


def _renamed(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _renamed(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v, names) for v in value]
    return names.get(value, value) if isinstance(value, str) else value


def reparent(doc: Obj) -> Obj | None:
    """One upstream object as a mesh user would write it; None for what has no mesh counterpart (Deployments)."""
    doc = copy.deepcopy(doc)
    kind = doc["kind"]
    if kind == "Deployment":
        return None
    if kind == "Gateway":
        ports = [
            (lst["name"], lst["port"], "UDP" if lst["protocol"] == "UDP" else "TCP") for lst in doc["spec"]["listeners"]
        ]
        svc = o.service(doc["metadata"]["namespace"], doc["metadata"]["name"], None, ports)
        svc["metadata"]["labels"] = {PARENT: "true"}
        return svc
    if kind == "Service":
        doc["spec"].pop("selector", None)
    if kind == "UDPRoute":
        for p in doc["spec"]["parentRefs"]:
            if p.get("kind", "Gateway") == "Gateway" and p.get("group", GATEWAY) == GATEWAY:
                p["group"], p["kind"] = "", "Service"
    return doc


class Conformance:
    """Upstream's two namespaces (unique names, meshed), a node with a client pod, and upstream's base Services."""

    def __init__(self, k: Cluster) -> None:
        self.k = k
        self.infra, self.backend = unique("gwc-infra"), unique("gwc-app")
        self.names = {INFRA: self.infra, APP_BACKEND: self.backend}
        self.node = unique("gwc-node")
        self._ips = iter(range(1, 250))
        k.apply(o.namespace(self.infra))
        k.apply(o.namespace(self.backend))
        k.apply(o.node(self.node))
        k.apply(o.pod(self.infra, "client", self.node, "client"), status=o.pod_status("10.72.0.2"))
        # conformance/base/manifests.yaml's coredns Service (port 53 UDP, named udp-dns)
        self.backend_service(o.service(self.infra, "coredns", None, [("udp-dns", 53, "UDP")]))

    def backend_service(self, svc: Obj) -> None:
        self.k.apply(svc)
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        ports = [(p["name"], p.get("targetPort", p["port"]), p["protocol"]) for p in svc["spec"]["ports"]]
        self.k.apply(o.endpoint_slice(ns, name, ports, [(f"10.72.1.{next(self._ips)}", True, None)]))

    def objects(self, path: str) -> list[Obj]:
        with open(DATA / path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for d in docs:  # the examples name no namespace: they go into the infrastructure namespace
            d["metadata"].setdefault("namespace", INFRA)
        return [r for d in docs if (r := reparent(_renamed(d, self.names))) is not None]

    def apply(self, path: str) -> list[Obj]:
        objs = self.objects(path)
        for obj in objs:
            if obj["kind"] == "Service" and PARENT not in obj["metadata"].get("labels", {}):
                self.backend_service(obj)
            else:
                self.k.apply(obj)
        return objs

    def entry(self, route: str, parent: str, section: str | None = None) -> Obj | None:
        r = self.k.route(self.infra, route, "v1") or {}
        parents: list[Obj] = (r.get("status") or {}).get("parents") or []
        for p in parents:
            ref = p["parentRef"]
            if p["controllerName"] == CONTROLLER_NAME and ref["name"] == parent and ref.get("sectionName") == section:
                assert (ref["group"], ref["kind"]) == ("", "Service")
                gen = r["metadata"]["generation"]
                assert all(c["observedGeneration"] == gen for c in p["conditions"])
                return p
        return None

    def condition(self, route: str, parent: str, type_: str, section: str | None = None) -> tuple[str, str] | None:
        found = self.full_condition(route, parent, type_, section)
        return None if found is None else (found["status"], found["reason"])

    def full_condition(self, route: str, parent: str, type_: str, section: str | None = None) -> Obj | None:
        conditions: list[Obj] = (self.entry(route, parent, section) or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == type_), None)

    def must_have(self, route: str, parent: str, type_: str, want: tuple[str, str], section: str | None = None) -> None:
        """kubernetes.UDPRouteMustHaveCondition: our entry for the parent carries the condition."""
        wait_for(
            lambda: self.condition(route, parent, type_, section) == want,
            what=f"{route} {type_}={want} for {parent}",
            ignore=READ_ERRORS,
        )

    def accepted(self, route: str, parent: str, section: str | None = None) -> None:
        """kubernetes.GatewayAndUDPRoutesMustBeAccepted, for the route's side: Accepted=True for the parent."""
        self.must_have(route, parent, "Accepted", ("True", "Accepted"), section)

    def arm(self, parent: str) -> Obj | None:
        return self.k.arm(self.node, f"{self.infra}/{parent}")


@pytest.fixture
def gwc(cluster: Cluster) -> Conformance:
    return Conformance(cluster)


def test_simple(gwc: Conformance) -> None:
    gwc.apply("conformance/tests/udproute-simple.yaml")
    gwc.accepted("udp-coredns", "udp-gateway", "coredns")
    gwc.must_have("udp-coredns", "udp-gateway", "ResolvedRefs", ("True", "ResolvedRefs"), "coredns")
    arm = wait_for(lambda: gwc.arm("udp-gateway"), what="the parent's arm", ignore=READ_ERRORS)
    assert arm["cluster"] == f"udp:{gwc.infra}/coredns"


def test_invalid_backendref_nonexistent(gwc: Conformance) -> None:
    gwc.apply("conformance/tests/udproute-invalid-backendref-nonexistent.yaml")
    route, parent = "udp-route-invalid-backend-ref-nonexistent", "udp-gateway-invalid-backend"
    gwc.must_have(route, parent, "ResolvedRefs", ("False", "BackendNotFound"), "udp")


def test_invalid_cross_namespace_backend_ref(gwc: Conformance) -> None:
    gwc.apply("conformance/tests/udproute-invalid-cross-namespace-backend-ref.yaml")
    route, parent = "udp-route-invalid-cross-namespace-backend-ref", "udp-gateway-invalid-cross-namespace-backend-ref"
    gwc.accepted(route, parent, "udp")  # still Accepted though its backend is not permitted
    gwc.must_have(route, parent, "ResolvedRefs", ("False", "RefNotPermitted"), "udp")


def test_reference_grant(gwc: Conformance) -> None:
    gwc.apply("conformance/tests/udproute-reference-grant.yaml")
    route, parent = "udp-route-reference-grant", "udp-gateway-reference-grant"
    gwc.accepted(route, parent, "udp")
    gwc.must_have(route, parent, "ResolvedRefs", ("True", "ResolvedRefs"), "udp")
    wanted = f"udp:{gwc.backend}/udp-echo-reference-grant"
    wait_for(lambda: (gwc.arm(parent) or {}).get("cluster") == wanted, what="the arm on the granted backend")
    gwc.k.delete(f"{GATEWAY}/v1beta1", "ReferenceGrant", "udp-reference-grant", gwc.backend)
    gwc.must_have(route, parent, "ResolvedRefs", ("False", "RefNotPermitted"), "udp")
    wait_for(lambda: (gwc.arm(parent) or {}).get("cluster") == "blackhole", what="the arm blackholed")


def test_weighted_routing(gwc: Conformance) -> None:
    gwc.apply("conformance/tests/udproute-weighted-routing.yaml")
    gwc.accepted("udp-weighted-route", "udp-weighted-gateway", "udp")

    def shares() -> dict[str, float] | None:
        backends = (gwc.arm("udp-weighted-gateway") or {}).get("backends") or []
        return {b["backend"].split("/")[1]: b["share"] for b in backends} or None

    got = wait_for(shares, what="the split arm", ignore=READ_ERRORS)
    assert got == {"udp-backend-v1": 70, "udp-backend-v2": 30, "udp-backend-v3": 0}


def test_not_allowed_by_listeners(gwc: Conformance) -> None:
    """Upstream: Accepted=False NotAllowedByListeners (a Gateway whose only listener is TLS). A Service has no
    listeners and no allowedRoutes; re-parented, its only port is TCP, and the spec's reason for a parentRef whose
    sectionName matches nothing the route can attach to is NoMatchingParent."""
    gwc.apply("conformance/tests/udproute-not-allowed-by-listeners.yaml")
    route, parent = "udproute-not-allowed-by-listeners", "udproute-tls-only-gateway"
    gwc.must_have(route, parent, "Accepted", ("False", "NoMatchingParent"), "tls")


def test_multiple_routes_attachment(gwc: Conformance) -> None:
    """Upstream: both routes Accepted=True, only the oldest carries traffic (the newer route is applied a second
    later, as upstream's test does, so creation order is unambiguous)."""
    gwc.apply("conformance/tests/udproute-multiple-routes-attachment.yaml")
    parent = "udp-multi-route-attach-gateway"
    gwc.accepted("udproute-attach-older", parent, "udp")
    older = f"udp:{gwc.infra}/udp-attach-backend-1"
    wait_for(lambda: (gwc.arm(parent) or {}).get("cluster") == older, what="the older route's arm")
    objs = gwc.objects("conformance/tests/udproute-multiple-routes-attachment.yaml")
    newer = next(r for r in objs if r["kind"] == "UDPRoute")  # upstream's test builds it in Go: the older's twin
    newer["metadata"]["name"] = "udproute-attach-newer"
    newer["spec"]["rules"][0]["backendRefs"][0]["name"] = "udp-attach-backend-2"
    time.sleep(1.0)  # creationTimestamp has second precision
    gwc.k.apply(newer)
    gwc.accepted("udproute-attach-older", parent, "udp")
    gwc.accepted("udproute-attach-newer", parent, "udp")
    assert (gwc.arm(parent) or {}).get("cluster") == older


def test_example_udp_routing(gwc: Conformance) -> None:
    """examples/standard/udp-routing: a Gateway with listener foo (8080) and a route on sectionName foo to
    my-foo-service:6000."""
    gwc.backend_service(o.service(gwc.infra, "my-foo-service", None, [("udp", 6000, "UDP")]))
    gwc.apply("examples/standard/udp-routing/gateway.yaml")
    gwc.apply("examples/standard/udp-routing/udp-route.yaml")
    gwc.accepted("udp-app-1", "my-udp-gateway", "foo")
    want = f"udp:{gwc.infra}/my-foo-service"
    wait_for(lambda: (gwc.arm("my-udp-gateway") or {}).get("cluster") == want, what="the example's arm")


def _not_carried(gwc: Conformance, route: str, parent: str, section: str, carried: str) -> None:
    """A route scoped to a port of the parent the mesh does not carry: not attached (Accepted=False
    NoMatchingParent, the message naming the port the mesh carries), its backendRefs still resolved."""
    gwc.must_have(route, parent, "Accepted", ("False", "NoMatchingParent"), section)
    msg = (gwc.full_condition(route, parent, "Accepted", section) or {})["message"]
    assert carried in msg and "18082" in msg, msg
    assert gwc.condition(route, parent, "ResolvedRefs", section) == ("True", "ResolvedRefs")


def _past_the_second_of(gwc: Conformance, route: str) -> None:
    """Wait until the API server's clock has passed the second `route` was created in (creationTimestamp has
    second precision): a route applied after this is strictly newer."""
    created = (gwc.k.route(gwc.infra, route, "v1") or {})["metadata"]["creationTimestamp"]
    stamp = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    wait_for(lambda: datetime.now(UTC) >= stamp + timedelta(seconds=1), what="the next second")


def test_parentref_port_and_section_name(gwc: Conformance) -> None:
    """Upstream (UDPRouteParentRefPortAndSectionName): three routes on three UDP listeners, selected by port, by
    sectionName, by both; each Accepted and carrying its own listener's traffic. Re-parented they name three UDP
    ports of one Service: GEP-1294 "If `port` is set, the implementation MUST associate the route only with that
    port", so they are three parents and none takes another's. The mesh carries one UDP port per Service (pods dial
    it on 18082; the first by name, here by-port 5300): the route on it programs the arm, the two on the other ports
    are told the mesh cannot carry them. The route on the carried port is applied last, a second later, so on the
    old whole-Service attachment it would have lost the Service to the older routes."""
    path = "conformance/tests/udproute-parentref-port-and-section-name.yaml"
    objs = gwc.objects(path)
    parent = "udp-multi-listener-gateway"
    last = next(r for r in objs if r["metadata"]["name"] == "udp-route-by-port")
    for obj in objs:
        if obj is last:
            continue
        if obj["kind"] == "Service" and PARENT not in obj["metadata"].get("labels", {}):
            gwc.backend_service(obj)
        else:
            gwc.k.apply(obj)
    gwc.must_have("udp-route-by-section", parent, "Accepted", ("False", "NoMatchingParent"), "by-section")
    _past_the_second_of(gwc, "udp-route-by-section-and-port")
    gwc.k.apply(last)
    gwc.accepted("udp-route-by-port", parent)
    assert (gwc.entry("udp-route-by-port", parent) or {})["parentRef"]["port"] == 5300
    want = f"udp:{gwc.infra}/udp-echo-by-port"
    wait_for(lambda: (gwc.arm(parent) or {}).get("cluster") == want, what="the carried port's route's arm")
    _not_carried(gwc, "udp-route-by-section", parent, "by-section", "by-port (5300/UDP)")
    _not_carried(gwc, "udp-route-by-section-and-port", parent, "by-section-and-port", "by-port (5300/UDP)")
    assert (gwc.arm(parent) or {}).get("cluster") == want


def test_parentref_attach_all_listeners(gwc: Conformance) -> None:
    """Upstream (UDPRouteParentRefAttachAllListeners): a parentRef with neither port nor sectionName attaches to
    every UDP listener. GEP-1294: "If `port` is not set, the implementation MUST associate the route with all
    ports defined in the Service"; the mesh carries one of them (udp-1, 5310, the first by name), and the route is
    Accepted on it, its message naming the port carried."""
    gwc.apply("conformance/tests/udproute-parentref-attach-all-listeners.yaml")
    parent = "udp-attach-all-listeners-gateway"
    gwc.accepted("udp-route-attach-all", parent)
    msg = (gwc.full_condition("udp-route-attach-all", parent, "Accepted") or {})["message"]
    assert "udp-1 (5310/UDP)" in msg, msg
    want = f"udp:{gwc.infra}/udp-echo-attach-all"
    wait_for(lambda: (gwc.arm(parent) or {}).get("cluster") == want, what="the route's arm")


def test_example_basic_udp(gwc: Conformance) -> None:
    """examples/standard/basic-udp.yaml (upstream main, after v1.6.1): listeners foo (8080) and bar (8090), route
    udp-app-1 on sectionName foo to my-foo-service:6000, udp-app-2 on bar to my-bar-service:6000. Re-parented the
    two are routes on two ports of one Service: the mesh carries bar (the first by name), so udp-app-2 programs
    the arm and udp-app-1 is told, not silently lost."""
    gwc.backend_service(o.service(gwc.infra, "my-foo-service", None, [("udp", 6000, "UDP")]))
    gwc.backend_service(o.service(gwc.infra, "my-bar-service", None, [("udp", 6000, "UDP")]))
    gwc.apply("examples/standard/basic-udp.yaml")
    gwc.accepted("udp-app-2", "my-udp-gateway", "bar")
    want = f"udp:{gwc.infra}/my-bar-service"
    wait_for(lambda: (gwc.arm("my-udp-gateway") or {}).get("cluster") == want, what="the carried port's arm")
    _not_carried(gwc, "udp-app-1", "my-udp-gateway", "foo", "bar (8090/UDP)")
