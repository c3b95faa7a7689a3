"""The reconcile loop: dirty keys from the kopf handlers -> current views from the kopf indexes -> the pure
incremental model -> writes, level-based: what the API stores is compared with what is computed, never with a
memory of what was last written.

Bursts coalesce: a change wakes the loop, which waits `debounce` seconds for more before reconciling once. Besides
the model's changes a pass checks the objects the operator writes that changed behind its back (a MeshNode,
MeshServiceSlice or UDPRoute event: a user's patch, a slice deleted by hand, a re-created route) and, every
`resync` seconds, all of them. A pass writes slices before MeshNodes (a MeshNode never names a slice not yet
written) and deletes the slices no longer wanted after them. A failed write is
retried alone with backoff (WRITE_RETRY: 0.25 s doubling to 4 s); a 422 is remembered per body (writes.Refusals).
Neither holds back any other object."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from aether.api.client import ApiException
from aether.backoff import Backoff
from aether.metrics import (
    OPERATOR_DRIFT_CORRECTIONS,
    OPERATOR_LAST_PASS,
    OPERATOR_MESHNODE_WRITES,
    OPERATOR_MESHNODES,
    OPERATOR_PENDING_KEYS,
    OPERATOR_RECONCILE_DURATION,
    OPERATOR_RECONCILE_ERRORS,
    OPERATOR_RECONCILE_PASSES,
    OPERATOR_RESYNCS,
    OPERATOR_SLICE_WRITES,
    OPERATOR_UDPROUTE_STATUS_WRITES,
    OPERATOR_WRITE_RETRIES,
    UDP_UNSUPPORTED,
)
from aether.operator.kubeapi import KubeWriter, slice_labels
from aether.operator.nodestatus import same_owned
from aether.operator.reconcile.gateway import RouteView
from aether.operator.reconcile.model import ClusterModel, Kind, Output, View
from aether.operator.reconcile.nodes import NodeDesired
from aether.operator.reconcile.routes import Verdict
from aether.operator.routestatus import comparable, parents_status, unnamed_events
from aether.operator.slicewire import same_slice
from aether.operator.writes import Refusals, write_node, write_route, write_slice

log = logging.getLogger("aether.operator")
Lookup = Callable[[Kind, tuple[str, str]], View | None]
MeshNodeLookup = Callable[[str], dict[str, Any] | None]  # also a MeshServiceSlice by name
RESYNC = 4.0  # seconds between full comparisons of every written object with the API's copy (docs/operator.md)
WRITE_RETRY = Backoff(first=0.25, cap=4.0)  # a failed write's retry of that object alone (docs/operator.md)
FAILED_PASS_PAUSE = 1.0  # seconds before a pass whose model raised runs the whole batch again
Target = tuple[str, Any]  # ("meshnode" | "slice" | "delete", name) | ("udproute", (ns, name))


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
        resync: float = RESYNC,
        meshslice: MeshNodeLookup | None = None,
        slice_names: Callable[[], list[str]] | None = None,
    ) -> None:
        self.writer, self.lookup, self.meshnode = writer, lookup, meshnode
        self.meshslice: MeshNodeLookup = meshslice or writer.get_slice
        self.slice_names = slice_names or list  # every MeshServiceSlice the API holds (resync: orphans too)
        self.slices: dict[str, dict[str, Any]] = {}  # MeshServiceSlice -> the spec the operator last computed
        # writes made so far, counted (not listed: a list of names grew with every write for the operator's life)
        self.slice_writes = 0
        self.model = ClusterModel(trust_domain)
        self.debounce, self.resync = debounce, resync
        self.pending: dict[tuple[Kind, tuple[str, str]], None] = {}
        self.checks: set[Target] = set()  # written objects to compare with the API's copy in the next pass
        self.wake = asyncio.Event()
        self.ready = asyncio.Event()
        self.digests: dict[str, str] = {}  # MeshNode -> digest of the desired status the API was seen to hold
        self.desired: dict[str, NodeDesired] = {}  # MeshNode -> what the operator last computed for it
        self.refusals = Refusals()
        self.attempts: dict[Target, int] = {}  # failed writes waiting for their retry
        self._ran: set[Target] = set()  # the targets this pass's write ran a job for
        self.sem = asyncio.Semaphore(concurrency)
        self.cycles = 0
        self.resyncs = 0
        self.node_writes = 0
        self.route_writes = 0
        self.warned: dict[tuple[str, str], tuple[str, ...]] = {}  # route -> the unnamed-parent Events posted
        self.idle = asyncio.Event()
        self.pass_started: float | None = None  # time.monotonic() while a pass runs
        self.last_pass: float | None = None  # time.monotonic() when the last pass ended

    def touch(self, kind: Kind, key: tuple[str, str]) -> None:
        self.pending[(kind, key)] = None
        if kind == "route":  # its status may have changed behind our back (or it was re-created): compare it
            self.checks.add(("udproute", key))
        OPERATOR_PENDING_KEYS.set(len(self.pending))
        self._wake()

    def check(self, target: Target) -> None:
        """Compare one written object with the API's copy in the next pass (a MeshNode event, a retry)."""
        if target[0] == "meshnode":
            self.digests.pop(target[1], None)
        self.checks.add(target)
        self._wake()

    def _wake(self) -> None:
        self.idle.clear()
        self.wake.set()

    async def run(self) -> None:
        await self.ready.wait()
        resync = asyncio.create_task(self._resync_loop(), name="aether-resync")
        try:
            while True:
                await self._one_pass()
        finally:
            resync.cancel()

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.resync)
            self.resyncs += 1
            OPERATOR_RESYNCS.inc()
            self.checks.update(("meshnode", name) for name in self.desired)
            self.checks.update(("slice", name) for name in [*self.slices, *self.slice_names()])
            self.checks.update(("udproute", (ns, name)) for ns, routes in self.model.routes.items() for name in routes)
            self.checks.update(t for t in self.attempts if t[0] == "delete")
            self._wake()

    async def _one_pass(self) -> None:
        await self.wake.wait()
        await asyncio.sleep(self.debounce)
        self.wake.clear()
        batch, self.pending = self.pending, {}
        checks, self.checks = self.checks, set()
        OPERATOR_PENDING_KEYS.set(0)
        self.pass_started = time.monotonic()
        failed = False
        try:
            for kind, key in batch:
                self.model.apply(kind, key, self.lookup(kind, key))
            out = self.model.reconcile()
            await self.write(out, checks)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the model itself failed (a bug): retry the whole batch, everything re-checked
            failed = True
            OPERATOR_RECONCILE_ERRORS.labels(kind=error_kind(exc)).inc()
            log.exception("reconcile failed; retrying the batch")
            for item in batch:
                self.pending[item] = None
            OPERATOR_PENDING_KEYS.set(len(self.pending))
            self.model.dirty_nodes |= set(self.model.nodes)
            self.checks |= checks
            self.digests.clear()
            self.wake.set()
        self._pass_done(self.pass_started)
        if failed:
            await asyncio.sleep(FAILED_PASS_PAUSE)
        self.cycles += 1
        if not self.pending and not self.checks:
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
            "retryingWrites": len(self.attempts),
            "secondsSinceLastPass": None if self.last_pass is None else round(clock - self.last_pass, 3),
            "passRunningForSeconds": None if self.pass_started is None else round(clock - self.pass_started, 3),
        }

    def verdicts(self, key: tuple[str, str]) -> tuple[Verdict, ...]:
        result = self.model.results.get(key[0])
        return result.route_verdicts.get(key, ()) if result is not None else ()

    async def write(self, out: Output, checks: set[Target] | None = None) -> None:
        checks = checks or set()
        for route, backend, reason in sorted(out.new_discards):
            UDP_UNSUPPORTED.labels(reason=reason).inc()
            log.info("unsupported UDP shape on %s: %s (%s)", route, backend, reason)
        self.desired.update(out.desired)
        gone: list[str] = []
        first: list[Coroutine[Any, Any, None]] = []  # slices before the MeshNodes that name them
        for name, spec in out.slices.items():
            if spec is None:
                self.slices.pop(name, None)
                gone.append(name)
            else:
                self.slices[name] = spec
                first.append(self._guard(("slice", name), self._slice(name, spec, ("slice", name) in checks)))
        for target in sorted(t for t in checks if t[0] == "slice" and t[1] not in out.slices):
            spec = self.slices.get(target[1])
            if spec is not None:
                first.append(self._guard(target, self._slice(target[1], spec, True)))
            elif self._orphan(target[1]):
                gone.append(target[1])
        await asyncio.gather(*first)
        jobs: list[Coroutine[Any, Any, None]] = []
        for name, desired in out.desired.items():
            jobs.append(self._guard(("meshnode", name), self._node(name, desired, ("meshnode", name) in checks)))
        for name in out.removed_nodes:
            self.desired.pop(name, None)
            jobs.append(self._guard(("delete", name), self._delete_node(name)))
        for target in sorted(t for t in checks if t[0] == "delete" and t[1] not in out.removed_nodes):
            if target[1] not in self.model.nodes:
                jobs.append(self._guard(target, self._delete_node(target[1])))
        for target in sorted(t for t in checks if t[0] == "meshnode" and t[1] not in out.desired):
            known = self.desired.get(target[1])
            if known is not None:
                jobs.append(self._guard(target, self._node(target[1], known, True)))
        routes = {key: (verdicts, False) for key, verdicts in out.routes.items()}
        for target in checks:
            if target[0] == "udproute" and target[1] not in routes:
                routes[target[1]] = (self.verdicts(target[1]), True)
        for key, (verdicts, drift) in routes.items():
            jobs.append(self._guard(("udproute", key), self._route(key, verdicts, drift)))
        await asyncio.gather(*jobs)
        await asyncio.gather(*(self._guard(("slice", n), self._delete_slice(n)) for n in gone))
        self._forget_unwanted(checks)

    def _forget_unwanted(self, checks: set[Target]) -> None:
        """Per-object bookkeeping goes with its object: a retry that came due and found nothing to write (the node,
        slice or route is no longer wanted) ends its backoff, and the refusals and the Warning Events noted for
        objects no longer wanted are forgotten. Kept otherwise, each object that left while failing, refused or
        warned about stayed in these maps for the life of the process (and in `retryingWrites`)."""
        for target in checks - self._ran:
            self.attempts.pop(target, None)
        self._ran.clear()
        routes = {(ns, name) for ns, held in self.model.routes.items() for name in held}
        self.warned = {key: said for key, said in self.warned.items() if key in routes}
        wanted: dict[str, set[Any]] = {"meshnode": set(self.desired), "slice": set(self.slices), "udproute": routes}
        self.refusals.keep(lambda what: what[1] in wanted.get(what[0], ()))

    def _orphan(self, name: str) -> bool:
        """A slice we do not want, of a namespace whose result we know (at start-up, before a namespace is computed,
        its slices are left alone; a deleted Namespace's slices go with it by ownerReference)."""
        current = self.meshslice(name)
        if current is None or name in self.slices:
            return False
        ns = (current.get("spec") or {}).get("namespace")
        return isinstance(ns, str) and ns in self.model.results

    async def _slice(self, name: str, spec: dict[str, Any], verify: bool) -> None:
        current = self.meshslice(name)
        if current is not None and same_slice(current, spec, slice_labels(spec)):
            if not verify:
                OPERATOR_SLICE_WRITES.labels(outcome="unchanged").inc()
            return
        ns = self.model.namespaces.get(str(spec["namespace"]))
        async with self.sem:
            outcome = await asyncio.to_thread(
                write_slice, self.writer, self.refusals, name, spec, current, ns.uid if ns else None
            )
        if outcome in ("created", "patched"):
            self.slice_writes += 1
            if verify:
                OPERATOR_DRIFT_CORRECTIONS.labels(kind="slice").inc()

    async def _delete_slice(self, name: str) -> None:
        if name in self.slices:  # wanted again since
            return
        async with self.sem:
            await asyncio.to_thread(self.writer.delete_slice, name)
        OPERATOR_SLICE_WRITES.labels(outcome="deleted").inc()

    async def _guard(self, target: Target, job: Coroutine[Any, Any, None]) -> None:
        """Run one object's write; on failure schedule that object alone again, with backoff."""
        self._ran.add(target)
        try:
            await job
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            attempt = self.attempts.get(target, 0) + 1
            self.attempts[target] = attempt
            delay = WRITE_RETRY.delay(attempt)
            kind = error_kind(exc)
            OPERATOR_RECONCILE_ERRORS.labels(kind=kind).inc()
            OPERATOR_WRITE_RETRIES.labels(kind=target[0], error=kind).inc()
            log.warning("%s %s: write failed (%s: %s); retry %d in %.2f s", *target, kind, exc, attempt, delay)
            asyncio.get_running_loop().call_later(delay, self.check, target)
        else:
            self.attempts.pop(target, None)

    async def _node(self, name: str, desired: NodeDesired, verify: bool) -> None:
        want = desired.digest  # cheap: namespace result digests + this node's pods
        if not verify and self.digests.get(name) == want:
            OPERATOR_MESHNODE_WRITES.labels(outcome="unchanged").inc()
            return
        owned = desired.owned
        current = self.meshnode(name)
        if current is not None and same_owned(current.get("status"), owned):  # the API's copy already holds it
            self.digests[name] = want
            if not verify:
                OPERATOR_MESHNODE_WRITES.labels(outcome="unchanged").inc()
            return
        node = self.model.nodes.get(name)
        async with self.sem:
            outcome = await asyncio.to_thread(
                write_node, self.writer, self.refusals, name, owned, current, node.uid if node else None
            )
        if outcome == "patched":
            self.node_writes += 1
            if verify:
                OPERATOR_DRIFT_CORRECTIONS.labels(kind="meshnode").inc()
        if outcome in ("patched", "unchanged"):
            self.digests[name] = want

    async def _delete_node(self, name: str) -> None:
        self.digests.pop(name, None)
        async with self.sem:
            await asyncio.to_thread(self.writer.delete_meshnode, name)
        OPERATOR_MESHNODE_WRITES.labels(outcome="deleted").inc()

    async def _route(self, key: tuple[str, str], verdicts: tuple[Verdict, ...], drift: bool) -> None:
        view = self.lookup("route", key)
        if not isinstance(view, RouteView):
            return  # gone
        await self._warn_unnamed(view, verdicts)
        existing = list(view.status_parents)
        computed = self.model.routes.get(key[0], {}).get(key[1])  # the view the verdicts were computed from
        generation = computed.generation if computed is not None else view.generation
        if comparable(parents_status(verdicts, existing, generation, "")) == comparable(existing):
            if not drift:
                OPERATOR_UDPROUTE_STATUS_WRITES.labels(outcome="unchanged").inc()
            return  # what the index holds already says this: no GET, no PATCH
        async with self.sem:
            outcome = await asyncio.to_thread(write_route, self.writer, self.refusals, key, verdicts, generation)
        if outcome == "patched":
            self.route_writes += 1
            if drift:
                OPERATOR_DRIFT_CORRECTIONS.labels(kind="udproute").inc()

    async def _warn_unnamed(self, view: RouteView, verdicts: tuple[Verdict, ...]) -> None:
        """A verdict without a parent to name (no parentRefs, ...) has no status.parents entry: post it as a Warning
        Event, once per generation and message."""
        events = unnamed_events(verdicts)
        said = (str(view.generation), *(e.message for e in events))
        if not events or self.warned.get(view.key) == said:
            return
        self.warned[view.key] = said
        route = {"metadata": {"name": view.name, "namespace": view.namespace, "uid": view.uid}}
        for ev in events:
            log.info("UDPRoute %s/%s: %s", view.namespace, view.name, ev.message)
            try:
                await asyncio.to_thread(self.writer.post_event, route, ev.type, ev.reason, ev.message)
            except ApiException as exc:
                log.warning("could not post an Event for UDPRoute %s/%s: %s", view.namespace, view.name, exc.reason)
