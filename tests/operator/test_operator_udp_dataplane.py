"""The per-Service UDP data path: annotation mesh.aether.dev/udp-dataplane on the Service (envoy or kernel), parsed
by the operator (a bad value refused alone, with its own shape), carried on the UDP arms as `dataplane`."""

from __future__ import annotations

import pytest

from aether.operator.reconcile.model import ClusterModel
from aether.operator.reconcile.views import UDP_DATAPLANE_ANNOTATION, parse_dataplane
from aether.testing.apitestbed import objects as o

UDP_TCP = [("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")]


@pytest.mark.parametrize(("text", "plane"), [("kernel", "kernel"), ("envoy", "envoy"), (" Kernel ", "kernel")])
def test_values(text: str, plane: str) -> None:
    assert parse_dataplane({UDP_DATAPLANE_ANNOTATION: text}) == (plane, None)


def test_absent_is_the_nodes_default() -> None:
    assert parse_dataplane({}) == (None, None)


@pytest.mark.parametrize("bad", ["", "ebpf", "kernel,envoy", 1, "Envoy Kernel"])
def test_bad_values_are_refused_with_the_annotation_named(bad: object) -> None:
    plane, problem = parse_dataplane({UDP_DATAPLANE_ANNOTATION: bad})
    assert plane is None and problem is not None
    assert UDP_DATAPLANE_ANNOTATION in problem and "envoy, kernel" in problem


def _model(annotations: dict[str, str]) -> ClusterModel:
    m = ClusterModel()
    m.apply_raw("namespace", o.namespace("app"))
    m.apply_raw("node", {"metadata": {"name": "n1", "uid": "u1"}})
    pod = o.pod("app", "client", "n1", "client")
    pod["metadata"]["uid"] = "uid-client"
    pod.update(o.pod_status("10.0.0.2"))
    m.apply_raw("pod", pod)
    for i, name in enumerate(["dns", "other"]):
        svc = o.service("app", name, f"10.96.0.{10 + i}", UDP_TCP)
        if name == "dns":
            svc["metadata"]["annotations"] = annotations
        m.apply_raw("service", svc)
        m.apply_raw("slice", o.endpoint_slice("app", name, [("dns", 5353, "UDP")], [(f"10.1.0.{10 + i}", True, None)]))
    return m


def test_the_annotation_reaches_the_udp_arm_only_and_other_services_keep_the_default() -> None:
    status = _model({UDP_DATAPLANE_ANNOTATION: "kernel"}).reconcile(full=True).nodes["n1"]
    udp = {a.service: a for a in status.udp.services}
    assert udp["app/dns"].dataplane == "kernel"
    assert udp["app/other"].dataplane is None
    assert all(a.dataplane is None for a in status.tcp.services)
    assert status.udp.unsupported_shapes == []
    assert udp["app/dns"].wire()["dataplane"] == "kernel"
    assert "dataplane" not in udp["app/other"].wire()  # unset costs no bytes in the status


def test_a_bad_value_is_refused_alone_with_its_own_shape() -> None:
    status = _model({UDP_DATAPLANE_ANNOTATION: "ebpf"}).reconcile(full=True).nodes["n1"]
    udp = {a.service: a for a in status.udp.services}
    assert udp["app/dns"].dataplane is None  # the arm is served, on the node's default path
    assert udp["app/dns"].endpoints and udp["app/other"].endpoints
    (shape,) = status.udp.unsupported_shapes
    assert (shape.route, shape.reason) == ("app/dns", "InvalidUdpDataplane")
    assert "'ebpf' is not one of envoy, kernel" in shape.message and "node's default UDP data path" in shape.message


def test_a_route_on_the_service_keeps_the_dialled_services_choice() -> None:
    m = _model({UDP_DATAPLANE_ANNOTATION: "kernel"})
    body = o.udproute("app", "r", "dns", [{"name": "other", "port": 53}])
    body["metadata"].update({"generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"})
    m.apply_raw("route", body)
    udp = {a.service: a for a in m.reconcile(full=True).nodes["n1"].udp.services}
    assert (udp["app/dns"].cluster, udp["app/dns"].dataplane) == ("udp:app/other", "kernel")
    assert udp["app/other"].dataplane is None
