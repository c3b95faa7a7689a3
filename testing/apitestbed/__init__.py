"""The API test bed: kmock's KubernetesEmulator plus our layer (see store.py and server.py), run as a local
HTTP server on its own thread so sync clients, kubectl, subprocesses and asyncio code can all use it.

    bed = start(port=0, kubeconfig_path=...)   # -> TestBed; .url, .kubeconfig_path, .audit, .stop()

It is an emulator: custom resources are pruned and validated against their CRD's openAPIV3Schema (schema.py; a
422 Invalid with the field paths in details.causes), built-in kinds are not validated; no RBAC, no controllers
except the ownerReference garbage
collection in store.py. Size walls as a real server's (sizes.py): a body over 3 MiB gets 413, an object over etcd's
1.5 MiB gets 500 "etcdserver: request is too large". `.audit` lists every request as (verb, apiGroup, resource, subresource, namespace).
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import kmock
import yaml

from aether.testing import kubeconfig
from aether.testing.apitestbed.faults import Fault
from aether.testing.apitestbed.server import AuditRecord, TestBedHandler
from aether.testing.apitestbed.store import ApiError, Store

__all__ = ["ApiError", "AuditRecord", "Fault", "Store", "TestBed", "TestBedHandler", "start", "write_kubeconfig"]

T = TypeVar("T")


def write_kubeconfig(path: Path, url: str, name: str = "aether-testbed") -> Path:
    return kubeconfig.write_kubeconfig(path, url, {"token": "testbed"}, name)


class TestBed:
    """A running test bed. Use `.call(fn)` to touch the store from another thread."""

    __test__ = False  # not a pytest class

    def __init__(
        self,
        port: int,
        kubeconfig_path: Path | None,
        audit_path: Path | None,
        host: str,
        crds: bool = True,
        validate: bool = True,
        channel: str | None = None,
    ) -> None:
        self._validate = validate
        self.handler: TestBedHandler | None = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._port, self._host, self._audit_path = port, host, audit_path
        self.port = 0
        self._thread = threading.Thread(target=self._run, name="aether-testbed", daemon=True)
        self._thread.start()
        if not self._ready.wait(30) or self.handler is None:
            raise RuntimeError(f"the API test bed did not start: {self._error!r}")
        self.url: str = f"http://{host}:{self.port}"
        if crds:  # before the kubeconfig exists: whoever waits for that file finds the CRDs installed
            docs = mesh_crds(channel)

            def install(store: Store) -> None:
                rt = store.lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
                for doc in docs:
                    store.create(rt, None, doc)

            self.call(install)
        if kubeconfig_path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="aether-testbed-")
            kubeconfig_path = Path(self._tmp.name) / "kubeconfig"
        self.kubeconfig_path: Path = write_kubeconfig(kubeconfig_path, self.url)

    @property
    def audit(self) -> list[AuditRecord]:
        assert self.handler is not None
        return list(self.handler.audit)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported through start()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        handler = TestBedHandler(store=Store(validate=self._validate), audit_path=self._audit_path)
        async with handler, kmock.Server(handler, host=self._host, port=self._port or None) as server:
            self.handler, self.port = handler, server.port
            self._ready.set()
            await self._stop.wait()
            handler.close_watches()
            await asyncio.sleep(0.05)

    def call(self, fn: Callable[[Store], T]) -> T:
        """Run fn(store) on the test bed's loop (thread-safe) and return its result."""
        assert self.handler is not None
        handler = self.handler

        async def run() -> T:
            result = fn(handler.store)
            if any(k[0] == "apiextensions.k8s.io" for k in handler.store.objects):
                handler.sync_discovery()
            return result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(30)

    def _on_loop(self, fn: Callable[[TestBedHandler], T]) -> T:
        assert self.handler is not None
        handler = self.handler

        async def run() -> T:
            return fn(handler)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(30)

    def inject(self, fault: Fault) -> Fault:
        """Answer the requests `fault` matches with its error (faults.py); returns it (its `.hits` count)."""

        def add(h: TestBedHandler) -> Fault:
            h.faults.append(fault)
            return fault

        return self._on_loop(add)

    def clear_faults(self) -> None:
        self._on_loop(lambda h: h.faults.clear())

    def cut_watches(self) -> None:
        """End every open watch stream now."""
        self._on_loop(lambda h: h.cut_watches())

    def set_down(self, down: bool) -> None:
        """Down: every resource request answers 503 and every open watch ends (an API server gone away)."""

        def apply(h: TestBedHandler) -> None:
            h.down = down
            if down:
                h.cut_watches()

        self._on_loop(apply)

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)

    def __enter__(self) -> TestBed:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


CHANNELS = ("standard", "experimental")  # Gateway API v1.6 UDPRoute CRDs: crds/testbed/channels/<channel>/


def mesh_crds(channel: str | None = None) -> list[dict[str, Any]]:
    """The CRDs aether needs: MeshNode, MeshServiceSlice and MeshAuthorizationPolicy (generated from the models) and
    the Gateway API test copies. `channel`
    (standard: UDPRoute v1 only; experimental: v1 and v1alpha2) replaces the default UDPRoute CRD (v1alpha2 only,
    the shape before Gateway API v1.6) with that channel's copy."""
    from aether.api.crdgen import crds_dir, meshnode_crd, policy_crd, slice_crd

    if channel is not None and channel not in CHANNELS:
        raise ValueError(f"unknown Gateway API channel {channel!r} (known: {', '.join(CHANNELS)})")
    testbed = crds_dir() / "testbed"
    paths = sorted(testbed.glob("*.yaml"))
    if channel is not None:
        paths = [testbed / "channels" / channel / p.name if p.name == "udproutes.yaml" else p for p in paths]
    return [meshnode_crd(), slice_crd(), policy_crd(), *(yaml.safe_load(p.read_text()) for p in paths)]


def start(
    port: int = 0,
    kubeconfig_path: Path | None = None,
    audit_path: Path | None = None,
    host: str = "127.0.0.1",
    crds: bool = True,
    validate: bool = True,
    channel: str | None = None,
) -> TestBed:
    """Start the test bed on host:port (0 = a free port), write a kubeconfig for it, and (crds) install the
    MeshNode and Gateway API test CRDs, as a cluster set up for aether would have them. `validate`: custom
    resources are pruned and validated against their CRD's schema, as kube-apiserver does (schema.py); off, the
    bed stores whatever it is sent (to feed the operator objects a real API server would refuse). `channel`: the
    UDPRoute CRD of that Gateway API v1.6 channel (mesh_crds)."""
    return TestBed(port, kubeconfig_path, audit_path, host, crds, validate, channel)
