"""The API test bed fixes what plain kmock 0.8 gets wrong (docs/limits.md, "The API servers the tests run on"), seen
through real clients."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.request
from typing import Any

import kubernetes
import pytest
import yaml

from aether.api.client import api_client
from aether.testing.apitestbed import TestBed
from aether.testing.apitestbed import objects as o

MERGE, JSONPATCH = "application/merge-patch+json", "application/json-patch+json"
G, V, P = "mesh.aether.dev", "v1alpha1", "meshnodes"


@pytest.fixture(scope="module")
def client(bed: TestBed) -> Any:
    return api_client(str(bed.kubeconfig_path))


def raw(bed: TestBed, method: str, path: str, body: Any = None, ctype: str = "application/json") -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(bed.url + path, data=data, method=method, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_namespaces_list_and_object_metadata(bed: TestBed, client: Any) -> None:
    core: Any = kubernetes.client.CoreV1Api(client)
    assert {"default", "kube-system"} <= {n.metadata.name for n in core.list_namespace().items}
    ns = core.create_namespace(o.namespace("tb-meta"))  # POST answers 201 with the object (client returns it)
    assert ns.metadata.uid and ns.metadata.resource_version and ns.metadata.generation == 1
    assert ns.metadata.creation_timestamp is not None
    code, body = raw(bed, "POST", "/api/v1/namespaces", {"metadata": {"generateName": "tb-gen-"}})
    assert code == 201 and body["metadata"]["name"].startswith("tb-gen-")
    code, _ = raw(bed, "POST", "/api/v1/namespaces", {"metadata": {"name": "tb-meta"}})
    assert code == 409


def test_status_subresource_and_generation(bed: TestBed, client: Any) -> None:
    core: Any = kubernetes.client.CoreV1Api(client)
    core.create_namespace(o.namespace("tb-status"))
    body = o.pod("tb-status", "p", "n1")
    body.update(o.pod_status("10.0.0.1"))
    created = core.create_namespaced_pod("tb-status", body)
    assert created.status is None or created.status.phase is None  # status is not set through the main endpoint
    p = core.patch_namespaced_pod_status("p", "tb-status", o.pod_status("10.0.0.1"), _content_type=MERGE)
    assert p.status.phase == "Running" and p.metadata.generation == 1  # /status never bumps generation
    p = core.patch_namespaced_pod(
        "p", "tb-status", {"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Failed"}}, _content_type=MERGE
    )
    assert p.status.phase == "Running" and p.metadata.generation == 1  # main endpoint ignores status
    p = core.patch_namespaced_pod("p", "tb-status", {"spec": {"activeDeadlineSeconds": 5}}, _content_type=MERGE)
    assert p.metadata.generation == 2  # spec change bumps generation
    code, _ = raw(bed, "PATCH", "/api/v1/namespaces/tb-status/pods/p/status", {"spec": {"nodeName": "zz"}}, MERGE)
    assert code == 200
    assert core.read_namespaced_pod("p", "tb-status").spec.node_name == "n1"  # /status changes only status


def test_put_json_patch_test_op_and_optimistic_concurrency(bed: TestBed, client: Any) -> None:
    core: Any = kubernetes.client.CoreV1Api(client)
    core.create_namespace(o.namespace("tb-put"))
    svc = core.create_namespaced_service("tb-put", o.service("tb-put", "s", "10.96.0.1", [("dns", 53, "UDP")]))
    rv = svc.metadata.resource_version
    body = client.sanitize_for_serialization(svc)
    body["metadata"]["labels"] = {"a": "b"}
    replaced = core.replace_namespaced_service("s", "tb-put", body)
    assert replaced.metadata.labels == {"a": "b"} and replaced.metadata.resource_version != rv
    body["metadata"]["resourceVersion"] = rv  # stale
    with pytest.raises(kubernetes.client.exceptions.ApiException) as exc:
        core.replace_namespaced_service("s", "tb-put", body)
    assert exc.value.status == 409
    path = "/api/v1/namespaces/tb-put/services/s"
    ok = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": replaced.metadata.resource_version},
        {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]},
    ]
    assert raw(bed, "PATCH", path, ok, JSONPATCH)[0] == 200
    assert raw(bed, "PATCH", path, ok, JSONPATCH)[0] == 422  # the test op fails: what kopf expects
    code, _ = raw(bed, "PATCH", path, {"metadata": {"resourceVersion": "1", "labels": {"c": "d"}}}, MERGE)
    assert code == 409


def test_finalizers_delay_deletion(bed: TestBed, client: Any) -> None:
    core: Any = kubernetes.client.CoreV1Api(client)
    core.create_namespace(o.namespace("tb-fin"))
    core.create_namespaced_config_map("tb-fin", {"metadata": {"name": "c", "finalizers": ["x/y"]}})
    core.delete_namespaced_config_map("c", "tb-fin")
    assert core.read_namespaced_config_map("c", "tb-fin").metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map("c", "tb-fin", {"metadata": {"finalizers": None}}, _content_type=MERGE)
    with pytest.raises(kubernetes.client.exceptions.ApiException) as exc:
        core.read_namespaced_config_map("c", "tb-fin")
    assert exc.value.status == 404


def test_crd_registers_in_discovery_and_owner_references_are_collected(bed: TestBed, client: Any) -> None:
    code, groups = raw(bed, "GET", "/apis")
    assert code == 200 and "mesh.aether.dev" in [g["name"] for g in groups["groups"]]
    code, res = raw(bed, "GET", "/apis/mesh.aether.dev/v1alpha1")
    assert {"meshnodes", "meshnodes/status"} <= {r["name"] for r in res["resources"]}
    assert raw(bed, "GET", "/apis/example.dev/v1")[0] == 404
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "things.example.dev"},
        "spec": {
            "group": "example.dev",
            "scope": "Namespaced",
            "names": {"plural": "things", "singular": "thing", "kind": "Thing"},
            "versions": [{"name": "v1", "served": True, "storage": True}],
        },
    }
    assert raw(bed, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)[0] == 201
    assert "things" in {r["name"] for r in raw(bed, "GET", "/apis/example.dev/v1")[1]["resources"]}
    core: Any = kubernetes.client.CoreV1Api(client)
    custom: Any = kubernetes.client.CustomObjectsApi(client)
    node = core.create_node(o.node("tb-gc-node"))
    custom.create_cluster_custom_object(
        G,
        V,
        P,
        {
            "apiVersion": f"{G}/{V}",
            "kind": "MeshNode",
            "metadata": {
                "name": "tb-gc-node",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": "tb-gc-node", "uid": node.metadata.uid}
                ],
            },
        },
    )
    custom.create_cluster_custom_object(
        G, V, P, {"apiVersion": f"{G}/{V}", "kind": "MeshNode", "metadata": {"name": "tb-free"}}
    )
    core.delete_node("tb-gc-node")
    names = [m["metadata"]["name"] for m in custom.list_cluster_custom_object(G, V, P)["items"]]
    assert "tb-gc-node" not in names and "tb-free" in names


def test_watch_resumes_from_resource_version_without_losing_events(bed: TestBed, client: Any) -> None:
    core: Any = kubernetes.client.CoreV1Api(client)
    core.create_namespace(o.namespace("tb-watch"))
    listed = core.list_namespaced_config_map("tb-watch")
    rv = listed.metadata.resource_version
    for i in range(20):  # written before the watch starts: must be replayed from rv
        core.create_namespaced_config_map("tb-watch", {"metadata": {"name": f"c{i}"}})
    seen: list[str] = []

    def late_writes() -> None:
        for i in range(20, 30):
            core.create_namespaced_config_map("tb-watch", {"metadata": {"name": f"c{i}"}})

    t = threading.Thread(target=late_writes)
    w: Any = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]  # the kubernetes client is untyped
    t.start()
    for ev in w.stream(core.list_namespaced_config_map, "tb-watch", resource_version=rv, timeout_seconds=3):
        seen.append(ev["object"].metadata.name)
        if len(seen) == 30:
            w.stop()
    t.join()
    assert seen == [f"c{i}" for i in range(30)]


def test_watch_timeout_and_initial_events_bookmark(bed: TestBed) -> None:
    req = urllib.request.Request(
        bed.url + "/api/v1/namespaces?watch=true&timeoutSeconds=1&sendInitialEvents=true&allowWatchBookmarks=true"
    )
    with urllib.request.urlopen(req, timeout=30) as resp:  # ends by itself after timeoutSeconds
        lines = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    assert lines[-1]["type"] == "BOOKMARK"
    assert lines[-1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
    assert {"default", "kube-system"} <= {e["object"]["metadata"]["name"] for e in lines if e["type"] == "ADDED"}


def test_audit_records_every_call_as_rbac_sees_it(bed: TestBed, client: Any) -> None:
    core: Any = kubernetes.client.CoreV1Api(client)
    core.create_namespace(o.namespace("tb-audit"))
    core.patch_namespace_status("tb-audit", {"status": {"phase": "Active"}}, _content_type=MERGE)
    core.list_namespaced_pod("tb-audit")
    tail = [(a.verb, a.api_group, a.resource, a.subresource, a.namespace) for a in bed.audit[-3:]]
    assert tail == [
        ("create", "", "namespaces", None, None),
        ("patch", "", "namespaces", "status", None),
        ("list", "", "pods", None, "tb-audit"),
    ]


@pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not installed (the python client tests cover the API)"
)
def test_kubectl_apply_get_patch_delete(bed: TestBed, tmp_path: Any) -> None:
    kc = ["kubectl", "--kubeconfig", str(bed.kubeconfig_path)]
    manifest = tmp_path / "svc.yaml"
    docs = [o.namespace("tb-kubectl"), o.service("tb-kubectl", "s", "10.96.9.9", [("dns", 53, "UDP")])]
    manifest.write_text(yaml.safe_dump_all(docs))

    def run(*args: str) -> str:
        r = subprocess.run([*kc, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    run("apply", "--validate=false", "-f", str(manifest))
    assert json.loads(run("get", "-n", "tb-kubectl", "svc", "s", "-o", "json"))["spec"]["clusterIP"] == "10.96.9.9"
    run("patch", "-n", "tb-kubectl", "svc", "s", "--type=merge", "-p", '{"metadata":{"labels":{"k":"v"}}}')
    run("apply", "--validate=false", "-f", str(manifest))
    run("delete", "-n", "tb-kubectl", "svc", "s")
    assert "s" not in run("get", "-n", "tb-kubectl", "svc", "-o", "name")


def test_meshnode_printer_columns_as_a_table(bed: TestBed, client: Any) -> None:
    custom: Any = kubernetes.client.CustomObjectsApi(client)
    custom.create_cluster_custom_object(
        G, V, P, {"apiVersion": f"{G}/{V}", "kind": "MeshNode", "metadata": {"name": "tb-table"}}
    )
    status = {
        "summary": {"pods": 3, "slices": 2},
        "quic": {"pairCount": 1, "dormantPairCount": 0},
        "conditions": [
            {"type": "Degraded", "status": "False", "reason": "A"},
            {"type": "Ready", "status": "True", "reason": "R"},
        ],
    }
    custom.patch_cluster_custom_object_status(G, V, P, "tb-table", {"status": status}, _content_type=MERGE)
    req = urllib.request.Request(
        bed.url + f"/apis/{G}/{V}/{P}/tb-table", headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        t = json.loads(resp.read())
    assert t["kind"] == "Table"
    assert [c["name"] for c in t["columnDefinitions"]] == [
        "Name",
        "Pods",
        "Slices",
        "QUIC Pairs",
        "Dormant Pairs",
        "Ready",
        "Programmed",
        "Degraded",
        "Age",
    ]
    assert t["rows"][0]["cells"][:8] == ["tb-table", 3, 2, 1, 0, "True", None, "False"]
