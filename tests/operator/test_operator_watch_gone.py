"""A watch resumed from a compacted resourceVersion: the real API server ends it with 410 Gone ("too old resource
version"), and the operator lists again and converges on what changed while it was not watching.

The API server runs without its watch cache (`--watch-cache=false`), so a resumed watch reads etcd and meets the
compaction at once (with the cache, a recent enough revision is still served from memory). The operator's watches
are held off by the fault proxy while a Service is added behind its back and etcd is compacted past everything the
operator saw. The negative control is the same scenario without the compaction: the operator resumes and converges
and no watch carries a 410, so the 410 of the first case is the compaction's. (The API test bed ignores
resourceVersion on watches: it can show neither.)"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from aether.testing import controlplane
from aether.testing.apiserver import Kind
from aether.testing.apitestbed import Fault
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.controlplane.faultproxy import FaultProxy
from aether.testing.wait import wait_for

UDP = [("dns", 53, "UDP")]
SL = [("dns", 5353, "UDP")]


class World:
    def __init__(self) -> None:
        self.cp = controlplane.start(apiserver_args=("--watch-cache=false",))
        self.proxy = FaultProxy(self.cp)
        self.direct = Cluster(str(self.cp.kubeconfig_path), None)
        self.op = InProcessOperator(str(self.proxy.kubeconfig_path))
        self.op.config.resync = 1.0  # the index sweep (aether.operator.resync) every second, not every minute
        self.op.start()

    def close(self) -> None:
        self.op.stop()
        self.proxy.stop()
        self.cp.stop()

    def revision(self) -> int:
        out = self.cp.etcd("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})
        return int(out["header"]["revision"])


@pytest.fixture(scope="module")
def world(api_kind: Kind) -> Iterator[World]:
    if api_kind != "real":
        pytest.skip("AETHER_CONTROL_PLANE=emulated: the emulator has no resourceVersion history to compact")
    w = World()
    try:
        yield w
    finally:
        w.close()


def service(k: Cluster, ns: str, name: str, ip: str) -> None:
    k.apply(o.service(ns, name, None, UDP))
    k.apply(o.endpoint_slice(ns, name, SL, [(ip, True, None)]))


def arm(k: Cluster, node: str, svc: str) -> dict[str, Any] | None:
    return k.arm(node, svc)


def converged_world(k: Cluster, prefix: str, net: str) -> tuple[str, str]:
    """A namespace, a node with a client pod, and Service `before` whose arm the operator has written."""
    ns, node = unique(prefix), unique(f"{prefix}-node")
    k.apply(o.namespace(ns))
    k.apply(o.node(node))
    k.apply(o.pod(ns, "client", node, "client"), status=o.pod_status(f"{net}.2"))
    service(k, ns, "before", f"{net}.10")
    wait_for(lambda: arm(k, node, f"{ns}/before"), what="the first arm", ignore=READ_ERRORS)
    return ns, node


@pytest.mark.parametrize("compact", [True, False], ids=["compacted", "negative-control"])
def test_a_watch_resumed_after_compaction_gets_410_and_the_operator_relists(world: World, compact: bool) -> None:
    k, proxy = world.direct, world.proxy
    ns, node = converged_world(k, "gone", "10.66.0")
    expired = proxy.expired
    held = proxy.inject(Fault(503, verb="watch", times=0, message="watches held off by the test"))
    proxy.cut_watches()
    wait_for(lambda: held.hits >= 3, what="the operator's watches trying to resume")
    service(k, ns, "behind", "10.66.1.2")  # while no watch is open
    if compact:
        rev = world.revision()
        world.cp.etcd("/v3/kv/compaction", {"revision": rev, "physical": True})
    proxy.clear_faults()
    want = [{"ip": "10.66.1.2", "port": 5353}]
    wait_for(
        lambda: (arm(k, node, f"{ns}/behind") or {}).get("endpoints") == want,
        timeout=60,
        what="the arm and endpoints added while the operator was not watching",
        ignore=READ_ERRORS,
    )
    if compact:
        assert proxy.expired > expired, "no watch carried a 410: the operator never resumed from a compacted revision"
    else:
        assert proxy.expired == expired
    assert world.op.alive()


def test_the_sidecar_relists_after_a_410(world: World) -> None:
    """The node sidecar's own list+watch (aether.xds.sidecar.kube_source) through the same proxy: its watches cut
    and their resumption held at the proxy while the operator writes a new arm into a slice and
    etcd is compacted; let through, the resumed stream carries the 410, the sidecar lists again and its next state
    has the arm. (A watch that fails outright, a 503 say, makes the sidecar list again at once: no 410 to see.)"""
    from aether.xds.sidecar.kube_source import USER_AGENT, KubeSource

    k, proxy = world.direct, world.proxy
    ns, node = converged_world(k, "gone-sc", "10.66.2")
    seen: list[set[str]] = []
    stop = threading.Event()

    def follow() -> None:
        for update in KubeSource(node, str(proxy.kubeconfig_path), watch_timeout=30).updates(stop):
            if update.node is not None:
                seen.append({a.service for a in update.node.status.udp.services})

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        wait_for(lambda: seen and f"{ns}/before" in seen[-1], what="the sidecar's first state")
        expired = proxy.expired
        proxy.hold_watches(True, USER_AGENT)  # the sidecar's resumed watch waits with its old resourceVersion
        proxy.cut_watches()
        service(k, ns, "behind", "10.66.3.2")
        wait_for(lambda: arm(k, node, f"{ns}/behind"), what="the operator's new arm", ignore=READ_ERRORS)
        assert f"{ns}/behind" not in seen[-1], "the sidecar saw the change while its watches were held"
        world.cp.etcd("/v3/kv/compaction", {"revision": world.revision(), "physical": True})
        proxy.hold_watches(False)
        wait_for(lambda: f"{ns}/behind" in seen[-1], timeout=60, what="the sidecar's state with the new arm")
        assert proxy.expired > expired, "no watch carried a 410"
    finally:
        stop.set()
        thread.join(40)


def pods_on(k: Cluster, node: str) -> set[str]:
    return {f"{p['namespace']}/{p['name']}" for p in ((k.meshnode(node) or {}).get("status") or {}).get("pods") or []}


def test_a_pod_deleted_while_the_watches_are_down_leaves_its_meshnode(world: World) -> None:
    """kopf's re-list after a 410 re-indexes what it lists and drops nothing it no longer lists: a pod deleted
    while the operator's watches were down stayed on its MeshNode until the operator restarted (churn run: pod
    caller-1005, 8 minutes). The index sweep drops it: the MeshNode loses the pod within a few sweeps."""
    k, proxy = world.direct, world.proxy
    ns, node = converged_world(k, "stale", "10.66.4")
    k.apply(o.pod(ns, "doomed", node, "client"), status=o.pod_status("10.66.4.3"))
    wait_for(lambda: f"{ns}/doomed" in pods_on(k, node), what="the pod on its MeshNode", ignore=READ_ERRORS)
    expired = proxy.expired
    held = proxy.inject(Fault(503, verb="watch", times=0, message="watches held off by the test"))
    proxy.cut_watches()
    wait_for(lambda: held.hits >= 3, what="the operator's watches trying to resume")
    k.delete("v1", "Pod", "doomed", ns)  # through the server's own kubeconfig: the operator sees no DELETED
    wait_for(lambda: k.get("v1", "Pod", "doomed", ns) is None, what="the pod gone from the API")
    world.cp.etcd("/v3/kv/compaction", {"revision": world.revision(), "physical": True})  # kopf must list again
    proxy.clear_faults()
    wait_for(lambda: proxy.expired > expired, timeout=60, what="a resumed watch ending with 410 (kopf re-lists)")
    wait_for(
        lambda: f"{ns}/doomed" not in pods_on(k, node) and f"{ns}/client" in pods_on(k, node),
        timeout=30,
        what="the deleted pod off its MeshNode (the client pod still on it)",
        ignore=READ_ERRORS,
    )
    assert world.op.alive()
