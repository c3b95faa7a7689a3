"""Hostile input through the API: a corpus of malformed objects plus hypothesis-generated routes. The operator
never crashes, every bad object gets a condition saying why (a Warning Event when it names no parent that a
status.parents entry could carry), and unrelated routes' arms do not change.

Long because: the corpus is data (one short builder per hostile object) run against one operator and one fixture;
split, each half would start its own operator for a handful of cases."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aether.api.client import ApiException
from aether.testing.apiserver import Kind, api_server
from aether.testing.apitestbed import TestBed, start
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.wait import wait_for

UDP = [("dns", 53, "UDP")]
SL = [("dns", 5353, "UDP")]
GW = "gateway.networking.k8s.io/v1alpha2"
# No parent to name in status.parents (its parentRef.name is required): the verdict comes as a Warning Event.
UNNAMED = ("Event", "Warning", "UnsupportedValue")


@pytest.fixture(scope="module")
def api(api_kind: Kind) -> Iterator[tuple[str, TestBed | None]]:
    """On the real control plane the server refuses what the upstream schema and its CEL rules refuse (that refusal
    is the outcome the test accepts); on the emulator the corpus is what a server without the Gateway API schema
    would store, and the bed stores it too (validate=False), so every object reaches the operator.
    tests/operator/test_operator_corpus.py feeds a validating one."""
    external = os.environ.get("AETHER_KUBECONFIG")
    if external:
        yield external, None
        return
    if api_kind == "real":
        with api_server("real") as server:
            yield server.kubeconfig, None
        return
    bed = start(validate=False)
    try:
        yield str(bed.kubeconfig_path), bed
    finally:
        bed.stop()


def applied(k: Cluster, body: dict[str, Any]) -> bool:
    """Apply; False when a real server refuses it with a 4xx (on the emulator every refusal is an error)."""
    try:
        k.apply(body)
    except ApiException as exc:
        if k.bed is not None or not 400 <= exc.status < 500:
            raise
        return False
    return True


def raw_route(ns: str, name: str, spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": GW, "kind": "UDPRoute", "metadata": {"name": name, "namespace": ns}}
    if spec is not ...:
        body["spec"] = spec
    return body


def svc_parent(name: str, **extra: Any) -> dict[str, Any]:
    return {"group": "", "kind": "Service", "name": name, **extra}


def rules(*backends: Any) -> list[dict[str, Any]]:
    return [{"backendRefs": list(backends)}]


class Control:
    """A namespace with a healthy route whose arms must never move while hostile input arrives elsewhere."""

    def __init__(self, k: Cluster) -> None:
        self.k, self.ns, self.node = k, unique("ctl"), unique("bad-node")
        k.apply(o.namespace(self.ns))
        k.apply(o.node(self.node))
        k.apply(o.pod(self.ns, "client", self.node, "client"), status=o.pod_status("10.50.0.2"))
        for i, name in enumerate(("front", "back")):
            k.apply(o.service(self.ns, name, f"10.96.50.{i + 1}", UDP))
            k.apply(o.endpoint_slice(self.ns, name, SL, [(f"10.50.1.{i + 1}", True, None)]))
        k.apply(o.udproute(self.ns, "control", "front", [o.backend("back", 53)]))
        self.before = wait_for(self.arms_ready, what="control arms", ignore=READ_ERRORS)

    def arms(self) -> list[dict[str, Any]]:
        arms = (self.k.state(self.node).get("udp") or {}).get("services") or []
        return sorted((a for a in arms if a["service"].startswith(f"{self.ns}/")), key=lambda a: a["service"])

    def arms_ready(self) -> list[dict[str, Any]] | None:
        arms = self.arms()
        return arms if [a["cluster"] for a in arms] == [f"udp:{self.ns}/back", f"udp:{self.ns}/back"] else None


def our_conditions(k: Cluster, ns: str, name: str) -> list[dict[str, Any]] | None:
    r = k.route(ns, name) or {}
    parents = (r.get("status") or {}).get("parents") or []
    ours = [p for p in parents if p.get("controllerName") == "mesh.aether.dev/udproute-controller"]
    return [c for p in ours for c in p.get("conditions") or []] or None


def warning_events(k: Cluster, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    events = k.res("v1", "Event").get(namespace=ns).to_dict()["items"]
    return [
        e for e in events if e["involvedObject"]["name"] == name and e["type"] == "Warning" and e["reason"] == reason
    ]


def corpus(ns: str, ctl: str, plain: str) -> list[tuple[str, dict[str, Any], tuple[str, str, str]]]:
    """(name, object, (condition type, status, reason) that must appear in our status)."""
    v = [f"v{i}" for i in range(40)]
    many = [o.backend("v0", 53, 1) for _ in range(500)]
    return [
        ("no-spec", raw_route(ns, "no-spec", ...), UNNAMED),
        ("spec-string", raw_route(ns, "spec-string", "🙃"), UNNAMED),
        (
            "parents-not-list",
            raw_route(ns, "parents-not-list", {"parentRefs": "svc", "rules": rules(o.backend(v[0], 53))}),
            UNNAMED,
        ),
        (
            "parent-not-object",
            raw_route(ns, "parent-not-object", {"parentRefs": [42], "rules": rules(o.backend(v[0], 53))}),
            UNNAMED,
        ),
        (
            "parent-no-name",
            raw_route(
                ns,
                "parent-no-name",
                {"parentRefs": [{"group": "", "kind": "Service"}], "rules": rules(o.backend(v[0], 53))},
            ),
            UNNAMED,
        ),
        (
            "parent-port-0",
            raw_route(
                ns, "parent-port-0", {"parentRefs": [svc_parent(v[1], port=0)], "rules": rules(o.backend(v[1], 53))}
            ),
            ("Accepted", "False", "UnsupportedValue"),
        ),
        (
            "parent-port-huge",
            raw_route(
                ns,
                "parent-port-huge",
                {"parentRefs": [svc_parent(v[2], port=70000)], "rules": rules(o.backend(v[2], 53))},
            ),
            ("Accepted", "False", "UnsupportedValue"),
        ),
        (
            "parent-missing",
            raw_route(ns, "parent-missing", {"parentRefs": [svc_parent("nope")], "rules": rules(o.backend(v[3], 53))}),
            ("Accepted", "False", "NoMatchingParent"),
        ),
        (
            "parent-cross-ns",
            raw_route(
                ns,
                "parent-cross-ns",
                {"parentRefs": [svc_parent("front", namespace=ctl)], "rules": rules(o.backend(v[3], 53))},
            ),
            ("Accepted", "False", "UnsupportedValue"),
        ),
        (
            "parent-tcp-only",
            raw_route(
                ns, "parent-tcp-only", {"parentRefs": [svc_parent("tcponly")], "rules": rules(o.backend(v[4], 53))}
            ),
            ("Accepted", "False", "NoMatchingParent"),
        ),
        (
            "parent-port-mismatch",
            raw_route(
                ns,
                "parent-port-mismatch",
                {"parentRefs": [svc_parent(v[5], port=99)], "rules": rules(o.backend(v[5], 53))},
            ),
            ("Accepted", "False", "NoMatchingParent"),
        ),
        (
            "parent-section-mismatch",
            raw_route(
                ns,
                "parent-section-mismatch",
                {"parentRefs": [svc_parent(v[6], sectionName="nope")], "rules": rules(o.backend(v[6], 53))},
            ),
            ("Accepted", "False", "NoMatchingParent"),
        ),
        (
            "backend-kind-pod",
            raw_route(
                ns,
                "backend-kind-pod",
                {"parentRefs": [svc_parent(v[7])], "rules": rules({"kind": "Pod", "name": "p", "port": 53})},
            ),
            ("ResolvedRefs", "False", "InvalidKind"),
        ),
        (
            "backend-group-foreign",
            raw_route(
                ns,
                "backend-group-foreign",
                {
                    "parentRefs": [svc_parent(v[8])],
                    "rules": rules({"group": "example.com", "kind": "Service", "name": v[8], "port": 53}),
                },
            ),
            ("ResolvedRefs", "False", "InvalidKind"),
        ),
        (
            "backend-no-name",
            raw_route(ns, "backend-no-name", {"parentRefs": [svc_parent(v[9])], "rules": rules({"port": 53})}),
            ("ResolvedRefs", "False", "UnsupportedValue"),
        ),
        (
            "weight-negative",
            raw_route(
                ns, "weight-negative", {"parentRefs": [svc_parent(v[10])], "rules": rules(o.backend(v[10], 53, -3))}
            ),
            ("ResolvedRefs", "False", "UnsupportedValue"),
        ),
        (
            "weight-huge",
            raw_route(
                ns, "weight-huge", {"parentRefs": [svc_parent(v[11])], "rules": rules(o.backend(v[11], 53, 10**12))}
            ),
            ("ResolvedRefs", "False", "UnsupportedValue"),
        ),
        (
            "weight-string",
            raw_route(
                ns,
                "weight-string",
                {"parentRefs": [svc_parent(v[12])], "rules": rules({"name": v[12], "port": 53, "weight": "heavy"})},
            ),
            ("ResolvedRefs", "False", "UnsupportedValue"),
        ),
        (
            "backend-no-port",
            raw_route(ns, "backend-no-port", {"parentRefs": [svc_parent(v[13])], "rules": rules({"name": v[13]})}),
            ("ResolvedRefs", "False", "BackendNotFound"),
        ),
        (
            "backend-port-0",
            raw_route(ns, "backend-port-0", {"parentRefs": [svc_parent(v[14])], "rules": rules(o.backend(v[14], 0))}),
            ("ResolvedRefs", "False", "UnsupportedValue"),
        ),
        (
            "backend-dangling",
            raw_route(
                ns, "backend-dangling", {"parentRefs": [svc_parent(v[15])], "rules": rules(o.backend("ghost", 53))}
            ),
            ("ResolvedRefs", "False", "BackendNotFound"),
        ),
        (
            "backend-cross-ns-no-grant",
            raw_route(
                ns,
                "backend-cross-ns-no-grant",
                {"parentRefs": [svc_parent(v[16])], "rules": rules(o.backend("back", 53, namespace=ctl))},
            ),
            ("ResolvedRefs", "False", "RefNotPermitted"),
        ),
        (
            "backend-tcp-only",
            raw_route(
                ns, "backend-tcp-only", {"parentRefs": [svc_parent(v[17])], "rules": rules(o.backend("tcponly", 53))}
            ),
            ("ResolvedRefs", "False", "BackendNotFound"),
        ),
        (
            "absurd-backends",
            raw_route(ns, "absurd-backends", {"parentRefs": [svc_parent(v[18])], "rules": [{"backendRefs": many}]}),
            ("Accepted", "False", "UnsupportedValue"),
        ),
        (
            "rules-not-list",
            raw_route(ns, "rules-not-list", {"parentRefs": [svc_parent(v[19])], "rules": {"a": 1}}),
            ("Accepted", "False", "UnsupportedValue"),
        ),
        (
            "backendrefs-not-list",
            raw_route(
                ns, "backendrefs-not-list", {"parentRefs": [svc_parent(v[20])], "rules": [{"backendRefs": "v1"}]}
            ),
            ("Accepted", "False", "UnsupportedValue"),
        ),
        (
            "no-backends",
            raw_route(ns, "no-backends", {"parentRefs": [svc_parent(v[21])], "rules": []}),
            ("Accepted", "False", "UnsupportedValue"),
        ),
        (
            "too-many-parents",
            raw_route(
                ns, "too-many-parents", {"parentRefs": [svc_parent(v[22])] * 40, "rules": rules(o.backend(v[22], 53))}
            ),
            ("Accepted", "False", "UnsupportedValue"),
        ),
        (
            "unicode-rüte-✓",
            raw_route(
                ns, "unicode-rüte-✓", {"parentRefs": [svc_parent(v[23])], "rules": rules(o.backend("bäckend-☃", 53))}
            ),
            ("ResolvedRefs", "False", "BackendNotFound"),
        ),
        (
            "loop-x",
            raw_route(ns, "loop-x", {"parentRefs": [svc_parent(v[24])], "rules": rules(o.backend(v[25], 53))}),
            ("Accepted", "True", "Accepted"),
        ),
        (
            "loop-y",
            raw_route(ns, "loop-y", {"parentRefs": [svc_parent(v[25])], "rules": rules(o.backend(v[24], 53))}),
            ("Accepted", "True", "Accepted"),
        ),
        (
            "self-ref",
            raw_route(
                ns,
                "self-ref",
                {"parentRefs": [svc_parent(v[26]), svc_parent(v[26])], "rules": rules(o.backend(v[26], 53))},
            ),
            ("Accepted", "True", "Accepted"),
        ),
        (
            "non-mesh-ns",
            raw_route(plain, "non-mesh-ns", {"parentRefs": [svc_parent("p")], "rules": rules(o.backend("p", 53))}),
            ("Accepted", "False", "NoMatchingParent"),
        ),
        (
            "all-drained",
            raw_route(ns, "all-drained", {"parentRefs": [svc_parent(v[27])], "rules": rules(o.backend(v[27], 53, 0))}),
            ("Accepted", "True", "Accepted"),  # a drain is supported: no new session, open ones finish
        ),
    ]


@pytest.fixture(scope="module")
def control(cluster: Cluster) -> Control:
    return Control(cluster)


def test_hostile_corpus_gets_conditions_and_never_moves_unrelated_arms(
    cluster: Cluster, operator: InProcessOperator, control: Control
) -> None:
    k = cluster
    ns, plain = unique("bad"), unique("plain")
    k.apply(o.namespace(ns))
    k.apply(o.namespace(plain, meshed=False))
    k.apply(o.pod(ns, "client", control.node, "client"), status=o.pod_status("10.51.0.2"))
    for i in range(30):
        k.apply(o.service(ns, f"v{i}", f"10.96.51.{i + 1}", UDP))
        k.apply(o.endpoint_slice(ns, f"v{i}", SL, [(f"10.51.1.{i + 1}", True, None)]))
    k.apply(o.service(ns, "tcponly", "10.96.51.200", [("http", 80, "TCP")]))
    k.apply(o.service(plain, "p", "10.96.52.1", UDP))
    hostile_services = [
        o.service(ns, "bad-ip", "not-an-ip", UDP),
        o.service(ns, "bad-ports", "10.96.51.201", [("x", 0, "UDP"), ("y", 53, "QUIC")]),
        o.service(ns, "two-udp", "10.96.51.202", [("b", 54, "UDP"), ("a", 53, "UDP")]),
    ]
    # a real server validates Services (an IP, ports, protocols) and EndpointSlice addresses and refuses these
    stored = {svc["metadata"]["name"] for svc in hostile_services if applied(k, svc)}
    eps = [("999.1.1.1", True, None), ("10.51.2.1", True, None)]
    if not applied(k, o.endpoint_slice(ns, "two-udp", [("a", 1, "UDP")], eps)):
        k.apply(o.endpoint_slice(ns, "two-udp", [("a", 1, "UDP")], eps[1:]))
    items = corpus(ns, control.ns, plain)
    assert len(items) + len(hostile_services) >= 25
    # A real API server validates against the upstream CRD schema and refuses some of these outright (its 4xx says
    # why); the test bed validates nothing, so there every object must reach the operator.
    rejected_by_api = [name for name, body, _ in items if not applied(k, body)]
    items = [item for item in items if item[0] not in rejected_by_api]
    for name, body, (ctype, status, reason) in items:
        route_ns = body["metadata"]["namespace"]

        def found(
            name: str = name, route_ns: str = route_ns, want: tuple[str, str, str] = (ctype, status, reason)
        ) -> list[dict[str, Any]] | None:
            if want == UNNAMED:
                return warning_events(k, route_ns, name, want[2]) or None
            conds = our_conditions(k, route_ns, name) or []
            return [c for c in conds if (c["type"], c["status"], c["reason"]) == want] or None

        cond = wait_for(found, what=f"{name}: {ctype}={status} ({reason})", ignore=READ_ERRORS)
        assert cond[0]["message"], f"{name}: a condition must say why"
    shapes = wait_for(
        lambda: (
            {(s["route"], s["reason"]) for s in k.state(control.node).get("udp", {}).get("unsupportedShapes", [])}
            >= {
                (f"{ns}/{name}", reason)
                for name, reason in (("bad-ip", "InvalidService"), ("bad-ports", "InvalidService"))
                if name in stored
            }
            | {(f"{ns}/two-udp", "MultipleUDPPorts")}
        ),
        what="service shapes",
        ignore=READ_ERRORS,
    )
    assert shapes
    loop_arms = {a["service"]: a["cluster"] for a in k.state(control.node)["udp"]["services"]}
    assert loop_arms[f"{ns}/v24"] == f"udp:{ns}/v25" and loop_arms[f"{ns}/v25"] == f"udp:{ns}/v24"
    assert control.arms() == control.before
    assert operator.alive()


backend_st = st.fixed_dictionaries(
    {"name": st.sampled_from(["v0", "v1", "v2", "ghost", ""])},
    optional={
        "port": st.one_of(st.just(53), st.integers(-1, 70000), st.text(max_size=3)),
        "weight": st.one_of(st.integers(-10, 10), st.integers(0, 10**9), st.none(), st.text(max_size=3)),
        "namespace": st.sampled_from(["", "elsewhere"]),
        "kind": st.sampled_from(["Service", "Pod", ""]),
        "group": st.sampled_from(["", "example.com"]),
    },
)
gen_route_st = st.fixed_dictionaries(
    {
        "parentRefs": st.lists(
            st.fixed_dictionaries(
                {
                    "group": st.just(""),
                    "kind": st.just("Service"),
                    "name": st.sampled_from(["v0", "v1", "v2", "missing"]),
                },
                optional={
                    "port": st.one_of(st.just(53), st.integers(-5, 70000)),
                    "sectionName": st.sampled_from(["dns", "x"]),
                },
            ),
            min_size=1,
            max_size=3,
        ),
        "rules": st.lists(st.fixed_dictionaries({"backendRefs": st.lists(backend_st, max_size=6)}), max_size=3),
    }
)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(gen_route_st, min_size=1, max_size=6))
def test_generated_routes_get_conditions_and_never_move_unrelated_arms(
    cluster: Cluster, operator: InProcessOperator, control: Control, specs: list[dict[str, Any]]
) -> None:
    k = cluster
    ns = unique("gen")
    k.apply(o.namespace(ns))
    for i in range(3):  # each example is a new namespace: on a real server the allocator picks the VIPs
        k.apply(o.service(ns, f"v{i}", f"10.96.53.{i + 1}" if k.bed is not None else None, UDP))
        k.apply(o.endpoint_slice(ns, f"v{i}", SL, [(f"10.53.1.{i + 1}", True, None)]))
    stored = [i for i, spec in enumerate(specs) if applied(k, raw_route(ns, f"g{i}", spec))]
    for i in stored:

        def conds(i: int = i) -> list[dict[str, Any]] | None:
            return our_conditions(k, ns, f"g{i}")

        wait_for(conds, what=f"generated route g{i} has our conditions", ignore=READ_ERRORS)
    assert control.arms() == control.before
    assert operator.alive()
