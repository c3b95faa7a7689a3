"""One Service's bad ClusterIP stays with that Service: two Services with one ClusterIP (a restore, an import, a
hand-set clusterIP) resolve to the oldest (ties by namespace/name) and the other gets a DuplicateVIP shape naming
it; a loopback, unspecified, link-local, multicast or zoned ClusterIP is InvalidService with no arm. Every other
arm of the node is untouched, incrementally and from scratch alike."""

from __future__ import annotations

from typing import Any

import pytest

from aether.api.meshnode import EffectiveStatus
from aether.operator.reconcile.model import ClusterModel
from aether.testing.apitestbed import objects as o

UDP = [("dns", 53, "UDP")]
BOTH = [("dns", 53, "UDP"), ("web", 80, "TCP")]
SL = [("dns", 5353, "UDP")]


def svc(m: ClusterModel, ns: str, name: str, vip: str, created: str, ports: Any = UDP) -> None:
    body = o.service(ns, name, vip, ports)
    body["metadata"]["creationTimestamp"] = created
    m.apply_raw("service", body)
    m.apply_raw("slice", o.endpoint_slice(ns, name, SL, [("10.1.0.9", True, None)]))


def mesh() -> ClusterModel:
    m = ClusterModel()
    for ns in ("alpha", "beta"):
        m.apply_raw("namespace", o.namespace(ns))
    m.apply_raw("node", {"metadata": {"name": "n1", "uid": "u1"}})
    pod = {**o.pod("alpha", "client", "n1"), **o.pod_status("10.0.0.2")}
    pod["metadata"]["uid"] = "p1"
    m.apply_raw("pod", pod)
    svc(m, "alpha", "bystander", "10.96.0.1", "2026-01-01T00:00:00Z")
    return m


def status(m: ClusterModel) -> EffectiveStatus:
    out = m.reconcile()
    return out.nodes["n1"] if "n1" in out.nodes else m.reconcile(full=True).nodes["n1"]


def arms(st: EffectiveStatus, transport: str = "udp") -> dict[str, str]:
    return {a.service: a.vip for a in getattr(st, transport).services}


def shapes(st: EffectiveStatus) -> dict[str, tuple[str, str]]:
    return {s.route: (s.reason, s.message) for s in st.udp.unsupported_shapes}


def test_the_older_service_keeps_a_duplicated_vip_and_the_other_is_told_who() -> None:
    m = mesh()
    svc(m, "beta", "young", "10.96.0.5", "2026-03-01T00:00:00Z", BOTH)
    svc(m, "alpha", "old", "10.96.0.5", "2026-02-01T00:00:00Z", BOTH)
    st = status(m)
    assert arms(st) == {"alpha/bystander": "10.96.0.1", "alpha/old": "10.96.0.5"}
    assert arms(st, "tcp") == {"alpha/old": "10.96.0.5"}
    reason, message = shapes(st)["beta/young"]
    assert reason == "DuplicateVIP" and "alpha/old" in message and "10.96.0.5" in message
    assert st.conditions[1].type == "Degraded" and st.conditions[1].status == "True"
    assert m.reconcile(full=True).nodes["n1"] == st

    m.apply_raw("service", o.service("alpha", "old", "10.96.0.5", BOTH), deleted=True)  # the winner goes
    st = status(m)
    assert arms(st) == {"alpha/bystander": "10.96.0.1", "beta/young": "10.96.0.5"}
    assert "beta/young" not in shapes(st)


def test_a_tie_goes_by_namespace_then_name() -> None:
    m = mesh()
    svc(m, "beta", "a", "10.96.0.6", "2026-02-01T00:00:00Z")
    svc(m, "alpha", "z", "10.96.0.6", "2026-02-01T00:00:00Z")
    st = status(m)
    assert arms(st)["alpha/z"] == "10.96.0.6" and "beta/a" not in arms(st)
    assert "alpha/z" in shapes(st)["beta/a"][1]


def test_a_route_on_the_losing_service_is_not_accepted_and_names_the_winner() -> None:
    m = mesh()
    svc(m, "alpha", "old", "10.96.0.7", "2026-02-01T00:00:00Z")
    svc(m, "alpha", "young", "10.96.0.7", "2026-03-01T00:00:00Z")
    r = o.udproute("alpha", "r", "young", [o.backend("bystander", 53)])
    r["metadata"].update({"generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"})
    m.apply_raw("route", r)
    out = m.reconcile()
    (verdict,) = out.routes[("alpha", "r")]
    assert not verdict.accepted and verdict.accepted_reason == "NoMatchingParent"
    assert "alpha/old" in verdict.accepted_message and "DuplicateVIP" in verdict.accepted_message
    assert arms(out.nodes["n1"])["alpha/old"] == "10.96.0.7"


@pytest.mark.parametrize(
    ("vip", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("169.254.10.1", "link-local"),
        ("fe80::1", "link-local"),
        ("fe80::1%eth0", "zoned"),
        ("224.0.0.9", "multicast"),
    ],
)
def test_a_vip_no_pod_can_dial_is_an_invalid_service_with_no_arm(vip: str, why: str) -> None:
    m = mesh()
    svc(m, "alpha", "odd", vip, "2026-02-01T00:00:00Z", BOTH)
    st = status(m)
    assert arms(st) == {"alpha/bystander": "10.96.0.1"} and arms(st, "tcp") == {}
    reason, message = shapes(st)["alpha/odd"]
    assert reason == "InvalidService" and why in message and vip in message
    assert [s.reason for s in st.udp.unsupported_shapes] == ["InvalidService"], "no NoClusterIP beside it"
