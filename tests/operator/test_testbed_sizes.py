"""The API test bed refuses what a real API server refuses on size (testing/apitestbed/sizes.py): a request body
over 3 MiB gets 413 RequestEntityTooLarge before it is decoded; an object whose stored form is over etcd's 1.5 MiB
gets etcd's "request is too large" as kube-apiserver relays it (500, no reason). A MeshNode status of 1.6 MiB, what
the old layout wrote at ~2,700 Services, is refused and nothing is stored."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.dynamic.exceptions import DynamicApiError

from aether.testing.apitestbed import TestBed
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import Cluster, unique
from aether.testing.apitestbed.sizes import ETCD_MAX_REQUEST_BYTES, MAX_REQUEST_BODY_BYTES, stored_size

MN = "mesh.aether.dev/v1alpha1"


@pytest.fixture(scope="module")
def k(bed: TestBed) -> Cluster:
    return Cluster(str(bed.kubeconfig_path), bed)


def arms(n: int) -> list[dict[str, Any]]:
    return [
        {
            "service": f"ns-{i // 100}/svc-{i}",
            "vip": f"10.96.{i // 250}.{i % 250 + 1}",
            "cluster": f"udp:ns-{i // 100}/svc-{i}",
            "backend": f"ns-{i // 100}/svc-{i}",
            "endpoints": [{"ip": f"10.244.{j}.{i % 250 + 1}", "port": 5353} for j in range(5)],
        }
        for i in range(n)
    ]


def status_of_size(target: int) -> dict[str, Any]:
    """A MeshNode status whose compact JSON is just over `target` bytes."""
    per = len(json.dumps(arms(1)[0], separators=(",", ":")))
    return {"udp": {"services": arms(target // per + 1)}}


def refusal(fn: Any) -> dict[str, Any]:
    with pytest.raises(DynamicApiError) as info:
        fn()
    body: dict[str, Any] = json.loads(str(info.value.body))
    return body


def meshnode(name: str) -> dict[str, Any]:
    return {"apiVersion": MN, "kind": "MeshNode", "metadata": {"name": name}, "spec": {}}


def test_a_status_write_over_etcds_limit_is_refused_as_kube_apiserver_relays_it(k: Cluster) -> None:
    name = unique("big")
    k.apply(meshnode(name))
    status = status_of_size(int(1.6 * 1024 * 1024))
    assert stored_size("", {"status": status}) > ETCD_MAX_REQUEST_BYTES
    body = refusal(lambda: k.apply(meshnode(name), {"status": status}))
    assert body == {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "code": 500,
        "message": "etcdserver: request is too large",
    }, "no reason: kube-apiserver does not map etcd's error (StatusReasonUnknown is empty and omitted)"
    stored = k.meshnode(name) or {}
    assert not (stored.get("status") or {}).get("udp"), "nothing refused is stored"
    small = status_of_size(1024 * 1024)
    k.apply(meshnode(name), {"status": small})  # 1 MiB: stored
    assert len((k.meshnode(name) or {})["status"]["udp"]["services"]) == len(small["udp"]["services"])


def test_a_request_body_over_3_mib_is_refused_before_it_is_decoded(k: Cluster) -> None:
    ns = unique("body")
    k.apply(o.namespace(ns))
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "huge", "namespace": ns},
        "data": {"x": "a" * (MAX_REQUEST_BODY_BYTES + 10)},
    }
    body = refusal(lambda: k.apply(cm))
    assert (body["code"], body["reason"]) == (413, "RequestEntityTooLarge")
    assert body["message"] == "Request entity too large: limit is 3145728"
    cm["data"] = {"x": "a" * (2 * 1024 * 1024)}  # under the body limit, over etcd's: etcd refuses it
    body = refusal(lambda: k.apply(cm))
    assert (body["code"], body["message"]) == (500, "etcdserver: request is too large")
    assert k.get("v1", "ConfigMap", "huge", ns) is None
