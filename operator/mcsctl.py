"""The multicluster status loop (thin): ServiceExport and ServiceImport status, level-based.

A ServiceExport, ServiceImport, MeshPeer or Service event wakes it (`touch`); after `debounce` seconds one pass
computes every export's and import's status from the kopf indexes and the reconciler's namespace results
(`aether.operator.reconcile.multicluster`, pure) and merge-patches /status where it differs from the stored copy.
A write that makes an object not Valid (export) or not Ready (import) also posts a Warning Event with the reason.
The QUIC destinations an import becomes are the MeshNode reconciler's (it reads the same views); this loop writes
only these two statuses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from aether.api import multicluster as mc
from aether.api.client import ApiException, now
from aether.operator.kubeapi import MERGE, KubeWriter
from aether.operator.policies import same_status, with_times
from aether.operator.reconcile.model import ClusterModel
from aether.operator.reconcile.multicluster import (
    ExportView,
    ImportView,
    export_status,
    export_verdict,
    import_status,
    import_verdict,
)
from aether.operator.statusloop import StatusLoop

log = logging.getLogger("aether.operator.multicluster")
SETTLE_WAIT = 5.0  # seconds a pass waits for the reconciler to take in the events so far, at most
Views = Callable[[], Iterable[Any]]
# (kind, plural, the object's view, its wanted status, (reason, message) of the Warning to post or None)
Write = tuple[str, str, ExportView | ImportView, dict[str, Any], tuple[str, str] | None]


def eligibility(model: ClusterModel, namespace: str, name: str) -> str | None:
    """None when Service namespace/name is a QUIC destination in the model's results, else why not."""
    result = model.results.get(namespace)
    if result is None or not result.meshed:
        return f"namespace {namespace} is not in the mesh"
    for d in result.tables.destinations:
        if d.service == f"{namespace}/{name}" and not d.gateways:
            return None
    for i in result.tables.ineligible:
        if i.service == f"{namespace}/{name}":
            return f"the Service is not a QUIC destination ({i.reason})"
    return "the Service is not a QUIC destination"


class MulticlusterController(StatusLoop):
    def __init__(
        self,
        writer: KubeWriter,
        exports: Views,
        imports: Views,
        model: ClusterModel,
        settled: asyncio.Event | None = None,
        debounce: float = 0.1,
        resync: float = 30.0,
    ) -> None:
        self.writer, self.exports, self.imports, self.model = writer, exports, imports, model
        self.settled = settled  # the reconciler's `idle`: its model has taken in every event so far
        super().__init__(log, "multicluster status", debounce, resync)
        # writes by kind ("ServiceExport" | "ServiceImport" | "event"), for tests: counted, not listed (a list grew)
        self.writes: Counter[str] = Counter()

    async def a_pass(self) -> None:
        if self.settled is not None:  # bounded: a reconciler that is never idle (churn) does not starve this
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.settled.wait(), SETTLE_WAIT)
        # computed on the loop (the reconciler changes the model there), written from a thread
        await asyncio.to_thread(self.write_all, self.plan())

    def one_pass(self) -> None:
        self.write_all(self.plan())

    def plan(self) -> list[Write]:
        """Every export's and import's wanted status (and the Warning it carries when it is a bad one)."""
        m, out = self.model, list[Write]()
        for exp in [e for e in self.exports() if isinstance(e, ExportView)]:
            svc = m.services.get(exp.namespace, {}).get(exp.name)
            verdict = export_verdict(exp, svc, eligibility(m, exp.namespace, exp.name))
            bad = None if verdict.valid else (verdict.reason, verdict.message)
            out.append(("ServiceExport", mc.SERVICE_EXPORTS, exp, export_status(exp, verdict), bad))
        for imp in [i for i in self.imports() if isinstance(i, ImportView)]:
            peer = m.peers.get(imp.peer) if imp.peer else None
            local = m.services.get(imp.namespace, {}).get(imp.name)
            v = import_verdict(imp, peer, local, m.trust_domain)
            bad = None if v.destination is not None else (v.reason, v.message)
            out.append(("ServiceImport", mc.SERVICE_IMPORTS, imp, import_status(imp, v), bad))
        return out

    def write_all(self, plan: list[Write]) -> None:
        for item in plan:
            self._write(*item)

    def _write(
        self, kind: str, plural: str, view: ExportView | ImportView, want: dict[str, Any], bad: tuple[str, str] | None
    ) -> None:
        if same_status(view.status, want):
            return
        ns, name = view.namespace, view.name
        try:
            self.writer.custom.patch_namespaced_custom_object_status(
                mc.MCS_GROUP,
                mc.MCS_VERSION,
                ns,
                plural,
                name,
                {"status": with_times(want, view.status, now())},
                _content_type=MERGE,
            )
            self.writes[kind] += 1
        except ApiException as exc:
            if exc.status != 404:  # gone meanwhile: nothing to say
                log.warning("%s %s/%s: status write failed: %s", kind, ns, name, exc.reason)
            return
        if bad is None:
            return
        log.warning("%s %s/%s: %s: %s", kind, ns, name, *bad)
        try:
            meta = {"namespace": ns, "name": name, "uid": view.uid}
            self.writer.post_mcs_event(kind, meta, "Warning", bad[0], bad[1])
            self.writes["event"] += 1
        except ApiException as exc:
            log.warning("%s %s/%s: event not posted: %s", kind, ns, name, exc.reason)
