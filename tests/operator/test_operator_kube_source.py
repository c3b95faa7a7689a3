"""xds cluster mode (aether.xds.sidecar.kube_source): MeshNode snapshots in, sidecar status out, on the real
control plane by default (the operator tests' `api` fixture; `AETHER_CONTROL_PLANE=emulated` for the API test bed).
A MeshNode status the CRD's schema refuses is refused by the server (422); the sidecar's own check of what it reads
is shown behind an older, schema-less MeshNode CRD, as it would run against a cluster not yet upgraded."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from aether.api.client import ApiException
from aether.api.crdgen import crds_dir
from aether.api.meshnode import Condition, QuicPair
from aether.testing import apitestbed
from aether.testing.apiserver import Kind, api_server
from aether.testing.apitestbed.faults import Faults
from aether.testing.apitestbed.harness import Cluster, unique
from aether.xds.sidecar.kube_source import source, status_sink
from aether.xds.sidecar.sources import StateUpdate

MN = ("mesh.aether.dev/v1alpha1", "MeshNode")
MERGE = "application/merge-patch+json"
BAD_STATUS = {"pods": [{"uid": "u1", "namespace": "a", "name": 7}]}  # a status the model (and the CRD's schema) refuses


@pytest.fixture
def k(api: tuple[str, Faults | None]) -> Cluster:
    return Cluster(api[0], api[1])


@pytest.fixture
def updates(api: tuple[str, Faults | None]) -> Iterator[tuple[str, queue.Queue[StateUpdate]]]:
    with pumped(api[0]) as pump:
        yield pump


@contextlib.contextmanager
def pumped(kubeconfig: str) -> Iterator[tuple[str, queue.Queue[StateUpdate]]]:
    node = unique("ks-node")
    q: queue.Queue[StateUpdate] = queue.Queue()
    stop = threading.Event()
    src = source(node, kubeconfig)
    src.watch_timeout = 2

    def pump() -> None:
        for u in src.updates(stop):
            q.put(u)

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        yield node, q
    finally:
        stop.set()
        t.join(30)
        assert not t.is_alive()


def meshnode(name: str) -> dict[str, Any]:
    return {"apiVersion": "mesh.aether.dev/v1alpha1", "kind": "MeshNode", "metadata": {"name": name}, "spec": {}}


def status_patch(k: Cluster, name: str, status: dict[str, Any]) -> None:
    k.res(*MN).subresources["status"].patch(body={"status": status}, name=name, content_type=MERGE)


def test_source_yields_missing_then_each_change_then_deleted(
    k: Cluster, updates: tuple[str, queue.Queue[StateUpdate]]
) -> None:
    node, q = updates
    first = q.get(timeout=30)
    assert first.node is None and first.error is not None and "does not exist" in first.error
    k.apply(meshnode(node))
    assert (u := q.get(timeout=30)).node is not None and u.node.metadata.name == node
    pod = {"uid": "u1", "namespace": "a", "name": "b", "ip": "10.1.0.1", "serviceAccount": "sa"}
    status_patch(k, node, {"pods": [pod]})
    u = q.get(timeout=30)
    assert u.node is not None and [p.name for p in u.node.status.pods] == ["b"]
    with pytest.raises(ApiException) as refused:  # the server checks the CRD's schema: nothing reaches the sidecar
        status_patch(k, node, BAD_STATUS)
    assert refused.value.status == 422 and "status.pods[0].name" in str(refused.value.body)
    k.delete(*MN, node)
    gone = q.get(timeout=30)
    assert gone.node is None and gone.error and "deleted" in gone.error


def test_status_sink_merges_conditions_and_pairs_without_touching_operator_fields(k: Cluster) -> None:
    node = unique("ks-sink")
    k.apply(meshnode(node))
    operator_part: dict[str, Any] = {
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Reconciled", "lastTransitionTime": "2026-01-01T00:00:00Z"}
        ],
        "quic": {"identities": ["spiffe://cluster.local/ns/a/sa/b"]},
    }
    status_patch(k, node, operator_part)
    # as stored: a real server also fills in the CRD's defaults (a condition's message, the pair counts)
    stored = (k.get(*MN, node) or {})["status"]
    sink = status_sink(node, k.kubeconfig)
    sink.publish(node, [Condition(type="Programmed", status="True", reason="Served", message="3 listeners")])
    sink.publish(node, [Condition(type="Programmed", status="True", reason="Served", message="4 listeners")])
    pair = QuicPair(source="spiffe://cluster.local/ns/a/sa/b", destination="c/web", twin="quic:c/web@b")
    sink.publish_pairs(node, [pair], [])
    status = (k.get(*MN, node) or {})["status"]
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Ready"] == stored["conditions"][0]
    assert {key: v for key, v in conds["Ready"].items() if key != "message"} == operator_part["conditions"][0]
    assert conds["Programmed"]["message"] == "4 listeners" and conds["Programmed"]["lastTransitionTime"]
    assert status["quic"]["identities"] == ["spiffe://cluster.local/ns/a/sa/b"]
    assert status["quic"]["pairs"] == [pair.wire()] and status["quic"]["pairCount"] == 1
    assert status["quic"]["dormantPairs"] == []


def test_source_reports_an_unreachable_api_and_keeps_trying(tmp_path: Any) -> None:
    import socket

    from aether.testing.apitestbed import write_kubeconfig

    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kc = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{port}")
    src = source("n1", str(kc))
    src.backoff = 0.05
    stop = threading.Event()
    got = []
    for u in src.updates(stop):
        got.append(u)
        if len(got) == 2:
            stop.set()
    assert all(u.node is None and u.error and "API error" in u.error for u in got)


def meshslice(name: str, ns: str, index: int, count: int, arms: list[dict[str, Any]]) -> dict[str, Any]:
    spec = {"namespace": ns, "index": index, "count": count, "services": len(arms), "udp": {"services": arms}}
    return {"apiVersion": MN[0], "kind": "MeshServiceSlice", "metadata": {"name": name}, "spec": spec}


def test_source_programs_the_union_of_the_meshnode_and_the_slices_it_names(
    k: Cluster, updates: tuple[str, queue.Queue[StateUpdate]]
) -> None:
    """The state is the MeshNode with its named slices' arms; a named slice missing or stale is a problem (the rest
    is served); a change to a named slice is a new state, one to a slice it does not name is none."""
    node, q = updates
    assert q.get(timeout=30).node is None
    ns = unique("ksns")

    def arm(i: int, port: int = 53) -> dict[str, Any]:
        return {"service": f"{ns}/s{i}", "vip": f"10.96.7.{i}", "cluster": f"udp:{ns}/s{i}", "endpoints": []} | (
            {"endpoints": [{"ip": f"10.1.7.{i}", "port": port}]}
        )

    k.apply(meshslice(f"{ns}.0", ns, 0, 2, [arm(1)]))
    k.apply(meshslice(f"{ns}-other.0", f"{ns}-other", 0, 1, [arm(9)]))
    k.apply(meshnode(node))
    status_patch(k, node, {"serviceSlices": {"selector": "x", "namespaces": [ns], "names": [f"{ns}.0", f"{ns}.1"]}})
    u = wait_update(q, lambda u: u.node is not None and u.node.status.service_slices is not None)
    assert [a.service for a in u.node.status.udp.services] == [f"{ns}/s1"]
    assert u.problems == (f"1 MeshServiceSlices missing: {ns}.1",)
    k.apply(meshslice(f"{ns}.1", ns, 1, 2, [arm(2)]))
    u = wait_update(q, lambda u: u.node is not None and len(u.node.status.udp.services) == 2)
    assert u.problems == ()
    k.apply(meshslice(f"{ns}-other.0", f"{ns}-other", 0, 1, [arm(9, 54)]))  # not named: no new state
    k.apply(meshslice(f"{ns}.1", ns, 1, 4, [arm(2, 55)]))  # from another split of the namespace: stale
    u = q.get(timeout=30)  # events arrive in order: had the unnamed slice's change yielded, this would be it
    assert u.problems == (f"1 MeshServiceSlices stale: {ns}.1 (part 1 of 4 of {ns})",)
    assert u.node is not None and u.node.status.udp.services[1].endpoints[0].port == 55


def wait_update(q: queue.Queue[StateUpdate], ok: Any) -> Any:
    while True:
        u = q.get(timeout=30)
        if ok(u):
            return u


def older_meshnode_crd(path: Path) -> Path:
    """The MeshNode CRD as an older release might have shipped it: the same names, a status of any shape."""
    crd = yaml.safe_load((crds_dir() / "meshnode.yaml").read_text())
    for version in crd["spec"]["versions"]:
        props = version["schema"]["openAPIV3Schema"]["properties"]
        props["status"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    path.write_text(yaml.safe_dump(crd))
    return path


@pytest.fixture
def schemaless(api_kind: Kind, tmp_path: Path) -> Iterator[str]:
    """A kubeconfig for an API server that stores any MeshNode status: on the real control plane, one with the older
    CRD installed; on the emulator, a test bed that validates nothing."""
    if os.environ.get("AETHER_KUBECONFIG"):
        pytest.skip("installs its own MeshNode CRD")
    if api_kind == "emulated":
        bed = apitestbed.start(validate=False)
        try:
            yield str(bed.kubeconfig_path)
        finally:
            bed.stop()
        return
    with api_server("real", crds=False) as server:
        assert server.control_plane is not None
        slices = crds_dir() / "meshserviceslices.yaml"
        server.control_plane.install([older_meshnode_crd(tmp_path / "meshnode.yaml"), slices])
        yield server.kubeconfig


def test_source_reports_a_status_the_model_refuses(schemaless: str) -> None:
    """Behind a CRD that does not check it, the bad status is stored, and the sidecar reports it as an error (it
    serves nothing from it); the next good status is served again."""
    k = Cluster(schemaless, None)
    with pumped(schemaless) as (node, q):
        assert q.get(timeout=30).node is None
        k.apply(meshnode(node))
        assert q.get(timeout=30).node is not None
        status_patch(k, node, BAD_STATUS)
        bad = q.get(timeout=30)
        assert bad.node is None and bad.error and "pods.0.name" in bad.error
        status_patch(k, node, {"pods": []})
        good = q.get(timeout=30)
        assert good.node is not None and good.error is None
