"""xds cluster mode (aether.xds.sidecar.kube_source) on the API test bed: MeshNode snapshots in, sidecar status out."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from aether.api.meshnode import Condition, QuicPair
from aether.testing.apitestbed import TestBed, start
from aether.testing.apitestbed.harness import Cluster, unique
from aether.xds.sidecar.kube_source import source, status_sink
from aether.xds.sidecar.sources import StateUpdate

MN = ("mesh.aether.dev/v1alpha1", "MeshNode")
MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[str, TestBed | None]]:
    """A bed that stores what a validating API server would refuse (a MeshNode status with a bad arm): the sidecar
    must still report it as an error, as it would behind an older CRD or a server without the schema."""
    bed = start(validate=False)
    try:
        yield str(bed.kubeconfig_path), bed
    finally:
        bed.stop()


@pytest.fixture
def k(api: tuple[str, TestBed | None]) -> Cluster:
    return Cluster(api[0], api[1])


@pytest.fixture
def updates(api: tuple[str, TestBed | None]) -> Iterator[tuple[str, queue.Queue[StateUpdate]]]:
    node = unique("ks-node")
    q: queue.Queue[StateUpdate] = queue.Queue()
    stop = threading.Event()
    src = source(node, api[0])
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
    arm = {"service": "a/b", "vip": "10.96.0.1", "cluster": "udp:a/b", "endpoints": [{"ip": "10.1.0.1", "port": 53}]}
    status_patch(k, node, {"udp": {"services": [arm]}})
    u = q.get(timeout=30)
    assert u.node is not None and [a.cluster for a in u.node.status.udp.services] == ["udp:a/b"]
    status_patch(k, node, {"udp": {"services": [{"service": 7}]}})  # a status the model refuses
    bad = q.get(timeout=30)
    assert bad.node is None and bad.error and "udp.services.0" in bad.error
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
    sink = status_sink(node, k.kubeconfig)
    sink.publish(node, [Condition(type="Programmed", status="True", reason="Served", message="3 listeners")])
    sink.publish(node, [Condition(type="Programmed", status="True", reason="Served", message="4 listeners")])
    pair = QuicPair(source="spiffe://cluster.local/ns/a/sa/b", destination="c/web", twin="quic:c/web@b")
    sink.publish_pairs(node, [pair], [])
    status = (k.get(*MN, node) or {})["status"]
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Ready"] == operator_part["conditions"][0]
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
