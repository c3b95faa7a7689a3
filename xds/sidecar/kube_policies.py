"""Cluster mode: the MeshAuthorizationPolicies of every namespace, read-only (list, then watch), handed to the
sidecar whole on every change (`on_policies`); the translation compiles those of the node's local Services.

Read-only by design: the operator validates policies and writes their status; the sidecar only needs their spec.
An API error keeps the last policies in force (fail static: a watch outage neither opens nor closes a Service) and
retries after `backoff`; a 410 (expired resourceVersion) relists; a 404 (the CRD not installed) means none. The
sidecar serves nothing until the first list arrived (`Sidecar.awaiting_policies`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import kubernetes
import urllib3

from aether.api.authz import API_GROUP, API_VERSION, PLURAL
from aether.api.client import ApiException, api_client
from aether.xds.sidecar.kube_source import USER_AGENT, _kubeconfig

log = logging.getLogger("aether.xds.kube")
OnPolicies = Callable[[Sequence[dict[str, Any]]], None]


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


class PolicyWatch:
    def __init__(
        self, on_policies: OnPolicies, kubeconfig: str | None = None, watch_timeout: int = 30, backoff: float = 1.0
    ) -> None:
        self.on_policies, self.watch_timeout, self.backoff = on_policies, watch_timeout, backoff
        self.api: Any = kubernetes.client.CustomObjectsApi(api_client(_kubeconfig(kubeconfig), USER_AGENT))
        self.held: dict[tuple[str, str], dict[str, Any]] = {}

    def _publish(self) -> None:
        self.on_policies([self.held[k] for k in sorted(self.held)])

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                listed = self.api.list_cluster_custom_object(API_GROUP, API_VERSION, PLURAL)
                self.held = {_key(o): o for o in listed.get("items") or []}
                rv = (listed.get("metadata") or {}).get("resourceVersion")
                self._publish()
                while not stop.is_set():
                    w: Any = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]
                    expired = False
                    for event in w.stream(
                        self.api.list_cluster_custom_object,
                        API_GROUP,
                        API_VERSION,
                        PLURAL,
                        resource_version=rv,
                        timeout_seconds=self.watch_timeout,
                    ):
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            expired = True
                            break
                        rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        if event["type"] == "DELETED":
                            self.held.pop(_key(obj), None)
                        else:
                            self.held[_key(obj)] = obj
                        self._publish()
                        if stop.is_set():
                            w.stop()
                            break
                    if expired:
                        break  # relist
            except (ApiException, OSError, ValueError, urllib3.exceptions.HTTPError) as exc:
                status = getattr(exc, "status", None)
                if status == 410:
                    continue
                if status == 404 and not self.held:  # the CRD is not installed: no policy can exist
                    log.warning("MeshAuthorizationPolicies are not served by the API (404): none in force")
                    self._publish()
                    stop.wait(self.backoff * 30)
                    continue
                reason = getattr(exc, "reason", None) or str(exc)
                log.warning("MeshAuthorizationPolicies: API error, keeping the %d in force: %s", len(self.held), reason)
                stop.wait(self.backoff)


def start(on_policies: OnPolicies, stop: threading.Event, kubeconfig: str | None = None) -> threading.Thread:
    """Watch in a daemon thread; the caller sets `Sidecar.awaiting_policies` first."""
    watch = PolicyWatch(on_policies, kubeconfig)
    t = threading.Thread(target=watch.run, args=(stop,), name="policies", daemon=True)
    t.start()
    return t
