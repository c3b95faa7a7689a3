"""Weighted UDPRoute splits in the reconcile (pure): the arm's own cluster, each backend with weight, share and
reason; drain; an invalid backendRef's share kept with the spec's reason. The data path: tests/xds/test_udp_weighted_split.py
and tests/e2e/test_e2e_udp_weights.py; the share arithmetic: tests/operator/test_operator_split.py."""

from __future__ import annotations

from typing import Any

from aether.api.meshnode import EffectiveStatus, ServiceArm
from aether.operator.reconcile.model import ClusterModel
from aether.testing.apitestbed import objects as o

UDP = [("dns", 53, "UDP")]
SLICE_UDP = [("dns", 5353, "UDP")]


def base() -> ClusterModel:
    m = ClusterModel()
    m.apply_raw("namespace", o.namespace("app"))
    m.apply_raw("node", {"metadata": {"name": "n1", "uid": "u1"}})
    pod = o.pod("app", "client", "n1", "client")
    pod["metadata"]["uid"] = "uid-app-client"
    pod.update(o.pod_status("10.0.0.2"))
    m.apply_raw("pod", pod)
    for i, name in enumerate(["a", "b", "c"]):
        m.apply_raw("service", o.service("app", name, f"10.96.0.{10 + i}", UDP))
        m.apply_raw("slice", o.endpoint_slice("app", name, SLICE_UDP, [(f"10.1.0.{10 + i}", True, None)]))
    return m


def route(m: ClusterModel, name: str, parent: str, backends: list[dict[str, Any]]) -> None:
    body = o.udproute("app", name, parent, backends)
    body["metadata"].update({"generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"})
    m.apply_raw("route", body)


def arms(status: EffectiveStatus) -> dict[str, ServiceArm]:
    return {a.service: a for a in status.udp.services}


def node_status(m: ClusterModel) -> EffectiveStatus:
    return m.reconcile(full=True).nodes["n1"]


def _split(a: ServiceArm) -> list[tuple[str, int, float, str | None, list[tuple[str, int]]]]:
    return [(b.backend, b.weight, b.share, b.reason, [(e.ip, e.port) for e in b.endpoints]) for b in a.backends or []]


def test_weights_split_new_sessions_through_the_arms_own_cluster() -> None:
    m = base()
    route(m, "r", "a", [o.backend("b", 53, 10), o.backend("c", 53, 30)])
    out = m.reconcile(full=True)
    a = arms(out.nodes["n1"])["app/a"]
    assert (a.cluster, a.backend, a.endpoints, a.route) == ("udp-split:app/a", None, [], "app/r")
    assert _split(a) == [
        ("app/b", 10, 25.0, None, [("10.1.0.11", 5353)]),
        ("app/c", 30, 75.0, None, [("10.1.0.12", 5353)]),
    ]
    assert out.nodes["n1"].udp.unsupported_shapes == []  # a weighted split is supported: no shape, nothing counted
    v = out.routes[("app", "r")][0]
    assert (v.accepted, v.resolved, v.chosen) == (True, True, "udp-split:app/a")
    assert "app/b 25%, app/c 75%" in v.accepted_message


def test_weight_zero_is_drain_and_every_weight_zero_still_keeps_the_split() -> None:
    m = base()
    route(m, "r", "a", [o.backend("b", 53, 0), o.backend("c", 53, 1)])
    a = arms(node_status(m))["app/a"]
    assert _split(a) == [
        ("app/b", 0, 0.0, "Drained", [("10.1.0.11", 5353)]),  # its endpoints stay: open sessions finish
        ("app/c", 1, 100.0, None, [("10.1.0.12", 5353)]),
    ]
    route(m, "r", "a", [o.backend("b", 53, 0)])
    a = arms(node_status(m))["app/a"]
    assert (a.cluster, _split(a)) == ("udp-split:app/a", [("app/b", 0, 0.0, "Drained", [("10.1.0.11", 5353)])])


def test_an_invalid_backends_share_is_kept_with_the_specs_reason() -> None:
    m = base()
    route(m, "r", "a", [o.backend("missing", 53, 80), o.backend("b", 53, 20)])
    out = m.reconcile(full=True)
    a = arms(out.nodes["n1"])["app/a"]
    assert _split(a) == [
        ("app/b", 20, 20.0, None, [("10.1.0.11", 5353)]),
        ("app/missing", 80, 80.0, "BackendNotFound", []),
    ]
    v = out.routes[("app", "r")][0]
    assert (v.accepted, v.resolved, v.resolved_reason) == (True, False, "BackendNotFound")
    assert "app/missing 80% (BackendNotFound)" in v.accepted_message


def test_a_plain_arm_carries_no_split_fields_on_the_wire() -> None:
    """MeshNode size: a plain arm (the common case, thousands per node) spends no bytes on splits or timeouts."""
    m = base()
    route(m, "r", "a", [o.backend("b", 53, 1), o.backend("c", 53, 1)])
    status = node_status(m)
    wire = {a["service"]: a for a in status.wire()["udp"]["services"]}
    assert "backends" not in wire["app/b"] and "idleTimeoutSeconds" not in wire["app/b"]
    assert [b["backend"] for b in wire["app/a"]["backends"]] == ["app/b", "app/c"]
