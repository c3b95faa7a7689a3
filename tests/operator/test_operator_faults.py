"""Injected API faults (the test bed's Fault, cut_watches, set_down): a 500 on a write, a 409, a 422 on one object,
every watch stream cut, the API down for 10 s. After each the operator ends converged (the API holds what it
computes), the metrics count the fault, and /healthz stays 200 (no pass stalls: a failed write returns at once and
is retried alone)."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from aether.metrics import REGISTRY
from aether.testing.apitestbed import Fault, TestBed, start
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.apitestbed.store import Store
from aether.testing.wait import wait_for

UDP = [("dns", 53, "UDP")]
SL = [("dns", 5353, "UDP")]


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


class World:
    def __init__(self, bed: TestBed, op: InProcessOperator, port: int) -> None:
        self.bed, self.op, self.port = bed, op, port
        self.k = Cluster(str(bed.kubeconfig_path), bed)
        self.ns, self.node = unique("flt"), unique("flt-node")
        self.k.apply(o.namespace(self.ns))
        self.k.apply(o.node(self.node))
        self.k.apply(o.pod(self.ns, "client", self.node), status=o.pod_status("10.90.0.2"))
        self.n = 0

    def service(self) -> str:
        self.n += 1
        name = f"s{self.n}"
        self.k.apply(o.service(self.ns, name, f"10.96.90.{self.n}", UDP))
        self.k.apply(o.endpoint_slice(self.ns, name, SL, [(f"10.90.1.{self.n}", True, None)]))
        return name

    def arms(self) -> set[str]:
        return {a["service"] for a in (self.k.state(self.node).get("udp") or {}).get("services") or []}

    def converged(self, *services: str, within: float = 10.0) -> None:
        want = {f"{self.ns}/{s}" for s in services}
        wait_for(lambda: want <= self.arms(), timeout=within, what=f"arms {sorted(want)}", ignore=READ_ERRORS)
        assert healthz(self.port) == 200 and self.op.alive()


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    bed = start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    op = InProcessOperator(str(bed.kubeconfig_path))
    op.config.liveness = ("127.0.0.1", port)
    op.start()
    try:
        w = World(bed, op, port)
        wait_for(lambda: healthz(port) == 200, timeout=60, what="/healthz 200", ignore=(OSError,))
        w.converged(w.service())
        yield w
    finally:
        op.stop()
        bed.stop()


def test_a_500_on_a_slice_write_is_retried(world: World) -> None:
    """A Service added writes its namespace's MeshServiceSlice (a JSON patch), not the MeshNode."""
    before = metric("aether_operator_write_retries_total", kind="slice", error="api_500")
    fault = world.bed.inject(Fault(500, verb="patch", plural="meshserviceslices"))
    svc = world.service()
    world.converged(svc)
    assert fault.hits == 1
    assert metric("aether_operator_write_retries_total", kind="slice", error="api_500") == before + 1


def test_a_409_on_a_slice_is_re_read_and_retried(world: World) -> None:
    before = metric("aether_operator_slice_writes_total", outcome="conflict_retry")
    fault = world.bed.inject(Fault(409, verb="patch", plural="meshserviceslices"))
    svc = world.service()
    world.converged(svc)
    assert fault.hits == 1
    assert metric("aether_operator_slice_writes_total", outcome="conflict_retry") == before + 1


def test_a_409_on_a_meshnode_status_is_re_read_and_retried(world: World) -> None:
    """A pod landing writes that node's MeshNode."""
    before = metric("aether_operator_meshnode_writes_total", outcome="conflict_retry")
    fault = world.bed.inject(Fault(409, verb="patch", plural="meshnodes", subresource="status", name=world.node))
    name = f"late{world.n}"
    world.k.apply(o.pod(world.ns, name, world.node), status=o.pod_status(f"10.90.0.{100 + world.n}"))

    def landed() -> bool:
        return any(p["name"] == name for p in world.k.state(world.node).get("pods") or [])

    wait_for(landed, what="the pod in its MeshNode", ignore=READ_ERRORS)
    assert fault.hits == 1
    assert metric("aether_operator_meshnode_writes_total", outcome="conflict_retry") == before + 1


def test_a_422_on_one_route_holds_back_nothing(world: World) -> None:
    before = metric("aether_operator_write_refusals_total", kind="udproute")
    fault = world.bed.inject(
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
        world.bed.clear_faults()


def _watches() -> Any:
    return lambda rec: rec.verb == "watch" and rec.user_agent.startswith("kopf")


def test_cut_watch_streams_are_resumed(world: World) -> None:
    seen = len([r for r in world.bed.audit if _watches()(r)])
    world.bed.cut_watches()
    wait_for(lambda: len([r for r in world.bed.audit if _watches()(r)]) > seen, what="kopf watching again")
    world.converged(world.service())


def test_the_api_down_for_10_s(world: World) -> None:
    """A write fails with 503 and keeps being retried (with backoff) through 10 s of outage; meanwhile a Service is
    added and its namespace's MeshServiceSlices are deleted behind the API's back. Once it is back everything converges."""
    errors = metric("aether_operator_write_retries_total", kind="slice", error="api_503")
    fault = world.bed.inject(Fault(503, verb="patch", plural="meshserviceslices", times=0))
    svc = world.service()
    wait_for(lambda: fault.hits >= 1, what="the write that meets the outage")
    world.bed.set_down(True)
    down_at = time.monotonic()
    late = f"s{world.n + 1}"
    world.n += 1

    def behind_the_back(store: Store) -> None:
        store.create(store.lookup("", "v1", "services"), world.ns, o.service(world.ns, late, "10.96.90.250", UDP))
        sl = store.lookup("mesh.aether.dev", "v1alpha1", "meshserviceslices")  # the tables, deleted by hand
        for (_, name), obj in list(store.objects[sl.key].items()):
            if obj["spec"]["namespace"] == world.ns:
                store.delete(sl, None, name)

    world.bed.call(behind_the_back)
    try:
        wait_for(
            lambda: metric("aether_operator_write_retries_total", kind="slice", error="api_503") >= errors + 2,
            what="retries during the outage",
        )
        assert healthz(world.port) == 200, "a failing API is no stalled pass"
        remaining = 10.0 - (time.monotonic() - down_at)
        wait_for(lambda: time.monotonic() - down_at >= 10.0, timeout=max(remaining, 0) + 1, what="10 s of outage")
    finally:
        world.bed.clear_faults()
        world.bed.set_down(False)
    world.converged(svc, late, "s1", within=15.0)
