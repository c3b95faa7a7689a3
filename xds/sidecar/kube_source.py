"""Cluster mode for the sidecar: watch MeshNode <node> and the MeshServiceSlices it names through the API and yield
their union as the node's state (`source`), and
write the sidecar's parts of its status back (`status_sink`): its condition types and quic.pairs/dormantPairs.

The API is reached through a kubeconfig (`kubeconfig=`, else $AETHER_KUBECONFIG, else $KUBECONFIG) or the
in-cluster service account. Writes never touch the operator's fields: the sidecar's condition types and its pair
state go in by server-side apply under field managers of their own (docs/operator.md#writes). A watch that ends
with an ERROR event (410 Gone: its resourceVersion was compacted) or fails lists again."""

from __future__ import annotations

import datetime
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import urllib3

from aether.api.client import ApiException, api_client
from aether.api.meshnode import (
    API_GROUP,
    API_VERSION,
    KIND,
    PLURAL,
    Condition,
    MeshNodeFileError,
    QuicPair,
    parse_meshnode,
)
from aether.api.slices import SLICE_PLURAL, MeshServiceSlice, NodeState, parse_slice
from aether.backoff import Backoff
from aether.xds.sidecar.sources import StateUpdate

log = logging.getLogger("aether.xds.kube")
# What the sidecar writes itself: a change of only these is not a new desired state (its own writes come back
# through the watch; re-translating for each one held the sidecar's lock while fetches waited).
SIDECAR_QUIC_FIELDS = frozenset({"pairs", "dormantPairs", "pairCount", "dormantPairCount"})
SIDECAR_CONDITIONS = frozenset({"Programmed", "PairsPersisted"})


def desired_part(status: Any) -> Any:
    """`status` without the sidecar-owned fields (what decides whether an update is a new desired state)."""
    if not isinstance(status, dict):
        return status
    out = dict(status)
    if isinstance(out.get("quic"), dict):
        out["quic"] = {k: v for k, v in out["quic"].items() if k not in SIDECAR_QUIC_FIELDS}
    if isinstance(out.get("conditions"), list):
        out["conditions"] = [
            c for c in out["conditions"] if not (isinstance(c, dict) and c.get("type") in SIDECAR_CONDITIONS)
        ]
    return out


APPLY = "application/apply-patch+yaml"
USER_AGENT = "aether-xds"
# server-side apply: each of the sidecar's writers owns its fields of the MeshNode status under a field manager of its
# own (an apply that omits a field its manager set before removes it): the pairs, and each condition type
# (Programmed and PairsPersisted are written by different threads) as `aether-xds-<type>`
PAIRS_MANAGER = "aether-xds-pairs"


def condition_manager(types: list[str]) -> str:
    return "aether-xds-" + "-".join(sorted(t.lower() for t in types))


def kubeconfig_path(explicit: str | None) -> str | None:
    return explicit or os.environ.get("AETHER_KUBECONFIG") or os.environ.get("KUBECONFIG") or None


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def object_name(obj: dict[str, Any]) -> Any:
    return (obj.get("metadata") or {}).get("name")


def relist_retry(seconds: float) -> Backoff:
    """The sidecar's list+watch retry policy: relist `seconds` after each API error, however many came before (a 410
    relists at once, without an error)."""
    return Backoff.constant(seconds)


class ListWatch:
    """List + watch of one kind of our API group (optionally one object by name), on its own thread: each event
    goes to `sink` as ("list", "", {key: body}) after each (re)list, ("put", key, body) / ("gone", key, None), and
    ("error", reason, HTTP status or None) on an API error, then it relists after `retry`'s delay for the errors in
    a row so far (or after the seconds the sink's `put` returns for that error). `key` names an object (default: its
    name)."""

    def __init__(
        self,
        api: Any,
        plural: str,
        name: str | None,
        timeout: int,
        retry: Backoff,
        sink: Any,
        key: Callable[[dict[str, Any]], Any] = object_name,
    ) -> None:
        self.api, self.plural, self.name, self.timeout, self.retry, self.sink = api, plural, name, timeout, retry, sink
        self.key = key

    def _args(self) -> dict[str, Any]:
        return {"field_selector": f"metadata.name={self.name}"} if self.name else {}

    def run(self, stop: threading.Event) -> None:
        errors = 0  # API errors since the last list that answered
        while not stop.is_set():
            try:
                listed = self.api.list_cluster_custom_object(API_GROUP, API_VERSION, self.plural, **self._args())
                errors = 0
                rv = (listed.get("metadata") or {}).get("resourceVersion")
                items = {self.key(i): i for i in listed.get("items") or []}
                self.sink.put(("list", "", items))
                while not stop.is_set():
                    w: Any = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]  # the client is untyped
                    gone = False
                    for event in w.stream(
                        self.api.list_cluster_custom_object,
                        API_GROUP,
                        API_VERSION,
                        self.plural,
                        resource_version=rv,
                        timeout_seconds=self.timeout,
                        **self._args(),
                    ):
                        obj = event["object"]
                        rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        if event["type"] == "ERROR":
                            gone = True
                            break
                        key = self.key(obj)
                        self.sink.put(("gone", key, None) if event["type"] == "DELETED" else ("put", key, obj))
                        if stop.is_set():
                            w.stop()
                            break
                    if gone:
                        break  # relist
            except (ApiException, OSError, ValueError, urllib3.exceptions.HTTPError) as exc:
                status = getattr(exc, "status", None)
                if status == 410:
                    continue
                errors += 1
                wait = self.sink.put(("error", getattr(exc, "reason", None) or str(exc), status))
                stop.wait(wait if isinstance(wait, (int, float)) else self.retry.delay(errors))


class KubeSource:
    """Yields the node's state at start and on every change of its MeshNode or of a MeshServiceSlice it names,
    until `stop` is set: the MeshNode with the slices' tables in effect (api.slices.effective), and what is missing
    or stale among the slices (`StateUpdate.problems`, shown in the Programmed condition)."""

    def __init__(self, node: str, kubeconfig: str | None = None, watch_timeout: int = 5, backoff: float = 1.0) -> None:
        self.node, self.watch_timeout, self.backoff = node, watch_timeout, backoff
        self.api: Any = kubernetes.client.CustomObjectsApi(api_client(kubeconfig_path(kubeconfig), USER_AGENT))

    def updates(self, stop: threading.Event) -> Iterator[StateUpdate]:
        events: queue.Queue[tuple[str, str, Any, Any]] = queue.Queue()

        class Tagged:
            def __init__(self, tag: str) -> None:
                self.tag = tag

            def put(self, item: tuple[str, str, Any]) -> None:
                events.put((self.tag, *item))

        watches = [
            ListWatch(self.api, PLURAL, self.node, self.watch_timeout, relist_retry(self.backoff), Tagged("node")),
            ListWatch(self.api, SLICE_PLURAL, None, self.watch_timeout, relist_retry(self.backoff), Tagged("slice")),
        ]
        threads = [threading.Thread(target=w.run, args=(stop,), daemon=True, name=f"watch-{w.plural}") for w in watches]
        for t in threads:
            t.start()
        body: Any = None
        slices: dict[str, MeshServiceSlice] = {}
        bad: dict[str, str] = {}  # slices the model refuses: name -> why
        synced: set[str] = set()
        last: Any = "unset"
        deleted = False
        try:
            while not stop.is_set():
                try:
                    tag, kind, name, obj = events.get(timeout=0.2)
                except queue.Empty:
                    continue
                if kind == "error":
                    log.warning("%s watch of MeshNode %s: API error, retrying: %s", tag, self.node, name)
                    yield StateUpdate(None, f"API error reading MeshNode {self.node}: {name}")
                    last = "unset"
                    continue
                if tag == "node":
                    synced.add("node")
                    if kind == "list":
                        body = obj.get(self.node)
                    else:
                        body = obj if kind == "put" else None
                        deleted = body is None
                else:
                    synced.add("slice")
                    if kind == "list":
                        slices.clear()
                        bad.clear()
                        for n, item in obj.items():
                            self._keep(n, item, slices, bad)
                    else:
                        slices.pop(name, None)
                        bad.pop(name, None)
                        if kind == "put":
                            self._keep(name, obj, slices, bad)
                if synced != {"node", "slice"}:
                    continue  # the first answer waits for both lists
                key = self._key(body, slices, bad)
                if key != last:
                    last = key
                    yield self._state(body, slices, bad, deleted)
        finally:
            stop.set()

    @staticmethod
    def _keep(name: str, item: Any, slices: dict[str, MeshServiceSlice], bad: dict[str, str]) -> None:
        try:
            slices[name] = parse_slice(item, f"MeshServiceSlice/{name}")
        except MeshNodeFileError as exc:
            bad[name] = str(exc)

    @staticmethod
    def _names(body: Any) -> list[str]:
        refs = ((body or {}).get("status") or {}).get("serviceSlices") or {}
        names = refs.get("names") if isinstance(refs, dict) else None
        return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []

    def _key(self, body: Any, slices: dict[str, MeshServiceSlice], bad: dict[str, str]) -> Any:
        """What the yielded update depends on: the MeshNode's spec and the operator's status (the sidecar's own pair
        and condition writes coming back through the watch are no new state), and the named slices' versions."""
        if body is None:
            return None
        names = self._names(body)
        versions = [
            (n, (slices[n].metadata.model_extra or {}).get("resourceVersion") if n in slices else None) for n in names
        ]
        spec, desired = repr(body.get("spec")), repr(desired_part(body.get("status")))  # not the sidecar's own writes
        return (spec, desired, tuple(versions), tuple(n for n in names if n in bad))

    def _state(self, body: Any, slices: dict[str, MeshServiceSlice], bad: dict[str, str], deleted: bool) -> StateUpdate:
        if body is None:
            return StateUpdate(None, f"MeshNode {self.node} {'was deleted' if deleted else 'does not exist (yet)'}")
        try:
            node = parse_meshnode(body, f"MeshNode/{self.node}")
        except MeshNodeFileError as exc:
            return StateUpdate(None, str(exc))
        state = NodeState(node, {n: s for n, s in slices.items()})
        problems = state.problems()
        refused = [bad[n] for n in self._names(body) if n in bad]
        return StateUpdate(state.effective(), None, tuple([*problems, *refused]))


class KubeStatusSink:
    """The sidecar's writes into MeshNode status, by server-side apply: its condition types (conditions are a
    list-map keyed by type, so the operator's Ready and Degraded are not touched) and the QUIC pair state. No
    resourceVersion is sent, so a concurrent write of other fields (the operator's, a user's) is no conflict."""

    def __init__(self, node: str, kubeconfig: str | None = None) -> None:
        self.node = node
        self.api: Any = kubernetes.client.CustomObjectsApi(api_client(kubeconfig_path(kubeconfig), USER_AGENT))

    def _apply(self, node_name: str, status: dict[str, Any], manager: str) -> None:
        body = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "metadata": {"name": node_name}}
        self.api.patch_cluster_custom_object_status(
            API_GROUP,
            API_VERSION,
            PLURAL,
            node_name,
            {**body, "status": status},
            field_manager=manager,
            force=True,
            _content_type=APPLY,
        )

    def publish(self, node_name: str, conditions: list[Condition]) -> None:
        """Apply the condition types given (lastTransitionTime kept while status is unchanged); nothing is sent when
        the stored ones already say it."""
        try:
            current = self.api.get_cluster_custom_object(API_GROUP, API_VERSION, PLURAL, node_name)
        except ApiException as exc:
            if exc.status == 404:
                log.warning("MeshNode %s does not exist: conditions not published", node_name)
                return
            raise
        existing = {
            c.get("type"): c for c in (current.get("status") or {}).get("conditions") or [] if isinstance(c, dict)
        }
        ours = []
        for c in (c.wire() for c in conditions):
            old = existing.get(c["type"])
            keep = old.get("lastTransitionTime") if old and old.get("status") == c["status"] else None
            ours.append({**c, "lastTransitionTime": c.get("lastTransitionTime") or keep or _now()})
        if all(existing.get(c["type"]) == c for c in ours):
            return
        self._apply(node_name, {"conditions": ours}, condition_manager([c["type"] for c in ours]))

    def publish_pairs(self, node_name: str, pairs: list[QuicPair], dormant: list[QuicPair]) -> None:
        """Persist the QUIC pair state (sidecar-owned) so it survives restarts of either side."""
        quic = {
            "pairs": [p.wire() for p in pairs],
            "dormantPairs": [p.wire() for p in dormant],
            "pairCount": len(pairs),
            "dormantPairCount": len(dormant),
        }
        self._apply(node_name, {"quic": quic}, PAIRS_MANAGER)


def source(node: str, kubeconfig: str | None = None) -> KubeSource:
    return KubeSource(node, kubeconfig)


def status_sink(node: str, kubeconfig: str | None = None) -> KubeStatusSink:
    return KubeStatusSink(node, kubeconfig)
