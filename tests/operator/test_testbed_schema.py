"""The API test bed validates custom resources against their CRD's openAPIV3Schema (jsonschema) and answers as
kube-apiserver does: 422, reason Invalid, the field path in details.causes; unknown fields are pruned. Checked for
the MeshNode CRD (generated from the model) and the Gateway API test copies, and the operator's own writes pass it:
a route without parentRefs used to get a status with parentRef.name "" that the schema refuses (seen red: the
operator's write counted as refused)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.dynamic.exceptions import UnprocessibleEntityError

from aether.metrics import REGISTRY
from aether.testing.apitestbed import TestBed
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import MERGE, READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.wait import wait_for

GW = "gateway.networking.k8s.io/v1alpha2"


@pytest.fixture(scope="module")
def k(bed: TestBed) -> Cluster:
    return Cluster(str(bed.kubeconfig_path), bed)


def refused(fn: Any) -> dict[str, Any]:
    with pytest.raises(UnprocessibleEntityError) as info:
        fn()
    status: dict[str, Any] = json.loads(str(info.value.body))
    assert status["code"] == 422 and status["reason"] == "Invalid", status
    return status


def fields(status: dict[str, Any]) -> list[str]:
    return [c["field"] for c in status["details"]["causes"]]


def test_a_route_the_schema_refuses_gets_422_with_the_field_path(k: Cluster) -> None:
    ns = unique("sch")
    k.apply(o.namespace(ns))
    bad = o.udproute(ns, "r", "svc", [o.backend("svc", 53, weight=-3)])
    status = refused(lambda: k.apply(bad))
    assert fields(status) == ["spec.rules[0].backendRefs[0].weight"]
    assert 'UDPRoute.gateway.networking.k8s.io "r" is invalid' in status["message"]
    too_many = o.udproute(ns, "r", "svc", [o.backend(f"b{i}", 53) for i in range(17)])
    assert fields(refused(lambda: k.apply(too_many))) == ["spec.rules[0].backendRefs"]
    nameless = o.udproute(ns, "r", "svc", [{"port": 53}])
    cause = refused(lambda: k.apply(nameless))["details"]["causes"][0]
    assert cause == {
        "reason": "FieldValueRequired",
        "field": "spec.rules[0].backendRefs[0].name",
        "message": cause["message"],
    }
    assert k.route(ns, "r") is None, "nothing refused is stored"
    k.apply(o.udproute(ns, "r", "svc", [o.backend("svc", 53)]))  # and a valid one is


def test_status_the_schema_refuses_and_unknown_fields_pruned(k: Cluster) -> None:
    ns = unique("sch")
    k.apply(o.namespace(ns))
    route = o.udproute(ns, "r", "svc", [o.backend("svc", 53)])
    route["spec"]["surprise"] = {"x": 1}
    stored = k.apply(route).to_dict()
    assert "surprise" not in stored["spec"], "pruned as a structural schema prunes"
    res = k.res(GW, "UDPRoute").subresources["status"]
    entry = {"parentRef": {"group": "", "kind": "Service", "name": ""}, "controllerName": "mesh.aether.dev/x"}
    status = refused(
        lambda: res.patch(body={"status": {"parents": [entry]}}, name="r", namespace=ns, content_type=MERGE)
    )
    assert fields(status) == ["status.parents[0].parentRef.name"]
    mn = k.res("mesh.aether.dev/v1alpha1", "MeshNode")
    mn.create(body={"apiVersion": "mesh.aether.dev/v1alpha1", "kind": "MeshNode", "metadata": {"name": ns}})
    cond = {"type": "Ready", "status": "Maybe", "reason": "X"}
    status = refused(
        lambda: mn.subresources["status"].patch(body={"status": {"conditions": [cond]}}, name=ns, content_type=MERGE)
    )
    assert fields(status) == ["status.conditions[0].status"]


def test_the_operator_writes_only_what_the_schema_admits(bed: TestBed, k: Cluster) -> None:
    def refusals() -> float:
        return REGISTRY.get_sample_value("aether_operator_write_refusals_total", {"kind": "udproute"}) or 0.0

    op = InProcessOperator(str(bed.kubeconfig_path))
    op.start()
    try:
        ns, node = unique("sch"), unique("sch-node")
        before = refusals()
        k.apply(o.namespace(ns))
        k.apply(o.node(node))
        k.apply(o.pod(ns, "c", node), status=o.pod_status("10.80.0.2"))
        k.apply(o.service(ns, "svc", "10.96.80.1", [("dns", 53, "UDP")]))
        k.apply(o.endpoint_slice(ns, "svc", [("dns", 5353, "UDP")], [("10.80.1.1", True, None)]))
        orphan = o.udproute(ns, "orphan", "svc", [o.backend("svc", 53)])
        del orphan["spec"]["parentRefs"]
        k.apply(orphan)
        k.apply(o.udproute(ns, "good", "svc", [o.backend("svc", 53)]))

        def accepted() -> bool:
            parents = ((k.route(ns, "good") or {}).get("status") or {}).get("parents") or []
            return any(c["type"] == "Accepted" for p in parents for c in p["conditions"])

        wait_for(accepted, what="the good route's status", ignore=READ_ERRORS)

        def warned() -> list[dict[str, Any]]:
            events = k.res("v1", "Event").get(namespace=ns).to_dict()["items"]
            return [e for e in events if e["involvedObject"]["name"] == "orphan" and e["type"] == "Warning"]

        (event,) = wait_for(warned, what="the orphan route's Warning Event")
        assert event["reason"] == "UnsupportedValue" and "parentRefs" in event["message"]
        assert ((k.route(ns, "orphan") or {}).get("status") or {}).get("parents") in (None, [])
        assert refusals() == before, "no write of ours was refused by the schema"
        assert op.alive()
    finally:
        op.stop()
