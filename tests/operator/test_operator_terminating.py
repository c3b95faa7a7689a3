"""Terminating endpoints (EndpointSlice conditions ready/serving/terminating): a pod being deleted that still
answers is kept as `draining` while its Service has a ready endpoint, so the proxy moves flows off it instead of
cutting them; one that no longer serves is gone; with no ready endpoint the serving ones take new flows, as
kube-proxy does. The xDS side (DRAINING) is in tests/xds; the data path in tests/e2e."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from aether.api.meshnode import EffectiveStatus, ServiceArm
from aether.operator.reconcile.model import ClusterModel
from aether.operator.reconcile.views import parse_slice
from aether.testing.apitestbed import objects as o

TCP = [("http", 8080, "TCP")]
SLICE_UDP = [("dns", 5353, "UDP")]


def add_pod(m: ClusterModel, name: str, node: str, ip: str, sa: str) -> None:
    body = o.pod("app", name, node, sa)
    body["metadata"]["uid"] = f"uid-{name}"
    body.update(o.pod_status(ip))
    m.apply_raw("pod", body)


def base() -> ClusterModel:
    """Mesh namespace app: a client pod on n1, UDP Service a (no endpoints yet)."""
    m = ClusterModel()
    m.apply_raw("namespace", o.namespace("app"))
    for n in ("n1", "n2"):
        m.apply_raw("node", {"metadata": {"name": n, "uid": f"u-{n}"}})
    add_pod(m, "client", "n1", "10.0.0.2", "client")
    m.apply_raw("service", o.service("app", "a", "10.96.0.10", [("dns", 53, "UDP")]))
    return m


def arms(status: EffectiveStatus) -> dict[str, ServiceArm]:
    return {a.service: a for a in status.udp.services}


def _eps(m: ClusterModel, service: str) -> list[tuple[str, bool]]:
    return [(e.ip, e.draining) for e in arms(m.reconcile(full=True).nodes["n1"])[service].endpoints]


def test_serving_terminating_endpoint_is_draining_beside_a_ready_one() -> None:
    m = base()
    states: list[tuple[str, o.EndpointState, str | None]] = [
        ("10.1.0.10", True, None),
        ("10.1.0.11", o.SERVING_TERMINATING, None),
        ("10.1.0.12", o.TERMINATING, None),
        ("10.1.0.13", False, None),
    ]
    m.apply_raw("slice", o.endpoint_slice("app", "a", SLICE_UDP, states))
    assert _eps(m, "app/a") == [("10.1.0.10", False), ("10.1.0.11", True)]
    wire = arms(m.reconcile(full=True).nodes["n1"])["app/a"].wire()["endpoints"]
    assert wire == [{"ip": "10.1.0.10", "port": 5353}, {"ip": "10.1.0.11", "port": 5353, "draining": True}]


def test_with_no_ready_endpoint_the_serving_terminating_ones_take_new_flows() -> None:
    m = base()
    states: list[tuple[str, o.EndpointState, str | None]] = [
        ("10.1.0.11", o.SERVING_TERMINATING, None),
        ("10.1.0.12", o.TERMINATING, None),
    ]
    m.apply_raw("slice", o.endpoint_slice("app", "a", SLICE_UDP, states))
    assert _eps(m, "app/a") == [("10.1.0.11", False)]
    m.apply_raw("slice", o.endpoint_slice("app", "a", SLICE_UDP, [("10.1.0.12", o.TERMINATING, None)]))
    assert _eps(m, "app/a") == []


def test_an_address_ready_in_one_slice_is_ready() -> None:
    m = base()
    m.apply_raw("slice", o.endpoint_slice("app", "a", SLICE_UDP, [("10.1.0.20", o.SERVING_TERMINATING, None)]))
    m.apply_raw(
        "slice",
        o.endpoint_slice("app", "a", SLICE_UDP, [("10.1.0.20", True, None), ("10.1.0.21", True, None)], name="a-2"),
    )
    assert _eps(m, "app/a") == [("10.1.0.20", False), ("10.1.0.21", False)]


def test_a_terminating_endpoint_is_no_quic_destination() -> None:
    m = base()
    add_pod(m, "web-0", "n2", "10.0.1.7", "web")
    add_pod(m, "web-1", "n2", "10.0.1.8", "web")
    m.apply_raw("service", o.service("app", "web", "10.96.0.20", TCP))
    m.apply_raw(
        "slice",
        o.endpoint_slice(
            "app", "web", TCP, [("10.0.1.7", True, "web-0"), ("10.0.1.8", o.SERVING_TERMINATING, "web-1")]
        ),
    )
    s = m.reconcile(full=True).nodes["n1"]
    d = {x.service: x for x in s.quic.destinations}
    assert [e.ip for e in d["app/web"].endpoints] == ["10.0.1.7"]
    assert d["app/web"].unready_ips == ["10.0.1.8"]  # no traffic, but a policy on web still guards the pod
    assert [(e.ip, e.draining) for e in {a.service: a for a in s.tcp.services}["app/web"].endpoints] == [
        ("10.0.1.7", False),
        ("10.0.1.8", True),
    ]


_COND = st.dictionaries(st.sampled_from(["ready", "serving", "terminating"]), st.one_of(st.none(), st.booleans()))


@given(_COND)
def test_conditions_read_as_the_api_defines_them(conditions: dict[str, Any]) -> None:
    """ready absent (or null) is ready; serving absent defers to ready; terminating absent is false."""
    body = o.endpoint_slice("app", "a", SLICE_UDP, [("10.1.0.9", True, None)])
    body["endpoints"][0]["conditions"] = conditions
    (ep,) = parse_slice(body).endpoints
    ready = conditions.get("ready") is not False
    serving = ready if conditions.get("serving") is None else bool(conditions["serving"])
    terminating = conditions.get("terminating") is True
    assert (ep.ready, ep.serving, ep.terminating) == (ready, serving, terminating)
    assert ep.draining == (not ready and serving and terminating)


def test_an_ineligible_service_lists_every_endpoint_for_its_policies() -> None:
    """No ready endpoint (or mixed ServiceAccounts): no QUIC destination, but its pods stay guarded."""
    m = base()
    add_pod(m, "web-0", "n2", "10.0.1.7", "web")
    add_pod(m, "web-1", "n2", "10.0.1.8", "other")
    m.apply_raw("service", o.service("app", "web", "10.96.0.20", TCP))
    m.apply_raw("service", o.service("app", "idle", "10.96.0.21", TCP))
    states: list[tuple[str, o.EndpointState, str | None]] = [
        ("10.0.1.7", o.SERVING_TERMINATING, "web-0"),
        ("10.0.1.8", False, "web-1"),
    ]
    m.apply_raw("slice", o.endpoint_slice("app", "web", TCP, states))
    s = m.reconcile(full=True).nodes["n1"]
    got = {x.service: x for x in s.quic.ineligible}
    assert (got["app/web"].reason, got["app/web"].ports, got["app/web"].endpoint_ips) == (
        "NoReadyEndpoints",
        [8080],
        ["10.0.1.7", "10.0.1.8"],
    )
    assert got["app/idle"].wire() == {"service": "app/idle", "reason": "NoReadyEndpoints"}  # nothing to guard
    m.apply_raw(
        "slice", o.endpoint_slice("app", "web", TCP, [("10.0.1.7", True, "web-0"), ("10.0.1.8", True, "web-1")])
    )
    got = {x.service: x for x in m.reconcile(full=True).nodes["n1"].quic.ineligible}
    assert (got["app/web"].reason, got["app/web"].endpoint_ips) == ("MixedServiceAccounts", ["10.0.1.7", "10.0.1.8"])
