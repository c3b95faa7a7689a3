"""Cluster mode for the sidecar: watch MeshNode <node> through the API and yield its snapshots (`source`), and
write the sidecar's parts of its status back (`status_sink`): its condition types and quic.pairs/dormantPairs.

The API is reached through a kubeconfig (`kubeconfig=`, else $AETHER_KUBECONFIG, else $KUBECONFIG) or the
in-cluster service account. Writes never touch the operator's fields: conditions are merged by type under a
resourceVersion precondition, pairs go in with a merge patch on status.quic only."""

from __future__ import annotations

import datetime
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

import kubernetes
import urllib3

from aether.api.client import ApiException, api_client
from aether.api.meshnode import (
    API_GROUP,
    API_VERSION,
    PLURAL,
    Condition,
    MeshNodeFileError,
    QuicPair,
    parse_meshnode,
)
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


MERGE = "application/merge-patch+json"
USER_AGENT = "aether-xds"


def _kubeconfig(explicit: str | None) -> str | None:
    return explicit or os.environ.get("AETHER_KUBECONFIG") or os.environ.get("KUBECONFIG") or None


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeSource:
    """Yields the MeshNode at start and on every change of it, until `stop` is set."""

    def __init__(self, node: str, kubeconfig: str | None = None, watch_timeout: int = 5, backoff: float = 1.0) -> None:
        self.node, self.watch_timeout, self.backoff = node, watch_timeout, backoff
        self.api: Any = kubernetes.client.CustomObjectsApi(api_client(_kubeconfig(kubeconfig), USER_AGENT))

    def _update(self, body: Any) -> StateUpdate:
        try:
            return StateUpdate(parse_meshnode(body, f"MeshNode/{self.node}"))
        except MeshNodeFileError as exc:
            return StateUpdate(None, str(exc))

    def updates(self, stop: threading.Event) -> Iterator[StateUpdate]:
        last: Any = "unset"

        def changed(body: Any, absent: str) -> StateUpdate | None:
            """An update when spec or the operator's status differ from the last one yielded (or the object came or
            went): the sidecar's own writes (pairs, its conditions) coming back through the watch are not one."""
            nonlocal last
            key = None if body is None else (body.get("spec"), desired_part(body.get("status")))
            if key == last:
                return None
            last = key
            return self._update(body) if body is not None else StateUpdate(None, f"MeshNode {self.node} {absent}")

        while not stop.is_set():
            try:
                listed = self.api.list_cluster_custom_object(
                    API_GROUP, API_VERSION, PLURAL, field_selector=f"metadata.name={self.node}"
                )
                items = listed.get("items") or []
                rv = (listed.get("metadata") or {}).get("resourceVersion")
                body = items[0] if items else None
                while not stop.is_set():
                    if (update := changed(body, "does not exist (yet)")) is not None:
                        yield update
                    w: Any = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]
                    gone = False
                    for event in w.stream(
                        self.api.list_cluster_custom_object,
                        API_GROUP,
                        API_VERSION,
                        PLURAL,
                        field_selector=f"metadata.name={self.node}",
                        resource_version=rv,
                        timeout_seconds=self.watch_timeout,
                    ):
                        obj = event["object"]
                        rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        if event["type"] == "ERROR":
                            gone = True
                            break
                        body = None if event["type"] == "DELETED" else obj
                        if (update := changed(body, "was deleted")) is not None:
                            yield update
                        if stop.is_set():
                            w.stop()
                            break
                    if gone:
                        break  # relist
            except (ApiException, OSError, ValueError, urllib3.exceptions.HTTPError) as exc:
                reason = getattr(exc, "reason", None) or str(exc)
                if getattr(exc, "status", None) == 410:
                    continue
                log.warning("MeshNode %s: API error, retrying: %s", self.node, reason)
                yield StateUpdate(None, f"API error reading MeshNode {self.node}: {reason}")
                last = "unset"
                stop.wait(self.backoff)


class KubeStatusSink:
    """The sidecar's writes into MeshNode status."""

    def __init__(self, node: str, kubeconfig: str | None = None) -> None:
        self.node = node
        self.api: Any = kubernetes.client.CustomObjectsApi(api_client(_kubeconfig(kubeconfig), USER_AGENT))

    def publish(self, node_name: str, conditions: list[Condition]) -> None:
        """Replace the condition types given (lastTransitionTime kept while status is unchanged), keep others."""
        ours = [c.wire() for c in conditions]
        types = {c["type"] for c in ours}
        for attempt in range(6):
            try:
                current = self.api.get_cluster_custom_object(API_GROUP, API_VERSION, PLURAL, node_name)
            except ApiException as exc:
                if exc.status == 404:
                    log.warning("MeshNode %s does not exist: conditions not published", node_name)
                    return
                raise
            existing = [c for c in (current.get("status") or {}).get("conditions") or [] if isinstance(c, dict)]
            by_type = {c.get("type"): c for c in existing}
            merged = [c for c in existing if c.get("type") not in types]
            for c in ours:
                old = by_type.get(c["type"])
                keep = old.get("lastTransitionTime") if old and old.get("status") == c["status"] else None
                merged.append({**c, "lastTransitionTime": c.get("lastTransitionTime") or keep or _now()})
            if merged == existing:
                return
            patch = {
                "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                "status": {"conditions": merged},
            }
            try:
                self.api.patch_cluster_custom_object_status(
                    API_GROUP, API_VERSION, PLURAL, node_name, patch, _content_type=MERGE
                )
                return
            except ApiException as exc:
                if exc.status != 409 or attempt == 5:
                    raise

    def publish_pairs(self, node_name: str, pairs: list[QuicPair], dormant: list[QuicPair]) -> None:
        """Persist the QUIC pair state (sidecar-owned) so it survives restarts of either side."""
        quic = {
            "pairs": [p.wire() for p in pairs],
            "dormantPairs": [p.wire() for p in dormant],
            "pairCount": len(pairs),
            "dormantPairCount": len(dormant),
        }
        self.api.patch_cluster_custom_object_status(
            API_GROUP, API_VERSION, PLURAL, node_name, {"status": {"quic": quic}}, _content_type=MERGE
        )


def source(node: str, kubeconfig: str | None = None) -> KubeSource:
    return KubeSource(node, kubeconfig)


def status_sink(node: str, kubeconfig: str | None = None) -> KubeStatusSink:
    return KubeStatusSink(node, kubeconfig)
