"""Level-based upkeep of kopf's indexes: drop what the API no longer holds.

kopf's indexes learn of objects only from its watch streams. When a watch cannot resume (a 410 Gone, or an error
that makes kopf list again), kopf re-lists the kind and re-indexes what the list holds, but never drops an entry
the new list lacks: an object deleted while the watch was down (its DELETED event never seen) stayed in the index,
and in every MeshNode, slice and status computed from it, until the operator restarted (found in a churn run: pod
`caller-1005` deleted 0.35 s before kopf's re-list stayed on its MeshNode for the remaining 8 minutes).

`IndexSweeper` owns the policy for every index the operator keeps: every `period` seconds it takes, per indexed
resource, the objects (namespace, name, uid) the index holds, then lists that resource's metadata from the API
(`as=PartialObjectMetadataList`, in pages), and drops from the index each held object whose uid the list lacks,
then calls `on_gone(index_id, namespace, name)` (the operator marks the key dirty, as a DELETED event would). The
snapshot is taken before the list is asked for, so every object it names was created before the list was read:
one absent from the list was deleted. A list that fails (the API down) skips that resource until the next sweep.

kopf keeps one more thing per object: its per-object memory (`ResourceMemories`, keyed by uid, made on the first
event of every object a handler watches), which it forgets on the DELETED event only. So the sweep also forgets the
memory of every uid it drops (`forget`, given the operator's `ResourceMemories`, which `kopf.operator` accepts):
else each object deleted while a watch was down kept a few KiB in the operator for the life of the process.

kopf has no public way to remove an index entry (1.45): `_held` and `Index._discard` are its indexers' internal
protocol, pinned by pyproject's kopf version; `supported` says whether this kopf still has them. `ResourceMemories`
and its `forget(raw_body)` are kopf's too (`kopf._core.reactor.inventory`), pinned the same way."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes
import urllib3

from aether.api.client import ApiException
from aether.operator.discovery import Resource, get_json

log = logging.getLogger("aether.operator")

RESYNC_PERIOD = 60.0  # seconds between sweeps: how long an object deleted during a watch outage can stay indexed
PAGE = 500
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
Key = tuple[Any, Any, Any]  # kopf's (namespace, name, uid) of one indexed object


def supported(index: Any) -> bool:
    return isinstance(getattr(index, "_Index__reverse", None), dict) and callable(getattr(index, "_discard", None))


def _held(index: Any) -> list[Key]:
    """The (namespace, name, uid) of every object `index` holds values of (kopf's reverse map)."""
    reverse: dict[Key, Any] = index._Index__reverse
    return list(reverse)


def _path(resource: Resource) -> str:
    group, version, plural = resource
    return f"/api/{version}/{plural}" if not group else f"/apis/{group}/{version}/{plural}"


def list_uids(client: kubernetes.client.ApiClient, resource: Resource) -> set[str]:
    """The uids of every object of `resource` the API holds now (a consistent list, metadata only, in pages)."""
    uids: set[str] = set()
    token = ""
    while True:
        query: list[tuple[str, Any]] = [("limit", PAGE)] + ([("continue", token)] if token else [])
        doc: Any = get_json(client, _path(resource), query, METADATA_LIST)
        listed = [(item.get("metadata") or {}).get("uid") for item in doc.get("items") or []]
        if not all(listed):  # a list we cannot read uids from says nothing about what went
            raise ApiException(status=0, reason=f"an item of {_path(resource)} has no uid")
        uids.update(str(uid) for uid in listed)
        token = (doc.get("metadata") or {}).get("continue") or ""
        if not token:
            return uids


class IndexSweeper:
    """Drops index entries of objects the API no longer holds; `indexes` maps a kopf index id to (resource, index)."""

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        indexes: Mapping[str, tuple[Resource, Any]],
        on_gone: Callable[[str, str, str], None],
        period: float = RESYNC_PERIOD,
        memories: Any = None,
    ) -> None:
        self.client, self.on_gone, self.period, self.memories = client, on_gone, period, memories
        self.indexes = {i: (r, index) for i, (r, index) in indexes.items() if supported(index)}
        self.dropped = 0  # entries dropped so far (tests, logs)
        for index_id in set(indexes) - set(self.indexes):
            log.warning("index %s: this kopf has no way to drop stale entries; not swept", index_id)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.sweep()
            except Exception:  # a bug: logged, the next sweep tries again
                log.exception("index sweep failed")

    async def sweep(self) -> int:
        """One pass over every index: the number of entries dropped."""
        dropped = 0
        for index_id, (resource, index) in self.indexes.items():
            held = [key for key in _held(index) if key[2]]
            if not held:
                continue
            try:
                uids = await asyncio.to_thread(list_uids, self.client, resource)
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
                log.debug("index %s: listing %s failed (%s); swept next time", index_id, _path(resource), exc)
                continue
            for namespace, name, uid in held:
                if uid in uids:
                    continue
                index._discard((namespace, name, uid))
                if self.memories is not None:
                    await self.memories.forget({"metadata": {"uid": uid}})
                dropped += 1
                kind = resource[2]
                where = f"{namespace}/{name}" if namespace else str(name)
                log.info(
                    "index %s: dropped %s %s (uid %s): gone from the API, its deletion never seen",
                    index_id,
                    kind,
                    where,
                    uid,
                )
                self.on_gone(index_id, namespace or "", name or "")
        self.dropped += dropped
        return dropped
