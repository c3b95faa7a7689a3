"""MeshServiceSlices, pure: how a namespace's tables are split, and that each kind of change writes in proportion
to itself (an endpoint change: one slice, no MeshNode; a route re-point: the parent Service's slice; a pod landing:
that node's MeshNode only), with a JSON patch that carries only the change."""

from __future__ import annotations

import json
from typing import Any

from aether.api.slices import MeshServiceSlice, slice_index
from aether.operator.reconcile.model import ClusterModel, Output
from aether.operator.reconcile.slicing import TARGET_SERVICES
from aether.operator.slicewire import same_slice, slice_ops
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.patches import json_patch

UDP = [("dns", 53, "UDP")]
SLICE_UDP = [("dns", 5353, "UDP")]
N = 300  # Services in the namespace: several slices


def cluster(n: int = N) -> ClusterModel:
    m = ClusterModel()
    m.apply_raw("namespace", o.namespace("app"))
    m.apply_raw("namespace", o.namespace("other"))
    for node in ("n1", "n2"):
        m.apply_raw("node", {"metadata": {"name": node, "uid": f"u-{node}"}})
    pod(m, "app", "client", "n1", "10.0.0.2")
    pod(m, "other", "o", "n2", "10.0.1.2")
    for i in range(n):
        m.apply_raw("service", o.service("app", f"s{i}", f"10.96.{i // 250}.{i % 250 + 1}", UDP))
        endpoints(m, i, True)
    return m


def pod(m: ClusterModel, ns: str, name: str, node: str, ip: str) -> None:
    body = o.pod(ns, name, node)
    body["metadata"]["uid"] = f"uid-{ns}-{name}"
    body.update(o.pod_status(ip))
    m.apply_raw("pod", body)


def endpoints(m: ClusterModel, i: int, ready: bool) -> None:
    m.apply_raw("slice", o.endpoint_slice("app", f"s{i}", SLICE_UDP, [(f"10.1.{i // 250}.{i % 250 + 1}", ready, None)]))


def digests(out: Output) -> dict[str, str]:
    return {name: d.digest for name, d in out.desired.items()}


def test_a_namespace_is_split_into_bounded_slices_every_service_in_exactly_one() -> None:
    m = cluster()
    out = m.reconcile()
    specs = {n: s for n, s in out.slices.items() if s is not None}
    assert len(specs) == 8, "300 Services: the smallest power of two keeping the average at or under the target"
    assert all(s["count"] == 8 for s in specs.values())
    assert max(s["services"] for s in specs.values()) <= 2 * TARGET_SERVICES
    held = [a["service"] for s in specs.values() for a in s["udp"]["services"]]
    assert sorted(held) == sorted(f"app/s{i}" for i in range(N)), "each Service once"
    for name, spec in specs.items():
        MeshServiceSlice.model_validate({"metadata": {"name": name}, "spec": spec})  # the CRD's model admits it
        for arm in spec["udp"]["services"]:
            assert slice_index(arm["service"].split("/")[1], 8) == spec["index"]
    refs = out.desired["n1"].owned["serviceSlices"]
    assert refs["names"] == sorted(specs) and refs["namespaces"] == ["app", "other"]
    assert refs["selector"] == "app.kubernetes.io/managed-by=aether-operator", "default egress: every mesh namespace"
    assert not {"udp", "tcp"} & set(out.desired["n1"].owned), "the MeshNode holds no arm"
    again = cluster().reconcile(full=True)
    assert {n: s for n, s in again.slices.items() if s} == specs, "recomputed from nothing: the same slices"


def test_an_endpoint_change_rewrites_one_slice_and_no_meshnode() -> None:
    m = cluster()
    before = digests(m.reconcile())
    endpoints(m, 17, False)
    out = m.reconcile()
    assert list(out.slices) == [f"app.{slice_index('s17', 8)}"]
    assert {n: d for n, d in digests(out).items() if before.get(n) != d} == {}, "no MeshNode changes"


def test_a_route_repoint_rewrites_the_parent_services_slice() -> None:
    m = cluster()
    before = digests(m.reconcile())
    route = o.udproute("app", "r", "s3", [o.backend("s4", 53)])
    route["metadata"].update({"generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"})
    m.apply_raw("route", route)
    out = m.reconcile()
    assert list(out.slices) == [f"app.{slice_index('s3', 8)}"]
    spec = out.slices[f"app.{slice_index('s3', 8)}"]
    assert spec is not None
    arm = next(a for a in spec["udp"]["services"] if a["service"] == "app/s3")
    assert arm["cluster"] == "udp:app/s4" and arm["route"] == "app/r"
    assert {n for n, d in digests(out).items() if before.get(n) != d} == set()


def test_a_pod_landing_writes_that_nodes_meshnode_only() -> None:
    m = cluster()
    before = digests(m.reconcile())
    pod(m, "app", "late", "n2", "10.0.1.9")
    out = m.reconcile()
    assert out.slices == {}
    assert {n for n, d in digests(out).items() if before.get(n) != d} == {"n2"}


def test_a_service_added_rewrites_one_slice_and_a_namespace_emptied_deletes_its_slices() -> None:
    m = cluster(10)
    m.reconcile()
    m.apply_raw("service", o.service("app", "new", "10.96.9.9", UDP))
    assert list(m.reconcile().slices) == ["app.0"]
    for i in range(10):
        m.apply_raw("service", o.service("app", f"s{i}", "", UDP), deleted=True)
    m.apply_raw("service", o.service("app", "new", "", UDP), deleted=True)
    assert m.reconcile().slices == {"app.0": None}


def test_the_json_patch_carries_only_the_change() -> None:
    m = cluster()
    m.reconcile()
    name = f"app.{slice_index('s17', 8)}"
    old = m.results["app"].slices[name]
    stored: dict[str, Any] = {
        "metadata": {
            "name": name,
            "resourceVersion": "41",
            "labels": {"app.kubernetes.io/managed-by": "aether-operator", "mesh.aether.dev/namespace": "app"},
        },
        "spec": old,
    }
    endpoints(m, 17, False)
    new = m.reconcile().slices[name]
    assert new is not None
    ops = slice_ops(stored, new, stored["metadata"]["labels"])
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    assert [op["op"] for op in ops[1:]] == ["replace"] and ops[1]["path"].startswith("/spec/udp/services/")
    assert len(json.dumps(ops)) * 10 < len(json.dumps(new)), "a small part of the slice"
    patched = json_patch(stored, ops)
    assert same_slice(patched, new, stored["metadata"]["labels"])
    stale = {**stored, "metadata": {**stored["metadata"], "resourceVersion": "40"}}
    assert slice_ops(stale, new, {})[0]["value"] == "40", "built from a stale copy: its test fails on the API"


def test_a_service_in_or_out_of_a_slice_is_one_add_or_remove() -> None:
    m = cluster()
    m.reconcile()
    name = f"app.{slice_index('zz-new', 8)}"
    labels = {"app.kubernetes.io/managed-by": "aether-operator", "mesh.aether.dev/namespace": "app"}
    stored: dict[str, Any] = {"metadata": {"name": name, "resourceVersion": "7", "labels": labels}}
    stored["spec"] = m.results["app"].slices[name]
    m.apply_raw("service", o.service("app", "zz-new", "10.96.99.1", UDP))
    grown = m.reconcile().slices[name]
    assert grown is not None
    ops = slice_ops(stored, grown, labels)
    assert [op["op"] for op in ops] == ["test", "replace", "add"], "the count, then the one arm added"
    assert same_slice(json_patch(stored, ops), grown, labels)
    back = {**stored, "spec": grown}
    m.apply_raw("service", o.service("app", "zz-new", "", UDP), deleted=True)
    shrunk = m.reconcile().slices[name]
    assert shrunk is not None
    ops = slice_ops(back, shrunk, labels)
    assert [op["op"] for op in ops] == ["test", "replace", "remove"]
    assert same_slice(json_patch(back, ops), shrunk, labels)
