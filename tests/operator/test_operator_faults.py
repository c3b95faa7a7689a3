"""Injected API faults: a 500 on a write, a 409, a 422 on one object, every watch stream cut, the API down for 10 s.
On the real control plane (the default) the faults come from the fault proxy in front of kube-apiserver (the
operator's kubeconfig goes through it) and the outage is real: the kube-apiserver process stopped and started again
(`ControlPlane.set_down`); `AETHER_CONTROL_PLANE=emulated` runs the same on the API test bed's own faults. After each
the operator ends converged (the API holds what it computes), the metrics count the fault, and /healthz stays 200 (no
pass stalls: a failed write returns at once and is retried alone)."""

from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from aether.metrics import REGISTRY
from aether.testing.apiserver import Kind, Server, api_server
from aether.testing.apitestbed import AuditRecord, Fault
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.faults import Faults
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.apitestbed.store import Store
from aether.testing.wait import wait_for

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("AETHER_KUBECONFIG")), reason="injects faults and an outage into a control plane of its own"
)

UDP = [("dns", 53, "UDP")]
SL = [("dns", 5353, "UDP")]
SLICE = ("mesh.aether.dev/v1alpha1", "MeshServiceSlice")


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def slice_retries() -> float:
    """Every failed MeshServiceSlice write retried so far, whatever the error."""
    return sum(
        s.value
        for family in REGISTRY.collect()
        for s in family.samples
        if s.name == "aether_operator_write_retries_total" and s.labels.get("kind") == "slice"
    )


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


class World:
    def __init__(self, server: Server, op: InProcessOperator, port: int) -> None:
        self.server, self.op, self.port = server, op, port
        faults = server.faults
        assert faults is not None
        self.faults: Faults = faults
        self.k = Cluster(server.kubeconfig, faults)  # through the faults, as the operator sees the API
        # the server itself, past the fault proxy (on the emulator the faults are the server's own)
        cp = server.control_plane
        self.admin = Cluster(str(cp.kubeconfig_path), None) if cp is not None else self.k
        self.ns, self.node = unique("flt"), unique("flt-node")
        self.k.apply(o.namespace(self.ns))
        self.k.apply(o.node(self.node))
        self.k.apply(o.pod(self.ns, "client", self.node), status=o.pod_status("10.90.0.2"))
        self.n = 0

    @property
    def emulated(self) -> bool:
        return self.server.bed is not None

    def audit(self) -> list[AuditRecord]:
        if self.server.bed is not None:
            return self.server.bed.audit
        assert self.server.control_plane is not None
        return self.server.control_plane.audit

    def service_body(self, name: str, n: int) -> dict[str, Any]:
        """The emulator takes the ClusterIP asked for (it has no allocator); on the real server the allocator picks."""
        return o.service(self.ns, name, f"10.96.90.{n}" if self.emulated else None, UDP)

    def service(self) -> str:
        self.n += 1
        name = f"s{self.n}"
        self.k.apply(self.service_body(name, self.n))
        self.k.apply(o.endpoint_slice(self.ns, name, SL, [(f"10.90.1.{self.n}", True, None)]))
        return name

    def arms(self) -> set[str]:
        return {a["service"] for a in (self.k.state(self.node).get("udp") or {}).get("services") or []}

    def converged(self, *services: str, within: float = 10.0) -> None:
        want = {f"{self.ns}/{s}" for s in services}
        wait_for(lambda: want <= self.arms(), timeout=within, what=f"arms {sorted(want)}", ignore=READ_ERRORS)
        assert healthz(self.port) == 200 and self.op.alive()


@pytest.fixture(scope="module")
def world(api_kind: Kind) -> Iterator[World]:
    with api_server(api_kind, faults=True) as server:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        op = InProcessOperator(server.kubeconfig)
        op.config.liveness = ("127.0.0.1", port)
        op.start()
        try:
            w = World(server, op, port)
            wait_for(lambda: healthz(port) == 200, timeout=60, what="/healthz 200", ignore=(OSError,))
            w.converged(w.service())
            yield w
        finally:
            op.stop()


def test_a_500_on_a_slice_write_is_retried(world: World) -> None:
    """A Service added writes its namespace's MeshServiceSlice (a JSON patch), not the MeshNode."""
    before = metric("aether_operator_write_retries_total", kind="slice", error="api_500")
    fault = world.faults.inject(Fault(500, verb="patch", plural="meshserviceslices"))
    svc = world.service()
    world.converged(svc)
    assert fault.hits == 1
    assert metric("aether_operator_write_retries_total", kind="slice", error="api_500") == before + 1


def test_a_409_on_a_slice_is_re_read_and_retried(world: World) -> None:
    before = metric("aether_operator_slice_writes_total", outcome="conflict_retry")
    fault = world.faults.inject(Fault(409, verb="patch", plural="meshserviceslices"))
    svc = world.service()
    world.converged(svc)
    assert fault.hits == 1
    assert metric("aether_operator_slice_writes_total", outcome="conflict_retry") == before + 1


def test_a_409_on_a_meshnode_status_apply_is_retried_alone(world: World) -> None:
    """A pod landing writes that node's MeshNode status by server-side apply (forced, no resourceVersion: a real
    server answers it no 409, and there is no re-read loop). A 409 all the same (injected) is a failed write like
    any other: that MeshNode alone is retried with backoff."""
    before = metric("aether_operator_write_retries_total", kind="meshnode", error="api_409")
    conflicts = metric("aether_operator_meshnode_writes_total", outcome="conflict_retry")
    fault = world.faults.inject(Fault(409, verb="patch", plural="meshnodes", subresource="status", name=world.node))
    name = f"late{world.n}"
    world.k.apply(o.pod(world.ns, name, world.node), status=o.pod_status(f"10.90.0.{100 + world.n}"))

    def landed() -> bool:
        return any(p["name"] == name for p in world.k.state(world.node).get("pods") or [])

    wait_for(landed, what="the pod in its MeshNode", ignore=READ_ERRORS)
    assert fault.hits == 1
    assert metric("aether_operator_write_retries_total", kind="meshnode", error="api_409") == before + 1
    assert metric("aether_operator_meshnode_writes_total", outcome="conflict_retry") == conflicts


def test_a_422_on_one_route_holds_back_nothing(world: World) -> None:
    before = metric("aether_operator_write_refusals_total", kind="udproute")
    fault = world.faults.inject(
        Fault(422, verb="patch", plural="udproutes", subresource="status", name="refused", times=0)
    )
    try:
        world.k.apply(o.udproute(world.ns, "refused", "s1", [o.backend("s1", 53)]))
        svc = world.service()
        world.k.apply(o.udproute(world.ns, "fine", svc, [o.backend(svc, 53)]))

        def fine() -> Any:
            return ((world.k.route(world.ns, "fine") or {}).get("status") or {}).get("parents")

        wait_for(fine, what="the other route's status", ignore=READ_ERRORS)
        world.converged(svc)
        wait_for(lambda: fault.hits >= 1, what="the refused write")
        assert metric("aether_operator_write_refusals_total", kind="udproute") == before + 1
    finally:
        world.faults.clear_faults()


def _kopf_watches(world: World) -> int:
    return len([r for r in world.audit() if r.verb == "watch" and r.user_agent.startswith("kopf")])


def test_cut_watch_streams_are_resumed(world: World) -> None:
    """Cut twice: after the first cut the operator sees a Service added only through a watch it opened again, and the
    second cut ends those new streams (the real server audits a watch when it ends; the emulator when it starts)."""
    seen = _kopf_watches(world)
    world.faults.cut_watches()
    wait_for(lambda: _kopf_watches(world) > seen, what="the watch streams cut")
    world.converged(world.service())
    again = _kopf_watches(world)
    world.faults.cut_watches()
    wait_for(lambda: _kopf_watches(world) > again, what="kopf's new watch streams, cut in their turn")
    world.converged(world.service())


def test_the_api_down_for_10_s(world: World) -> None:
    """A write fails with 503 and keeps being retried (with backoff) while the API is unreachable; meanwhile a Service
    is added and its namespace's MeshServiceSlices are deleted behind the operator's back. On the real control plane
    the outage is real: the fault proxy cuts the operator off while the changes are made past it, then the
    kube-apiserver process is stopped for 10 s and started again. On the emulator the test bed is down for 10 s and
    the changes are made in its store. Once it is back everything converges."""
    errors = metric("aether_operator_write_retries_total", kind="slice", error="api_503")
    fault = world.faults.inject(Fault(503, verb="patch", plural="meshserviceslices", times=0))
    svc = world.service()
    wait_for(lambda: fault.hits >= 1, what="the write that meets the outage")
    world.faults.set_down(True)
    down_at = time.monotonic()
    world.n += 1
    late = f"s{world.n}"
    behind_the_back(world, late)
    cp = world.server.control_plane
    try:
        wait_for(
            lambda: metric("aether_operator_write_retries_total", kind="slice", error="api_503") >= errors + 2,
            what="retries during the outage",
        )
        assert healthz(world.port) == 200, "a failing API is no stalled pass"
        if cp is not None:  # the real outage: nothing answers behind the proxy
            world.faults.clear_faults()
            world.faults.set_down(False)
            cp.set_down(True)
            down_at, before = time.monotonic(), slice_retries()
            wait_for(lambda: slice_retries() >= before + 2, what="retries while kube-apiserver is stopped")
            assert healthz(world.port) == 200, "a stopped API server is no stalled pass"
        remaining = 10.0 - (time.monotonic() - down_at)
        wait_for(lambda: time.monotonic() - down_at >= 10.0, timeout=max(remaining, 0) + 1, what="10 s of outage")
    finally:
        world.faults.clear_faults()
        world.faults.set_down(False)
        if cp is not None:
            cp.set_down(False)
    world.converged(svc, late, "s1", within=30.0)


def behind_the_back(world: World, late: str) -> None:
    """Add Service `late` and delete the namespace's MeshServiceSlices (its tables) where the operator cannot see."""
    if world.server.bed is None:
        world.admin.apply(world.service_body(late, world.n))
        for sl in world.admin.slices():
            if sl["spec"]["namespace"] == world.ns:
                world.admin.delete(*SLICE, sl["metadata"]["name"])
        return
    ns = world.ns

    def in_the_store(store: Store) -> None:
        store.create(store.lookup("", "v1", "services"), ns, world.service_body(late, 250))
        sl = store.lookup("mesh.aether.dev", "v1alpha1", "meshserviceslices")
        for (_, name), obj in list(store.objects[sl.key].items()):
            if obj["spec"]["namespace"] == ns:
                store.delete(sl, None, name)

    world.server.bed.call(in_the_store)
