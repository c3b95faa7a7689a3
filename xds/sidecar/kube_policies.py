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

from aether.api.authz import PLURAL
from aether.api.client import api_client
from aether.xds.sidecar.kube_source import USER_AGENT, ListWatch, kubeconfig_path, relist_retry

log = logging.getLogger("aether.xds.kube")
OnPolicies = Callable[[Sequence[dict[str, Any]]], None]


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


class PolicyWatch:
    """The sink of a `ListWatch` of every namespace's policies: keeps them by (namespace, name) and hands them whole
    to `on_policies` on every change."""

    def __init__(
        self, on_policies: OnPolicies, kubeconfig: str | None = None, watch_timeout: int = 30, backoff: float = 1.0
    ) -> None:
        self.on_policies, self.backoff = on_policies, backoff
        api: Any = kubernetes.client.CustomObjectsApi(api_client(kubeconfig_path(kubeconfig), USER_AGENT))
        self.watch = ListWatch(api, PLURAL, None, watch_timeout, relist_retry(backoff), self, key=_key)
        self.held: dict[tuple[str, str], dict[str, Any]] = {}

    def _publish(self) -> None:
        self.on_policies([self.held[k] for k in sorted(self.held)])

    def put(self, event: tuple[str, Any, Any]) -> float | None:
        """One ListWatch event; -> the seconds to wait before relisting after an error (None: the watch's own)."""
        kind, key, obj = event
        if kind == "error":
            if obj == 404 and not self.held:  # the CRD is not installed: no policy can exist
                log.warning("MeshAuthorizationPolicies are not served by the API (404): none in force")
                self._publish()
                return self.backoff * 30
            log.warning("MeshAuthorizationPolicies: API error, keeping the %d in force: %s", len(self.held), key)
            return None
        if kind == "list":
            self.held = dict(obj)
        elif kind == "gone":
            self.held.pop(key, None)
        else:
            self.held[key] = obj
        self._publish()
        return None

    def run(self, stop: threading.Event) -> None:
        self.watch.run(stop)


def start(on_policies: OnPolicies, stop: threading.Event, kubeconfig: str | None = None) -> threading.Thread:
    """Watch in a daemon thread; the caller sets `Sidecar.awaiting_policies` first."""
    watch = PolicyWatch(on_policies, kubeconfig)
    t = threading.Thread(target=watch.run, args=(stop,), name="policies", daemon=True)
    t.start()
    return t
