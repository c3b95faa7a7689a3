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


def pods(n: int) -> list[dict[str, Any]]:
    return [
        {
            "uid": f"0c6f1e2a-{i:04x}-4b1d-9d3e-{i:012x}",
            "namespace": f"ns-{i // 100}",
            "name": f"pod-{i}-{'x' * 40}",
            "ip": f"10.244.{i // 250 % 256}.{i % 250 + 1}",
            "serviceAccount": f"sa-{i}",
        }
        for i in range(n)
    ]


def status_of_size(target: int) -> dict[str, Any]:
    """A MeshNode status whose compact JSON is just over `target` bytes (pods: a field the CRD has, so the server
    keeps it; it prunes what the schema does not know)."""
    per = len(json.dumps(pods(1)[0], separators=(",", ":")))
    return {"pods": pods(target // per + 1)}


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
    assert not (stored.get("status") or {}).get("pods"), "nothing refused is stored"
    small = status_of_size(1024 * 1024)
    k.apply(meshnode(name), {"status": small})  # 1 MiB: stored
    assert len((k.meshnode(name) or {})["status"]["pods"]) == len(small["pods"])


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


@pytest.mark.slow
def test_the_10000_service_mesh_old_layout_refused_new_layout_stored() -> None:
    """10,000 Services in 1,000 mesh namespaces with the default egress (the synthetic cluster bench/operator_reconcile measures, its
    50,000 pods on 500 nodes: 100 a node, under the kubelet's default maximum of 110; a MeshNode grows with its own
    pods). The old layout, every arm in the MeshNode (8 MiB), is refused as a real API server refuses it; every
    MeshServiceSlice and every MeshNode of the new layout is stored, none over 512 KiB."""
    from aether.api.slices import SLICE_KIND, SLICE_PLURAL
    from aether.operator.kubeapi import slice_labels
    from aether.operator.nodestatus import applied_status, owned_wire
    from aether.testing.apitestbed import mesh_crds
    from aether.testing.apitestbed.store import ApiError, Store
    from aether.testing.synthetic_cluster import build

    m, _ = build(1000, 500, scoped=False)
    out = m.reconcile()
    assert len(out.slices) == 1000 and len(out.desired) == 500
    old_layout = owned_wire(next(iter(out.desired.values())).status())
    assert stored_size("", old_layout) > 7 * 2**20

    def store_all(store: Store) -> tuple[str, int, int]:
        mn = store.lookup("mesh.aether.dev", "v1alpha1", "meshnodes")
        ss = store.lookup("mesh.aether.dev", "v1alpha1", SLICE_PLURAL)
        store.create(mn, None, meshnode("old-layout"))
        try:
            store.replace(mn, None, "old-layout", {**meshnode("old-layout"), "status": old_layout}, "status")
            refused = "stored"
        except ApiError as exc:
            refused = f"{exc.code} {exc.reason!r} {exc.message}"
        largest = 0
        for name, spec in out.slices.items():
            assert spec is not None
            body = {"apiVersion": MN, "kind": SLICE_KIND, "metadata": {"name": name, "labels": slice_labels(spec)}}
            created = store.create(ss, None, {**body, "spec": spec})
            largest = max(largest, stored_size("", created))
        for name, desired in out.desired.items():
            store.create(mn, None, meshnode(name))
            status = applied_status(desired.owned, None, "2026-12-01T00:00:00Z")
            written = store.replace(mn, None, name, {**meshnode(name), "status": status}, "status")
            largest = max(largest, stored_size("", written))
        return refused, len(store.objects[ss.key]), largest

    store = Store()  # the test bed's store itself (over HTTP the 8 MiB body would meet the 3 MiB wall first)
    for crd in mesh_crds():
        store.create(store.lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions"), None, crd)
    refused, slices, largest = store_all(store)
    assert refused == "500 '' etcdserver: request is too large"
    assert slices == 1000
    assert largest <= 512 * 1024, largest
