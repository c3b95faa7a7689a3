"""The index sweep (aether.operator.resync) on a real kopf Index with the API's list replaced: it drops what the
list lacks (by uid, not by name), calls on_gone once per dropped object, and drops nothing when the list fails.
The end-to-end case (a pod deleted while kopf's watches were down) is in test_operator_watch_gone.py."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from kopf._core.engines.indexing import Index

from aether.api.client import ApiException
from aether.operator import resync

POD = ("", "v1", "pods")
NO_CLIENT: Any = None  # every test replaces resync.list_uids, so the sweeper never uses its API client


def index_of(*objs: tuple[str, str, str]) -> Index[Any, Any]:
    index: Index[Any, Any] = Index()
    for ns, name, uid in objs:
        index._replace(cast(Any, (ns, name, uid)), {(ns, name): {"uid": uid}})
    return index


def test_kopf_still_has_what_the_sweep_uses() -> None:
    assert resync.supported(index_of())


def test_the_sweep_drops_what_the_api_no_longer_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    index = index_of(("ns", "kept", "u1"), ("ns", "gone", "u2"), ("ns", "again", "u3-old"))
    monkeypatch.setattr(resync, "list_uids", lambda client, res: {"u1", "u3-new"})  # "again": same name, new uid
    gone: list[tuple[str, str, str]] = []
    sweeper = resync.IndexSweeper(NO_CLIENT, {"aether_pods": (POD, index)}, lambda *a: gone.append(a))
    assert asyncio.run(sweeper.sweep()) == 2
    assert set(index) == {("ns", "kept")}
    assert sorted(gone) == [("aether_pods", "ns", "again"), ("aether_pods", "ns", "gone")]
    assert asyncio.run(sweeper.sweep()) == 0 and sweeper.dropped == 2


def test_a_failed_list_drops_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    index = index_of(("ns", "a", "u1"))

    def down(client: Any, res: Any) -> set[str]:
        raise ApiException(status=503, reason="down")

    monkeypatch.setattr(resync, "list_uids", down)
    sweeper = resync.IndexSweeper(NO_CLIENT, {"aether_pods": (POD, index)}, lambda *a: None)
    assert asyncio.run(sweeper.sweep()) == 0
    assert set(index) == {("ns", "a")}


def test_the_sweep_forgets_kopfs_memory_of_what_it_drops(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf forgets an object's per-object memory on its DELETED event only: the sweep, which stands in for the
    DELETED events a watch outage lost, forgets it too (else a few KiB per such object for the process's life)."""
    from kopf._core.reactor.inventory import ResourceMemories

    memories = ResourceMemories()
    for uid in ("u1", "u2"):
        asyncio.run(memories.recall({"metadata": {"uid": uid}}))
    index = index_of(("ns", "kept", "u1"), ("ns", "gone", "u2"))
    monkeypatch.setattr(resync, "list_uids", lambda client, res: {"u1"})
    sweeper = resync.IndexSweeper(NO_CLIENT, {"aether_pods": (POD, index)}, lambda *a: None, memories=memories)
    assert asyncio.run(sweeper.sweep()) == 1
    assert set(memories._items) == {"u1"}
