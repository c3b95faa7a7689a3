"""Port-scoped attachment (pure): a parentRef's `port` and `sectionName` select one UDP port of its Service
(GEP-1294: "If `port` is set, the implementation MUST associate the route only with that port"; when both are set
the port must match both). The mesh carries one UDP port per Service (pods dial every Service on 18082; the first
UDP port by name): a route on it programs the arm, a route on another port of the same Service is another parent
(it takes nothing from the carried port's routes) and is told it is not carried; a parentRef naming no port
attaches to the carried port."""

from __future__ import annotations

from typing import Any

from aether.operator.reconcile.model import ClusterModel
from aether.operator.reconcile.routes import Verdict
from aether.testing.apitestbed import objects as o

PORTS = [("alpha", 53, "UDP"), ("beta", 54, "UDP"), ("gamma", 55, "UDP"), ("web", 80, "TCP")]


def world() -> ClusterModel:
    m = ClusterModel()
    m.apply_raw("namespace", o.namespace("app"))
    m.apply_raw("node", {"metadata": {"name": "n1", "uid": "u1"}})
    pod = o.pod("app", "client", "n1", "client")
    pod["metadata"]["uid"] = "uid-client"
    pod.update(o.pod_status("10.0.0.2"))
    m.apply_raw("pod", pod)
    m.apply_raw("service", o.service("app", "front", "10.96.0.10", PORTS))
    for i, name in enumerate(["b1", "b2", "b3"]):
        m.apply_raw("service", o.service("app", name, f"10.96.0.{20 + i}", [("dns", 53, "UDP")]))
        m.apply_raw("slice", o.endpoint_slice("app", name, [("dns", 5353, "UDP")], [(f"10.1.0.{i}", True, None)]))
    return m


def route(m: ClusterModel, name: str, backend: str, created: str, *parents: dict[str, Any]) -> None:
    body = o.udproute("app", name, "front", [o.backend(backend, 53)], version="v1")
    body["spec"]["parentRefs"] = [{"group": "", "kind": "Service", "name": "front", **p} for p in parents or [{}]]
    body["metadata"].update({"generation": 1, "creationTimestamp": created})
    m.apply_raw("route", body)


def verdicts(m: ClusterModel) -> tuple[dict[str, tuple[Verdict, ...]], str]:
    """The route verdicts by route name, and the cluster of front's arm."""
    out = m.reconcile(full=True)
    arm = next(a for a in out.nodes["n1"].udp.services if a.service == "app/front")
    return {name: v for (_, name), v in out.routes.items()}, arm.cluster


def test_three_routes_on_three_ports_each_is_its_own_parent() -> None:
    """The routes on the ports the mesh does not carry are older: on whole-Service attachment they took the
    Service (the oldest route on a parent wins) and the carried port's route carried nothing."""
    m = world()
    route(m, "on-gamma", "b3", "2026-01-01T00:00:00Z", {"sectionName": "gamma", "port": 55})
    route(m, "on-beta", "b2", "2026-01-02T00:00:00Z", {"port": 54})
    route(m, "on-alpha", "b1", "2026-01-03T00:00:00Z", {"sectionName": "alpha"})
    got, cluster = verdicts(m)
    assert cluster == "udp:app/b1"
    (alpha,) = got["on-alpha"]
    assert (alpha.accepted, alpha.accepted_reason, alpha.routing) == (True, "Accepted", True)
    for name, port in (("on-beta", "beta (54/UDP)"), ("on-gamma", "gamma (55/UDP)")):
        (v,) = got[name]
        assert (v.accepted, v.accepted_reason, v.routing, v.chosen) == (False, "NoMatchingParent", False, None)
        assert f"port {port} is not carried" in v.accepted_message and "alpha (53/UDP)" in v.accepted_message
        assert "18082" in v.accepted_message and v.resolved
        assert "older" not in v.accepted_message  # not a second route on the carried port


def test_a_route_naming_no_port_is_on_the_carried_port() -> None:
    """With a route on another port older than it, a route naming no port still programs the arm; one naming the
    carried port by number and newer than it is Accepted but carries nothing (two routes on one parent)."""
    m = world()
    route(m, "on-beta", "b2", "2026-01-01T00:00:00Z", {"sectionName": "beta"})
    route(m, "whole", "b1", "2026-01-02T00:00:00Z")
    route(m, "on-53", "b3", "2026-01-03T00:00:00Z", {"port": 53})
    got, cluster = verdicts(m)
    assert cluster == "udp:app/b1"
    (whole,) = got["whole"]
    assert whole.accepted and whole.routing
    assert "of its UDP ports the mesh carries alpha (53/UDP)" in whole.accepted_message
    (on_53,) = got["on-53"]
    assert (on_53.accepted, on_53.routing) == (True, False) and "app/whole" in on_53.accepted_message
    assert got["on-beta"][0].accepted_reason == "NoMatchingParent"


def test_one_route_on_two_ports_attaches_on_the_carried_one_only() -> None:
    """Two parentRefs to one Service with their sectionNames (what upstream's CEL asks for): the carried port's
    entry Accepted and routing, the other's NoMatchingParent; the route programs the arm."""
    m = world()
    route(m, "both", "b2", "2026-01-01T00:00:00Z", {"sectionName": "beta"}, {"sectionName": "alpha"})
    got, cluster = verdicts(m)
    assert cluster == "udp:app/b2"
    beta, alpha = got["both"]
    assert (beta.parent.section_name, beta.accepted, beta.accepted_reason) == ("beta", False, "NoMatchingParent")
    assert (alpha.parent.section_name, alpha.accepted, alpha.routing) == ("alpha", True, True)


def test_port_and_section_name_must_select_one_port() -> None:
    """Both set: the name and the number of the selected port must match both values (the parentRef docs); a
    TCP port is no UDP parent."""
    m = world()
    route(m, "crossed", "b1", "2026-01-01T00:00:00Z", {"sectionName": "alpha", "port": 54})
    route(m, "tcp", "b1", "2026-01-02T00:00:00Z", {"sectionName": "web"})
    got, cluster = verdicts(m)
    assert cluster == "udp:app/front"  # no route attached: the Service's own arm
    (crossed,) = got["crossed"]
    assert (crossed.accepted, crossed.accepted_reason) == (False, "NoMatchingParent")
    assert "has no UDP port named 'alpha' and numbered 54" in crossed.accepted_message
    (tcp,) = got["tcp"]
    assert "has no UDP port named 'web'" in tcp.accepted_message
