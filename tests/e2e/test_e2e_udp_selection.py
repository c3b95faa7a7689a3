"""Per-service UDP selection across two nodes, through the whole mesh: Services, EndpointSlices and a UDPRoute
applied through the API, the real operator writing MeshNodes, each node's sidecar serving its real Envoy, pods
captured by the real aether-cni. Assertions are about traffic: which backend answered, and from where.

Topology: client pods on node-a (one with the deployed tproxy capture, one with REDIRECT: the negative
control), three echo backends on node-b, one Service per backend (three VIPs on one port, 18082); and the other
way round, a client on node-b and a fourth backend on node-a.

Every test runs on both UDP data paths (`aether.e2e.dataplane`): Envoy's udp_proxy, and the in-kernel path (the
sidecars started with `--udp-dataplane kernel`), where each test also checks that the datagrams went through the
pod's nft table and never reached Envoy.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest

from aether.e2e.dataplane import (
    UDP_DATAPLANES,
    PathCounters,
    kernel_shares,
    kernel_vips,
    on_kernel,
    wait_kernel_backends,
    wait_kernel_vips,
)
from aether.e2e.harness import BACKEND_PORT, Mesh, MeshPod
from aether.e2e.kube import udp_arms
from aether.e2e.lifecycle import STREAMS, route_condition, start_sidecar, stop_sidecar
from aether.netns.contract import L4_OUTBOUND_PORT, CaptureMode
from aether.testing.probe import Answer, who_answers
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

BACKENDS = {"svc-a": "echo-a", "svc-b": "echo-b", "svc-c": "echo-c"}


@pytest.fixture(scope="module", params=UDP_DATAPLANES)
def mesh(request: pytest.FixtureRequest) -> Iterator[Mesh]:
    m = Mesh(namespace="e2e", udp_dataplane=request.param)
    try:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        m.start_node_proxies()
        m.add_pod(a, "client")
        m.add_pod(a, "client-redirect", capture=CaptureMode.REDIRECT)
        for svc, backend in BACKENDS.items():
            m.add_backend(b, backend)
            m.add_service(svc, [backend])
        m.add_pod(b, "client-b")  # the other way round: a client on node-b, a backend on node-a
        m.add_backend(a, "echo-d")
        m.add_service("svc-d", ["echo-d"])
        want = {m.services[s]: f"udp:e2e/{s}" for s in [*BACKENDS, "svc-d"]}
        m.wait_arms(a, want)
        m.wait_arms(b, want)
        m.wait_listeners(a, 3)  # one capture listener per pod on node-a
        wait_kernel_vips(m, [m.pods[p] for p in ("client", "client-redirect", "client-b")], want)
        yield m
    finally:
        m.close()


def selection_failures(mesh: Mesh, client: MeshPod, expect: dict[str, str], timeout: float = 30.0) -> list[str]:
    """For each Service: does its VIP reach its own backend, with the reply from VIP:18082? [] when all do.
    Retries until `timeout` (the first datagrams may race the last config push); one round when it is 0."""
    failures: list[str] = []

    def all_selected() -> bool:
        failures.clear()
        for svc, backend in expect.items():
            vip = mesh.services[svc]
            ans = who_answers(client.netns_path, vip, tries=2, timeout=0.4)
            if ans.backend != backend or not ans.from_vip:
                failures.append(f"{svc} ({vip}:{L4_OUTBOUND_PORT}) expected {backend}, got {ans.show()}")
        return not failures

    with contextlib.suppress(TimeoutError):  # the caller asserts on what is left
        wait_for(all_selected, timeout, "every VIP answered by its own backend", interval=0)
    return failures


def test_each_vip_reaches_its_own_backend_on_the_other_node(mesh: Mesh) -> None:
    client = mesh.pods["client"]
    assert client.node.name == "node-a" and {mesh.pods[b].node.name for b in BACKENDS.values()} == {"node-b"}
    counted = PathCounters(client, [mesh.services[s] for s in BACKENDS])
    failures = selection_failures(mesh, client, BACKENDS)
    assert failures == [], "\n".join(failures) + "\n" + mesh.diagnostics()
    counted.check(mesh)


def test_selection_from_the_other_node_reaches_local_and_remote_backends(mesh: Mesh) -> None:
    client = mesh.pods["client-b"]
    expect = {**BACKENDS, "svc-d": "echo-d"}  # echo-a..c beside it on node-b, echo-d on node-a
    counted = PathCounters(client, [mesh.services[s] for s in expect])
    failures = selection_failures(mesh, client, expect)
    assert failures == [], "\n".join(failures) + "\n" + mesh.diagnostics()
    counted.check(mesh)


def test_redirect_capture_loses_per_service_selection(mesh: Mesh) -> None:
    """Negative control (R6): the same scenario from a pod whose capture is REDIRECT. REDIRECT rewrites the
    destination to 127.0.0.1, so Envoy's matcher never sees the VIP: every VIP lands on the blackhole.

    Seen red: `selection_failures` over this pod (what the test above asserts is []) reported every Service
    with `got no reply`.

    On the kernel path the control comes out the other way, by design: the table's nat chain runs before the
    REDIRECT capture's (priority dstnat - 1), so the VIP is rewritten to its backend before REDIRECT could take it:
    every Service is answered by its own backend, nothing reaches Envoy's blackhole."""
    pod = mesh.pods["client-redirect"]
    node = pod.node
    before = node.stat("cluster.blackhole.upstream_cx_none_healthy")
    if on_kernel(mesh):
        counted = PathCounters(pod, [mesh.services[s] for s in BACKENDS])
        assert selection_failures(mesh, pod, BACKENDS, timeout=0) == []
        assert node.stat("cluster.blackhole.upstream_cx_none_healthy") == before
        counted.check(mesh)
        return
    failures = selection_failures(mesh, pod, BACKENDS, timeout=0)
    assert len(failures) == len(BACKENDS), failures
    assert all("got no reply" in f for f in failures), failures
    # the datagrams did reach Envoy (the capture worked) and every one went to on_no_match, the blackhole
    sent = 2 * len(BACKENDS)  # selection_failures asks twice per Service when nothing answers
    assert node.stat("cluster.blackhole.upstream_cx_none_healthy") - before == sent, mesh.diagnostics()


def test_rerouting_a_service_with_a_udproute_moves_its_vip(mesh: Mesh) -> None:
    client = mesh.pods["client"]
    mesh.add_route("svc-b-route", "svc-b", "svc-c")
    try:
        moved = {**BACKENDS, "svc-b": "echo-c"}
        failures = selection_failures(mesh, client, moved)
        assert failures == [], "\n".join(failures) + "\n" + mesh.diagnostics()
        assert route_condition(mesh, "svc-b-route", "Accepted") == "True"  # the operator's verdict, in status
        back = json.dumps({"spec": {"rules": [{"backendRefs": [{"name": "svc-b", "port": L4_OUTBOUND_PORT}]}]}})
        if mesh.kubectl("patch", "udproute", "svc-b-route", "--type", "merge", "-p", back) is None:
            mesh.repoint_route("svc-b-route", "svc-b")  # no kubectl here: the same merge patch via the client
        failures = selection_failures(mesh, client, BACKENDS)
        assert failures == [], "\n".join(failures)
    finally:
        mesh.kube.custom.delete_namespaced_custom_object(
            "gateway.networking.k8s.io", "v1alpha2", "e2e", "udproutes", "svc-b-route"
        )


def test_a_service_without_ready_endpoints_goes_silent_and_comes_back(mesh: Mesh) -> None:
    client, vip = mesh.pods["client"], mesh.services["svc-c"]
    mesh.set_endpoints("svc-c", [])  # its only backend not ready any more
    try:
        mesh.kube.wait_meshnode("node-a", lambda o: udp_arms(o)[vip]["endpoints"] == [], what="svc-c with no endpoints")

        def unanswered() -> Answer | None:
            answer = who_answers(client.netns_path, vip, tries=1, timeout=0.3)
            return answer if answer.backend is None else None

        silent = wait_for(
            unanswered,
            30,
            "svc-c to go silent with no ready endpoints",
            interval=0,
        )
        # Envoy's path loses the datagram in Envoy (no endpoint); the kernel path drops it in the pod's own output
        # path, so the sender's send fails (EPERM)
        assert silent.refused == on_kernel(mesh), silent.show()
        others = {k: v for k, v in BACKENDS.items() if k != "svc-c"}
        assert selection_failures(mesh, client, others, timeout=0) == []  # the other Services are untouched
    finally:
        mesh.set_endpoints("svc-c", ["echo-c"])
    # On the kernel path an answer alone does not show the drop gone: the table's dispatch is a nat chain, which only
    # a flow's first datagram meets, so a probe whose source port a flow from before still holds in conntrack
    # (rewritten to echo-c) is answered while fresh flows are still dropped (EPERM): the next test's send. The
    # table rewriting the VIP to echo-c again is the sidecar's restore itself.
    wait_kernel_backends(mesh, client, vip, [f"{mesh.pods['echo-c'].ip}:{BACKEND_PORT}"])
    assert selection_failures(mesh, client, BACKENDS) == []


def test_kubectl_sees_both_meshnodes(mesh: Mesh) -> None:
    """The same objects through kubectl (when installed) and the client."""
    out = mesh.kubectl("get", "meshnodes", "-o", "json")
    if out is not None:
        names = {i["metadata"]["name"] for i in json.loads(out)["items"]}
    else:
        names = {n for n in mesh.nodes if mesh.kube.meshnode(n) is not None}
    assert names == {"node-a", "node-b"}


def test_udp_with_the_nodes_envoy_down(mesh: Mesh) -> None:
    """The kernel path needs no Envoy: with node-a's Envoy stopped, every VIP is still answered by its own backend,
    from VIP:18082. On Envoy's path the same datagrams are diverted to a capture listener that is gone: no reply
    (the control). Envoy started again, both answer."""
    node, client = mesh.nodes["node-a"], mesh.pods["client"]
    node.running_envoy().stop()
    try:
        failures = selection_failures(mesh, client, BACKENDS, timeout=0)
        if on_kernel(mesh):
            shares = {s: kernel_shares(client, mesh.services[s]) for s in BACKENDS}
            arms = udp_arms(mesh.kube.meshnode("node-a") or {})
            served = {s: arms.get(mesh.services[s]) for s in BACKENDS}
            assert failures == [], "\n".join(failures) + f"\nthe client's table: {shares}\nnode-a's arms: {served}"
        else:
            assert len(failures) == len(BACKENDS) and all("got no reply" in f for f in failures), failures
    finally:
        mesh.restart_envoy(node)
    assert selection_failures(mesh, client, BACKENDS) == []


def test_udp_across_a_sidecar_restart(mesh: Mesh) -> None:
    """With node-a's sidecar stopped, Envoy keeps what it was served and each pod's netns keeps its table: both
    paths answer. The new sidecar programs the same table again (same VIPs) and traffic keeps its path."""
    node, client = mesh.nodes["node-a"], mesh.pods["client"]
    vips = [mesh.services[s] for s in BACKENDS]
    held = kernel_vips(client)
    assert held >= set(vips) if on_kernel(mesh) else held == set(), held
    streams = node.stat(STREAMS)
    stop_sidecar(mesh, node)
    try:
        assert selection_failures(mesh, client, BACKENDS, timeout=0) == []
        assert kernel_vips(client) == held, "the table changed with no sidecar running"
    finally:
        start_sidecar(mesh, node, streams)
    mesh.programmed(node)
    assert kernel_vips(client) == held
    counted = PathCounters(client, vips)
    assert selection_failures(mesh, client, BACKENDS) == []
    counted.check(mesh)
