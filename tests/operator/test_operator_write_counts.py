"""The operator's loops hold what is live, not a record of every write (issue 28, the operator's RSS under churn):
the reconciler kept the name of every MeshNode, MeshServiceSlice and UDPRoute it wrote, and the policy and
multicluster loops a `(kind, "<ns>/<name>")` tuple per status write, in lists that grew for the life of the operator
(found in a 25-minute churn of the real operator: +160 entries a minute). Here each loop writes on every step;
no container it holds may grow with the number of steps."""

from __future__ import annotations

import asyncio
from collections.abc import Sized
from typing import Any, cast

import pytest

from aether.operator.mcsctl import MulticlusterController
from aether.operator.policyctl import PolicyController
from aether.operator.reconcile.model import PARSERS, ClusterModel, Kind, View
from aether.operator.reconcile.multicluster import parse_export
from aether.operator.reconciler import Reconciler
from aether.testing.apitestbed import objects as o
from aether.testing.recording_writer import RecordingWriter


def sizes(*holders: object) -> dict[str, int]:
    """len() of every container attribute of each holder (strings aside)."""
    return {
        f"{type(h).__name__}.{k}": len(v)
        for h in holders
        for k, v in vars(h).items()
        if isinstance(v, Sized) and not isinstance(v, str)
    }


class DictWriter(RecordingWriter):
    """The recording writer with nothing recorded per write, and the status loops' API calls counted."""

    def __init__(self) -> None:
        super().__init__(record=False)
        self.sink = StatusSink()
        self.custom = cast(Any, self.sink)  # what the status loops patch through

    def post_mcs_event(self, kind: str, meta: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.sink.calls += 1


class StatusSink:
    """CustomObjectsApi's status patches, counted and dropped: the stored copy never changes, so every pass writes."""

    def __init__(self) -> None:
        self.calls = 0

    def patch_namespaced_custom_object_status(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1

    def patch_cluster_custom_object_status(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1


@pytest.mark.asyncio
async def test_the_reconciler_counts_its_writes_instead_of_keeping_each_name() -> None:
    writer = DictWriter()
    objects: dict[tuple[Kind, tuple[str, str]], View] = {}
    rec = Reconciler(writer, lambda k, key: objects.get((k, key)), writer.get_meshnode, "cluster.local", debounce=0)
    task = asyncio.create_task(rec.run())
    rec.ready.set()

    def put(kind: Kind, body: dict[str, Any], gone: bool = False) -> None:
        key = (body["metadata"].get("namespace", ""), body["metadata"]["name"])
        if gone:
            objects.pop((kind, key), None)
        else:
            objects[(kind, key)] = PARSERS[kind](body)
        rec.touch(kind, key)

    async def step(i: int) -> None:  # a pod rolls on n1 and the Service's endpoint moves: a MeshNode and a slice write
        put("pod", {**o.pod("app", f"c-{i}", "n1"), **o.pod_status(f"10.0.0.{i % 200 + 2}")})
        if i:
            put("pod", o.pod("app", f"c-{i - 1}", "n1"), gone=True)
        put("slice", o.endpoint_slice("app", "dns", [("dns", 53, "UDP")], [(f"10.1.0.{i % 200 + 2}", True, None)]))
        await asyncio.sleep(0)
        await asyncio.wait_for(rec.idle.wait(), 30)

    put("namespace", o.namespace("app"))
    put("node", {"metadata": {"name": "n1", "uid": "u1"}})
    put("service", o.service("app", "dns", "10.96.0.10", [("dns", 53, "UDP")]))
    for i in range(30):
        await step(i)
    warm, writes = sizes(rec, rec.model), writer.status_writes
    for i in range(30, 150):
        await step(i)
    task.cancel()
    assert writer.status_writes - writes >= 100, "every step must have patched the MeshNode"
    assert sizes(rec, rec.model) == warm


def test_the_status_loops_count_their_writes_instead_of_keeping_each_one() -> None:
    writer = DictWriter()
    policy = o.authorization_policy("app", "p", ["missing"], [{"from": ["spiffe://cluster.local/ns/app/sa/a"]}])
    policies = PolicyController(writer.sink, lambda: [policy], list, list, list, list, "cluster.local")
    export = parse_export(o.service_export("app", "missing"))  # no such Service: not Valid, a Warning each write
    mcs = MulticlusterController(writer, lambda: [export], list, ClusterModel())
    for _ in range(20):
        policies.one_pass()
        mcs.one_pass()
    warm, calls = sizes(policies, mcs), writer.sink.calls
    for _ in range(100):
        policies.one_pass()
        mcs.one_pass()
    assert writer.sink.calls - calls >= 300, "every pass must have written the policy and the export (+ its Event)"
    assert sizes(policies, mcs) == warm
