"""The per-Service UDP session idle timeout: annotation mesh.aether.dev/udp-idle-timeout on the Service, parsed by
the operator (a bad value refused alone, with its own shape), carried on the UDP arm as idle_timeout_seconds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aether.operator.reconcile.model import ClusterModel
from aether.operator.reconcile.views import UDP_IDLE_TIMEOUT_ANNOTATION, UDP_IDLE_TIMEOUT_BOUNDS, parse_idle_timeout
from aether.testing.apitestbed import objects as o

UDP_TCP = [("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5.0), ("500ms", None), ("1500ms", 1.5), ("2m", 120.0), ("1m30s", 90.0), ("1h", 3600.0), (" 10s ", 10.0)],
)
def test_durations(text: str, seconds: float | None) -> None:
    value, problem = parse_idle_timeout(text)
    assert value == seconds
    assert (problem is None) == (seconds is not None), problem


@pytest.mark.parametrize("bad", ["", "5", "five", "5 s", "-5s", "5x", "s", 5, None, "0s", "25h", "1.5.5s"])
def test_bad_values_are_refused_with_the_annotation_named(bad: object) -> None:
    value, problem = parse_idle_timeout(bad)
    assert value is None and problem is not None and UDP_IDLE_TIMEOUT_ANNOTATION in problem


@given(st.integers(min_value=1, max_value=86_400))
def test_whole_seconds_round_trip(n: int) -> None:
    assert parse_idle_timeout(f"{n}s") == (float(n), None)
    assert UDP_IDLE_TIMEOUT_BOUNDS[0] <= n <= UDP_IDLE_TIMEOUT_BOUNDS[1]


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
    status = _model({UDP_IDLE_TIMEOUT_ANNOTATION: "5s"}).reconcile(full=True).nodes["n1"]
    udp = {a.service: a for a in status.udp.services}
    assert udp["app/dns"].idle_timeout_seconds == 5.0
    assert udp["app/other"].idle_timeout_seconds is None
    assert all(a.idle_timeout_seconds is None for a in status.tcp.services)
    assert status.udp.unsupported_shapes == []


def test_a_bad_value_is_refused_alone_with_its_own_shape() -> None:
    status = _model({UDP_IDLE_TIMEOUT_ANNOTATION: "soon"}).reconcile(full=True).nodes["n1"]
    udp = {a.service: a for a in status.udp.services}
    assert udp["app/dns"].idle_timeout_seconds is None  # the arm is served, with the node's default
    assert udp["app/dns"].endpoints and udp["app/other"].endpoints
    (shape,) = status.udp.unsupported_shapes
    assert (shape.route, shape.reason) == ("app/dns", "InvalidIdleTimeout")
    assert "'soon' is not a duration" in shape.message and "keeps the node's default" in shape.message


def test_a_route_on_the_service_keeps_the_parents_timeout() -> None:
    m = _model({UDP_IDLE_TIMEOUT_ANNOTATION: "2s"})
    body = o.udproute("app", "r", "dns", [{"name": "other", "port": 53}])
    body["metadata"].update({"generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"})
    m.apply_raw("route", body)
    udp = {a.service: a for a in m.reconcile(full=True).nodes["n1"].udp.services}
    assert (udp["app/dns"].cluster, udp["app/dns"].idle_timeout_seconds) == ("udp:app/other", 2.0)
