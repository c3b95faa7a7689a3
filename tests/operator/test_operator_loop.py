"""The reconcile loop on its own: bursts coalesce into one reconcile, a failing write is retried, statuses
are written only when they change. The writer here is a recording stand-in for KubeWriter
(`aether.testing.recording_writer`; the API side is covered by the contract tests)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aether.operator.reconcile.model import PARSERS, Kind, View
from aether.operator.reconciler import Reconciler
from aether.testing.apitestbed import objects as o
from aether.testing.recording_writer import RecordingWriter

pytestmark = pytest.mark.asyncio


def setup(writer: RecordingWriter) -> tuple[Reconciler, dict[tuple[Kind, tuple[str, str]], View]]:
    objects: dict[tuple[Kind, tuple[str, str]], View] = {}

    def lookup(kind: Kind, key: tuple[str, str]) -> View | None:
        return objects.get((kind, key))

    rec = Reconciler(writer, lookup, writer.get_meshnode, "cluster.local", debounce=0.05)
    return rec, objects


def put(rec: Reconciler, objects: dict[tuple[Kind, tuple[str, str]], View], kind: Kind, body: dict[str, Any]) -> None:
    meta = body["metadata"]
    key = (meta.get("namespace", ""), meta["name"])
    objects[(kind, key)] = PARSERS[kind](body)
    rec.touch(kind, key)


async def settle(rec: Reconciler) -> None:
    await asyncio.sleep(0)
    await asyncio.wait_for(rec.idle.wait(), 30)


async def test_a_burst_coalesces_into_one_reconcile_and_one_write_per_node() -> None:
    writer = RecordingWriter()
    rec, objects = setup(writer)
    task = asyncio.create_task(rec.run())
    rec.ready.set()
    put(rec, objects, "namespace", o.namespace("app"))
    put(rec, objects, "node", {"metadata": {"name": "n1", "uid": "u1"}})
    put(rec, objects, "pod", {**o.pod("app", "c", "n1"), **o.pod_status("10.0.0.2")})
    for i in range(100):
        put(rec, objects, "service", o.service("app", f"s{i}", f"10.96.0.{i + 1}", [("dns", 53, "UDP")]))
    await settle(rec)
    assert rec.cycles == 1 and writer.patches == ["n1"]
    status = writer.meshnodes["n1"]["status"]
    assert status["summary"] == {"pods": 1, "namespaces": 1, "slices": 2} and "udp" not in status
    assert sorted(writer.slice_writes) == sorted(status["serviceSlices"]["names"]) == ["app.0", "app.1"]
    assert sum(len(sl["spec"]["udp"]["services"]) for sl in writer.slices.values()) == 100
    put(rec, objects, "service", o.service("app", "s0", "10.96.0.1", [("dns", 53, "UDP")]))  # no change
    await settle(rec)
    assert writer.patches == ["n1"], "an unchanged status must not be written again"
    assert len(writer.slice_writes) == 2, "nor an unchanged slice"
    task.cancel()


async def test_a_failing_write_is_retried_and_the_loop_survives() -> None:
    writer = RecordingWriter(fail_first=2)
    rec, objects = setup(writer)
    task = asyncio.create_task(rec.run())
    rec.ready.set()
    put(rec, objects, "namespace", o.namespace("app"))
    put(rec, objects, "node", {"metadata": {"name": "n1", "uid": "u1"}})
    await asyncio.wait_for(_until(lambda: writer.patches == ["n1"]), 30)
    assert not task.done()
    task.cancel()


async def _until(cond: Any) -> None:
    while not cond():
        await asyncio.sleep(0.05)


async def test_a_slice_left_by_an_earlier_split_is_deleted_at_the_next_resync() -> None:
    """A slice the operator does not want (written before a restart, under a split it no longer computes) is found
    by the resync, which lists every slice the API holds, and deleted once its namespace is computed."""
    writer = RecordingWriter()
    writer.create_slice("app.7", {"namespace": "app", "index": 7, "count": 8, "services": 0}, None)
    writer.create_slice("elsewhere.0", {"namespace": "elsewhere", "index": 0, "count": 1, "services": 0}, None)
    objects: dict[tuple[Kind, tuple[str, str]], View] = {}
    rec = Reconciler(
        writer,
        lambda kind, key: objects.get((kind, key)),
        writer.get_meshnode,
        "cluster.local",
        debounce=0.05,
        resync=0.2,
        slice_names=lambda: list(writer.slices),
    )
    task = asyncio.create_task(rec.run())
    rec.ready.set()
    put(rec, objects, "namespace", o.namespace("app"))
    put(rec, objects, "node", {"metadata": {"name": "n1", "uid": "u1"}})
    put(rec, objects, "pod", {**o.pod("app", "c", "n1"), **o.pod_status("10.0.0.2")})
    put(rec, objects, "service", o.service("app", "s0", "10.96.0.1", [("dns", 53, "UDP")]))
    await asyncio.wait_for(_until(lambda: "app.7" not in writer.slices), 30)
    assert "app.0" in writer.slices, "the slice it wants is written"
    assert "elsewhere.0" in writer.slices, "a namespace it has not computed is left alone (its owner deletes it)"
    task.cancel()


class _Refusing(RecordingWriter):
    """Every MeshNode status write is refused (422): sending it again cannot succeed."""

    def apply_meshnode_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        from aether.api.client import ApiException

        raise ApiException(status=422, reason="Invalid")


@pytest.mark.parametrize("writer", [RecordingWriter(fail_first=10**6), _Refusing()], ids=["failing", "refused"])
async def test_a_node_that_leaves_while_its_write_fails_leaves_nothing_behind(writer: RecordingWriter) -> None:
    """A node whose status write keeps failing (retried with backoff) or is refused, then deleted: once its retry
    comes due and finds nothing to write, no retry and no refusal of it is kept (`retryingWrites` back to 0).
    Before, each stayed for the life of the process."""
    rec, objects = setup(writer)
    task = asyncio.create_task(rec.run())
    rec.ready.set()
    put(rec, objects, "namespace", o.namespace("app"))
    put(rec, objects, "node", {"metadata": {"name": "n1", "uid": "u1"}})
    await asyncio.wait_for(_until(lambda: rec.attempts or rec.refusals.refused), 30)
    del objects[("node", ("", "n1"))]
    rec.touch("node", ("", "n1"))
    await asyncio.wait_for(_until(lambda: not rec.attempts and not rec.refusals.refused), 30)
    assert rec.health()["retryingWrites"] == 0 and "n1" not in writer.meshnodes
    task.cancel()


async def test_the_warnings_noted_for_a_route_go_with_the_route() -> None:
    """`warned` (the unnamed-parent Warning Events posted per route, so each is posted once) keeps the routes the
    model holds only: a deleted route's entry went nowhere before."""
    rec, objects = setup(RecordingWriter())
    rec.warned = {("app", "kept"): ("1", "no parentRefs"), ("app", "deleted"): ("3", "no parentRefs")}
    put(rec, objects, "namespace", o.namespace("app"))
    rec.model.routes["app"]["kept"] = object()  # type: ignore[assignment]  # only its presence is read
    rec._forget_unwanted(set())
    assert rec.warned == {("app", "kept"): ("1", "no parentRefs")}
