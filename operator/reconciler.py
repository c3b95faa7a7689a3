"""The reconcile loop: dirty keys from the kopf handlers -> current views from the kopf indexes -> the pure
incremental model -> writes (only MeshNodes whose status changed, only routes whose status changed).

Bursts coalesce: a change wakes the loop, which waits `debounce` seconds for more before reconciling once."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from aether.api.client import ApiException, now
from aether.metrics import (
    OPERATOR_LAST_PASS,
    OPERATOR_MESHNODE_WRITES,
    OPERATOR_MESHNODES,
    OPERATOR_PENDING_KEYS,
    OPERATOR_RECONCILE_DURATION,
    OPERATOR_RECONCILE_ERRORS,
    OPERATOR_RECONCILE_PASSES,
    OPERATOR_UDPROUTE_STATUS_WRITES,
    UDP_UNSUPPORTED,
)
from aether.operator.kubeapi import KubeWriter
from aether.operator.nodestatus import same_owned, status_patch
from aether.operator.reconcile.gateway import RouteView
from aether.operator.reconcile.model import ClusterModel, Kind, Output, View
from aether.operator.reconcile.nodes import NodeDesired
from aether.operator.reconcile.routes import Verdict
from aether.operator.routestatus import comparable, parents_status, transition_events

log = logging.getLogger("aether.operator")
Lookup = Callable[[Kind, tuple[str, str]], View | None]
MeshNodeLookup = Callable[[str], dict[str, Any] | None]


def error_kind(exc: BaseException) -> str:
    """The `kind` label of aether_operator_reconcile_errors: api_<status> for API errors, else the class name."""
    return f"api_{exc.status}" if isinstance(exc, ApiException) else type(exc).__name__


class Reconciler:
    def __init__(
        self,
        writer: KubeWriter,
        lookup: Lookup,
        meshnode: MeshNodeLookup,
        trust_domain: str,
        debounce: float = 0.1,
        concurrency: int = 4,
    ) -> None:
        self.writer, self.lookup, self.meshnode = writer, lookup, meshnode
        self.model = ClusterModel(trust_domain)
        self.debounce = debounce
        self.pending: dict[tuple[Kind, tuple[str, str]], None] = {}
        self.wake = asyncio.Event()
        self.ready = asyncio.Event()
        self.digests: dict[str, str] = {}
        self.sem = asyncio.Semaphore(concurrency)
        self.cycles = 0
        self.node_writes: list[str] = []
        self.route_writes: list[tuple[str, str]] = []
        self.idle = asyncio.Event()
        self.pass_started: float | None = None  # time.monotonic() while a pass runs
        self.last_pass: float | None = None  # time.monotonic() when the last pass ended

    def touch(self, kind: Kind, key: tuple[str, str]) -> None:
        self.pending[(kind, key)] = None
        OPERATOR_PENDING_KEYS.set(len(self.pending))
        self.idle.clear()
        self.wake.set()

    async def run(self) -> None:
        await self.ready.wait()
        while True:
            await self.wake.wait()
            await asyncio.sleep(self.debounce)
            self.wake.clear()
            batch, self.pending = self.pending, {}
            OPERATOR_PENDING_KEYS.set(0)
            self.pass_started = time.monotonic()
            failed = False
            try:
                for kind, key in batch:
                    self.model.apply(kind, key, self.lookup(kind, key))
                out = self.model.reconcile()
                await self.write(out)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failed = True
                OPERATOR_RECONCILE_ERRORS.labels(kind=error_kind(exc)).inc()
                log.exception("reconcile failed; retrying the batch")
                for item in batch:
                    self.pending[item] = None
                OPERATOR_PENDING_KEYS.set(len(self.pending))
                self.model.dirty_nodes |= set(self.model.nodes)
                self.digests.clear()
                self.wake.set()
            self._pass_done(self.pass_started)
            if failed:
                await asyncio.sleep(1.0)
            self.cycles += 1
            if not self.pending:
                self.idle.set()

    def _pass_done(self, started: float) -> None:
        self.pass_started, self.last_pass = None, time.monotonic()
        OPERATOR_RECONCILE_PASSES.inc()
        OPERATOR_RECONCILE_DURATION.observe(self.last_pass - started)
        OPERATOR_LAST_PASS.set_to_current_time()
        OPERATOR_MESHNODES.set(len(self.model.known_nodes))

    def health(self) -> dict[str, Any]:
        """What the liveness probe reports (cheap: no API call)."""
        clock = time.monotonic()
        return {
            "passes": self.cycles,
            "pendingKeys": len(self.pending),
            "secondsSinceLastPass": None if self.last_pass is None else round(clock - self.last_pass, 3),
            "passRunningForSeconds": None if self.pass_started is None else round(clock - self.pass_started, 3),
        }

    async def write(self, out: Output) -> None:
        for route, backend, reason in sorted(out.new_discards):
            UDP_UNSUPPORTED.labels(reason=reason).inc()
            log.info("UDPRoute %s: backend %s discarded (%s)", route, backend, reason)
        jobs = [self._node(name, desired) for name, desired in out.desired.items()]
        jobs += [self._delete_node(name) for name in out.removed_nodes]
        jobs += [self._route(key, verdicts) for key, verdicts in out.routes.items()]
        await asyncio.gather(*jobs)

    async def _node(self, name: str, desired: NodeDesired) -> None:
        want = desired.digest  # cheap: namespace result digests + this node's pods
        if self.digests.get(name) == want:
            OPERATOR_MESHNODE_WRITES.labels(outcome="unchanged").inc()
            return
        owned = desired.owned
        async with self.sem:
            await asyncio.to_thread(self._write_node, name, owned, want)

    def _write_node(self, name: str, owned: dict[str, Any], want: str) -> None:
        current = self.meshnode(name)
        for attempt in range(6):
            if current is None:
                node = self.model.nodes.get(name)
                if node is None:
                    return
                current = self.writer.create_meshnode(name, node.uid)
                OPERATOR_MESHNODE_WRITES.labels(outcome="created").inc()
            if same_owned(current.get("status"), owned):
                OPERATOR_MESHNODE_WRITES.labels(outcome="unchanged").inc()
                break
            rv = (current.get("metadata") or {}).get("resourceVersion")
            try:
                self.writer.patch_meshnode_status(name, status_patch(owned, current.get("status"), rv, now()))
                self.node_writes.append(name)
                OPERATOR_MESHNODE_WRITES.labels(outcome="patched").inc()
                break
            except ApiException as exc:
                if exc.status not in (404, 409) or attempt == 5:
                    raise
                OPERATOR_MESHNODE_WRITES.labels(outcome="conflict_retry").inc()
                current = self.writer.get_meshnode(name)
        self.digests[name] = want

    async def _delete_node(self, name: str) -> None:
        self.digests.pop(name, None)
        async with self.sem:
            await asyncio.to_thread(self.writer.delete_meshnode, name)
        OPERATOR_MESHNODE_WRITES.labels(outcome="deleted").inc()

    async def _route(self, key: tuple[str, str], verdicts: tuple[Verdict, ...]) -> None:
        view = self.lookup("route", key)
        if not isinstance(view, RouteView):
            return  # gone
        existing = list(view.status_parents)
        if comparable(parents_status(verdicts, existing, view.generation, now())) == comparable(existing):
            OPERATOR_UDPROUTE_STATUS_WRITES.labels(outcome="unchanged").inc()
            return  # what the index holds already says this: no GET, no PATCH
        async with self.sem:
            await asyncio.to_thread(self._write_route, key, verdicts)

    def _write_route(self, key: tuple[str, str], verdicts: tuple[Verdict, ...]) -> None:
        for attempt in range(6):
            route = self.writer.get_route(*key)
            if route is None:
                return
            meta, status = route.get("metadata") or {}, route.get("status")
            existing = (status or {}).get("parents") if isinstance(status, dict) else None
            existing = existing if isinstance(existing, list) else []
            raw_gen = meta.get("generation")
            generation = raw_gen if isinstance(raw_gen, int) else 0
            parents = parents_status(verdicts, existing, generation, now())
            if comparable(parents) == comparable(existing):
                OPERATOR_UDPROUTE_STATUS_WRITES.labels(outcome="unchanged").inc()
                return
            patch = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": {"parents": parents}}
            try:
                self.writer.patch_route_status(key[0], key[1], patch)
            except ApiException as exc:
                if exc.status == 409 and attempt < 5:
                    OPERATOR_UDPROUTE_STATUS_WRITES.labels(outcome="conflict_retry").inc()
                    continue
                if exc.status == 404:
                    return
                raise
            self.route_writes.append(key)
            OPERATOR_UDPROUTE_STATUS_WRITES.labels(outcome="patched").inc()
            for ev in transition_events(verdicts, existing):
                try:
                    self.writer.post_event(route, ev.type, ev.reason, ev.message)
                except ApiException as exc:
                    log.warning("could not post an Event for UDPRoute %s/%s: %s", key[0], key[1], exc.reason)
            return
