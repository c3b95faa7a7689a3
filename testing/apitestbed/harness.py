"""Harness for API-contract tests and the demo: the real operator in-process (kopf.operator as an asyncio task
on its own loop thread) and a thin client over any API server (the test bed or a real cluster) that applies
objects; tests poll it with `aether.testing.wait.wait_for(..., ignore=READ_ERRORS)` until the API shows what is
expected."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, NotFoundError

from aether.api.client import api_client
from aether.api.meshnode import parse_meshnode
from aether.api.slices import NodeState, parse_slice
from aether.operator.cli import run
from aether.operator.handlers import OperatorConfig
from aether.testing.apitestbed.faults import Faults
from aether.testing.commands import command
from aether.testing.wait import DEFAULT_TIMEOUT, wait_for

T = TypeVar("T")
MERGE = "application/merge-patch+json"
# What reading an object the operator is still filling in may raise: a poll of the API treats them as "not yet".
READ_ERRORS: tuple[type[BaseException], ...] = (AssertionError, KeyError, TypeError, IndexError)


class InProcessOperator:
    def __init__(self, kubeconfig: str) -> None:
        self.config = OperatorConfig(kubeconfig=kubeconfig, debounce=0.05)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="aether-operator-under-test", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self._started.set()
            await run(self.config, self._stop)

        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced by the tests through .alive()
            self.error = exc

    def start(self) -> None:
        self._thread.start()
        self._started.wait(30)

    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)


class Cluster:
    """A thin client over any API server (the test bed or a real cluster)."""

    def __init__(self, kubeconfig: str, bed: Faults | None) -> None:
        """`bed`: where faults are injected (the test bed, or the fault proxy in front of a real server); None on a
        cluster of your own."""
        self.kubeconfig, self.bed = kubeconfig, bed
        self.dyn = DynamicClient(api_client(kubeconfig))  # type: ignore[no-untyped-call]
        self._res: dict[tuple[str, str], Any] = {}

    def res(self, api_version: str, kind: str) -> Any:
        key = (api_version, kind)
        if key not in self._res:
            self._res[key] = self.dyn.resources.get(api_version=api_version, kind=kind)
        return self._res[key]

    def apply(self, obj: dict[str, Any], status: dict[str, Any] | None = None) -> Any:
        """Create, or merge-patch when it exists; then set status through /status when given. A Pod's
        ServiceAccount is created first when missing, as the manifests that ship a workload ship its account (a real
        server's ServiceAccount admission refuses a Pod whose account does not exist)."""
        r = self.res(obj["apiVersion"], obj["kind"])
        ns = obj["metadata"].get("namespace")
        if obj["kind"] == "Pod" and obj["apiVersion"] == "v1":
            self.service_account(ns, (obj.get("spec") or {}).get("serviceAccountName") or "default")
        try:
            out = r.create(body=obj, namespace=ns)
        except ConflictError:
            # a Pod's spec is immutable once created (a real server refuses the patch): only its metadata moves
            body = {"metadata": {k: v for k, v in obj["metadata"].items() if k in ("labels", "annotations")}}
            patch = body if obj["kind"] == "Pod" and obj["apiVersion"] == "v1" else obj
            out = r.patch(body=patch, name=obj["metadata"]["name"], namespace=ns, content_type=MERGE)
        if status is not None:
            out = r.subresources["status"].patch(
                body=status, name=obj["metadata"]["name"], namespace=ns, content_type=MERGE
            )
        return out

    def service_account(self, namespace: str, name: str) -> None:
        with contextlib.suppress(ConflictError):
            self.res("v1", "ServiceAccount").create(
                body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
                namespace=namespace,
            )

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        """Delete; a Pod goes at once (grace period 0), as when its kubelet has stopped it: a real server keeps a
        deleted Pod that names a node until that node's kubelet confirms, and this harness is the only kubelet."""
        body = {"gracePeriodSeconds": 0} if kind == "Pod" and api_version == "v1" else None
        with contextlib.suppress(NotFoundError):
            self.res(api_version, kind).delete(name=name, namespace=namespace, body=body)

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            out: dict[str, Any] = self.res(api_version, kind).get(name=name, namespace=namespace).to_dict()
            return out
        except NotFoundError:
            return None

    def meshnode(self, name: str) -> dict[str, Any] | None:
        return self.get("mesh.aether.dev/v1alpha1", "MeshNode", name)

    def slices(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.res("mesh.aether.dev/v1alpha1", "MeshServiceSlice").get().to_dict()["items"]
        return items

    def state(self, node: str) -> dict[str, Any]:
        """MeshNode `node`'s status with every arm in effect inline (its MeshServiceSlices read as the sidecar reads
        them: api.slices.effective), camelCase; {} while there is no MeshNode."""
        mn = self.meshnode(node)
        if mn is None:
            return {}
        held = {s["metadata"]["name"]: parse_slice(s, "slice") for s in self.slices()}
        status: dict[str, Any] = NodeState(parse_meshnode(mn, f"MeshNode/{node}"), held).effective().status.wire()
        return status

    def route(self, ns: str, name: str, version: str = "v1alpha2") -> dict[str, Any] | None:
        return self.get(f"gateway.networking.k8s.io/{version}", "UDPRoute", name, ns)

    def arm(self, node: str, service: str) -> dict[str, Any] | None:
        arms = (self.state(node).get("udp") or {}).get("services") or []
        return next((a for a in arms if a.get("service") == service), None)

    def wait(self, what: str, fn: Callable[[], T | None], timeout: float = DEFAULT_TIMEOUT) -> T:
        """Compatibility for tests/operator/test_operator_metrics.py only: new code calls wait_for."""
        return wait(what, fn, timeout)


def wait(what: str, fn: Callable[[], T | None], timeout: float = DEFAULT_TIMEOUT) -> T:
    """Compatibility for tests/operator/test_operator_metrics.py only: new code calls
    `wait_for(fn, timeout, what, ignore=READ_ERRORS)`."""
    return wait_for(fn, timeout, what, ignore=READ_ERRORS)


@contextlib.contextmanager
def operator_subprocess(kubeconfig: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`aether operator --kubeconfig F ARGS...` as a child process (stdout and stderr together, as text); killed on
    exit if the caller has not stopped it."""
    proc = subprocess.Popen(
        [*command(), "operator", "--kubeconfig", kubeconfig, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"
