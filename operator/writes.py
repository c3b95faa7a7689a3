"""One object's write, level-based (sync, run in a worker thread): compare what the API holds with what is
computed, write the difference (a MeshNode status by server-side apply, which needs no conflict retry; a slice or a
route status against the resourceVersion read, re-read on a conflict). A refused body (422, or too large for the API: 413, or
etcd's "request is too large" relayed as a 500) is remembered by the body's digest so the same body is not sent
again (`Refusals`); any other error propagates to the loop, which retries with backoff."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aether.api.client import ApiException, now
from aether.metrics import (
    OPERATOR_MESHNODE_WRITES,
    OPERATOR_SLICE_WRITES,
    OPERATOR_UDPROUTE_STATUS_WRITES,
    OPERATOR_WRITE_REFUSALS,
)
from aether.operator.kubeapi import KubeWriter, slice_labels
from aether.operator.nodestatus import applied_status, digest, same_owned
from aether.operator.reconcile.routes import Verdict
from aether.operator.routestatus import comparable, parents_status, transition_events
from aether.operator.slicewire import same_slice, slice_ops

log = logging.getLogger("aether.operator")
CONFLICT_RETRIES = 5


ETCD_TOO_LARGE = "request is too large"


def refused(exc: ApiException) -> bool:
    """The API refuses this body itself: sending it again cannot succeed (422 Invalid, 413 over the request-body
    limit, or etcd's 'request is too large', which kube-apiserver relays as a 500 with no reason)."""
    if exc.status in (413, 422):
        return True
    return exc.status == 500 and ETCD_TOO_LARGE in str(exc.body or "")


def body_digest(body: Any) -> str:
    return hashlib.blake2b(json.dumps(body, sort_keys=True).encode(), digest_size=16).hexdigest()


@dataclass
class Refusals:
    """What the API refused (422) per object: the digest of the refused body and the API's message."""

    refused: dict[tuple[str, Any], str] = field(default_factory=dict)

    def already(self, what: tuple[str, Any], body: str) -> bool:
        return self.refused.get(what) == body

    def note(self, what: tuple[str, Any], body: str, exc: ApiException) -> None:
        self.refused[what] = body
        OPERATOR_WRITE_REFUSALS.labels(kind=what[0]).inc()
        detail = (exc.body or exc.reason or "")[:2000] if isinstance(exc.body, str) else exc.reason
        log.warning(
            "the API refused the %s write for %s (%s), not retried until it changes: %s", *what, exc.status, detail
        )

    def clear(self, what: tuple[str, Any]) -> None:
        self.refused.pop(what, None)

    def keep(self, wanted: Callable[[tuple[str, Any]], bool]) -> None:
        """Forget the refusals of objects no longer `wanted` (deleted, or no longer computed)."""
        self.refused = {what: body for what, body in self.refused.items() if wanted(what)}


def write_node(
    writer: KubeWriter,
    refusals: Refusals,
    name: str,
    owned: dict[str, Any],
    current: dict[str, Any] | None,
    node_uid: str | None,
) -> str:
    """Make MeshNode `name`'s status hold `owned` (server-side apply: the sidecar's fields and a concurrent edit of
    anything else need no re-read). -> outcome: patched, unchanged, refused, gone (no Node)."""
    what = ("meshnode", name)
    wanted = digest(owned)
    for _ in range(2):  # a second pass only when the MeshNode vanished under the write: create it, apply again
        if current is None:
            if node_uid is None:
                return "gone"
            current = writer.create_meshnode(name, node_uid)
            OPERATOR_MESHNODE_WRITES.labels(outcome="created").inc()
        if same_owned(current.get("status"), owned):
            refusals.clear(what)
            return "unchanged"
        if refusals.already(what, wanted):
            return "refused"
        try:
            writer.apply_meshnode_status(name, applied_status(owned, current.get("status"), now()))
        except ApiException as exc:
            if refused(exc):
                refusals.note(what, wanted, exc)
                return "refused"
            if exc.status != 404:
                raise
            current = None
            continue
        refusals.clear(what)
        OPERATOR_MESHNODE_WRITES.labels(outcome="patched").inc()
        return "patched"
    return "gone"


def write_slice(
    writer: KubeWriter,
    refusals: Refusals,
    name: str,
    spec: dict[str, Any],
    current: dict[str, Any] | None,
    namespace_uid: str | None,
) -> str:
    """Make MeshServiceSlice `name` hold `spec`: created when absent, else a JSON patch of the difference against
    the copy read (its resourceVersion tested). -> outcome: created, patched, unchanged, refused."""
    what = ("slice", name)
    labels = slice_labels(spec)
    wanted = body_digest(spec)
    for attempt in range(CONFLICT_RETRIES + 1):
        if current is not None and same_slice(current, spec, labels):
            refusals.clear(what)
            return "unchanged"
        if refusals.already(what, wanted):
            return "refused"
        try:
            if current is None:
                writer.create_slice(name, spec, namespace_uid)
                outcome = "created"
            else:
                writer.patch_slice(name, slice_ops(current, spec, labels))
                outcome = "patched"
        except ApiException as exc:
            # a failed resourceVersion test is 422 on a real API server (409 on some): re-read and rebuild once
            stale = exc.status in (404, 409) or (exc.status == 422 and current is not None and attempt == 0)
            if stale and attempt < CONFLICT_RETRIES:
                OPERATOR_SLICE_WRITES.labels(outcome="conflict_retry").inc()
                current = writer.get_slice(name)
                continue
            if refused(exc):
                refusals.note(what, wanted, exc)
                return "refused"
            raise
        refusals.clear(what)
        OPERATOR_SLICE_WRITES.labels(outcome=outcome).inc()
        return outcome
    raise AssertionError("unreachable")


def write_route(
    writer: KubeWriter,
    refusals: Refusals,
    key: tuple[str, str],
    verdicts: tuple[Verdict, ...],
    computed_from: int | None = None,
) -> str:
    """Make UDPRoute `key`'s status.parents hold our entries for `verdicts` (other controllers' kept), with
    observedGeneration `computed_from` (the generation of the route the verdicts were computed from; default the
    generation read). -> outcome: patched, unchanged, refused, gone."""
    what = ("udproute", key)
    for attempt in range(CONFLICT_RETRIES + 1):
        route = writer.get_route(*key)
        if route is None:
            return "gone"
        meta, status = route.get("metadata") or {}, route.get("status")
        existing = (status or {}).get("parents") if isinstance(status, dict) else None
        existing = existing if isinstance(existing, list) else []
        raw_gen = meta.get("generation")
        generation = computed_from if computed_from is not None else raw_gen if isinstance(raw_gen, int) else 0
        parents = parents_status(verdicts, existing, generation, now())
        if comparable(parents) == comparable(existing):
            refusals.clear(what)
            OPERATOR_UDPROUTE_STATUS_WRITES.labels(outcome="unchanged").inc()
            return "unchanged"
        wanted = body_digest([str(meta.get("uid")), comparable(parents)])
        if refusals.already(what, wanted):
            return "refused"
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": {"parents": parents}}
        try:
            writer.patch_route_status(key[0], key[1], patch)
        except ApiException as exc:
            if exc.status == 409 and attempt < CONFLICT_RETRIES:
                OPERATOR_UDPROUTE_STATUS_WRITES.labels(outcome="conflict_retry").inc()
                continue
            if exc.status == 404:
                return "gone"
            if refused(exc):
                refusals.note(what, wanted, exc)
                return "refused"
            raise
        refusals.clear(what)
        OPERATOR_UDPROUTE_STATUS_WRITES.labels(outcome="patched").inc()
        for ev in transition_events(verdicts, existing):
            try:
                writer.post_event(route, ev.type, ev.reason, ev.message)
            except ApiException as exc:
                log.warning("could not post an Event for UDPRoute %s/%s: %s", key[0], key[1], exc.reason)
        return "patched"
    raise AssertionError("unreachable")
