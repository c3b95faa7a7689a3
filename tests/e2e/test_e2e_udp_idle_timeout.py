"""A Service's own UDP session idle timeout through the whole mesh (API test bed, operator, sidecars, real Envoy
per node, pods captured by the real aether-cni), same node and across nodes:

- `kubectl annotate service ... mesh.aether.dev/udp-idle-timeout=1s` reaches the arm (idleTimeoutSeconds) and a
  capture listener bound to that VIP in the client pod's netns; the Service's sessions expire after 1 s idle
  (Envoy's `idle_timeout` counter on that listener), for a backend on the client's node and one on another node;
- a third Service on the same pod and port keeps the default (60 s): its session stays open meanwhile;
- a bad value is refused alone: an `InvalidIdleTimeout` shape on the MeshNode, the arm served with the default.

Both UDP data paths (`aether.e2e.dataplane`). On the kernel path the Service's timeout is a conntrack timeout
(`ct timeout` object, 1 s) in the client pod's netns: the short Services' flows leave the conntrack table after 1 s
idle while the default Service's flow stays (the node's 60 s), Envoy's per-VIP listeners count no session, and the
same socket's next datagram is a new flow, answered from the VIP and counted by the table.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from functools import partial

import pytest

from aether.e2e.dataplane import UDP_DATAPLANES, kernel_packets, on_kernel, wait_kernel_vips
from aether.e2e.harness import Mesh
from aether.e2e.node_proxy import MeshNodeProxy
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.operator.reconcile.views import UDP_IDLE_TIMEOUT_ANNOTATION
from aether.testing import conntrack
from aether.testing.nodebed import ask, udp_socket_in, wait_reply
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

SHORT = ("short-near", "short-far")  # backends on node-a (the client's) and node-b


@pytest.fixture(scope="module", params=UDP_DATAPLANES)
def mesh(request: pytest.FixtureRequest) -> Iterator[Mesh]:
    m = Mesh(namespace="e2e", udp_dataplane=request.param)
    try:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        m.start_node_proxies()
        m.add_pod(a, "client")
        m.add_backend(a, "near")
        m.add_backend(b, "far")
        m.add_backend(b, "keep-be")
        m.add_service("short-near", ["near"])
        m.add_service("short-far", ["far"])
        m.add_service("keep", ["keep-be"])
        for svc in SHORT:
            m.kube.annotate_service(m.namespace, svc, {UDP_IDLE_TIMEOUT_ANNOTATION: "1s"})
        want = {m.services[s]: 1.0 for s in SHORT}
        m.kube.wait_meshnode(
            "node-a",
            lambda obj: all(
                {a["vip"]: a.get("idleTimeoutSeconds") for a in obj["status"]["udp"]["services"]}.get(v) == t
                for v, t in want.items()
            ),
            what="idleTimeoutSeconds on the short arms",
        )
        m.wait_listeners(a, 3)  # the client's wildcard listener and one per short VIP
        wait_kernel_vips(m, [m.pods["client"]], m.services.values())
        yield m
    finally:
        m.close()


def _at_least(node: MeshNodeProxy, stat: str, n: int) -> bool:
    return node.stat(stat) >= n


def _prefix(mesh: Mesh, svc: str | None) -> str:
    base = "udp.udp_capture_e2e_client"
    return base if svc is None else f"{base}_{mesh.services[svc].replace('.', '_')}"


def test_short_services_expire_same_node_and_across_nodes_while_the_default_holds(mesh: Mesh) -> None:
    client, node = mesh.pods["client"], mesh.nodes["node-a"]
    socks: dict[str, socket.socket] = {s: udp_socket_in(client.netns_path) for s in (*SHORT, "keep")}
    try:
        backend = {"short-near": b"near", "short-far": b"far", "keep": b"keep-be"}
        for svc, sock in socks.items():
            wait_reply(sock, mesh.services[svc], backend[svc], timeout=60)
        if on_kernel(mesh):
            _kernel_expiry(mesh, socks, backend)
            return
        stats = node.running_envoy().stats("udp.")
        totals = {s: stats[f"{_prefix(mesh, s)}.downstream_sess_total"] for s in SHORT}
        assert all(t >= 1 for t in totals.values()), stats
        assert stats[f"{_prefix(mesh, None)}.downstream_sess_total"] >= 1, stats  # keep: on the wildcard listener
        for svc in SHORT:
            name, total = f"{_prefix(mesh, svc)}.idle_timeout", totals[svc]
            wait_for(partial(_at_least, node, name, total), timeout=15, what=f"{svc} idle expiry")
        stats = node.running_envoy().stats("udp.")
        for svc in SHORT:
            assert stats[f"{_prefix(mesh, svc)}.downstream_sess_active"] == 0, stats
        assert stats[f"{_prefix(mesh, None)}.downstream_sess_active"] >= 1, stats  # the default: still open
        assert stats[f"{_prefix(mesh, None)}.idle_timeout"] == 0, stats
        for svc in SHORT:  # the same socket again: a new session, answered from the VIP
            got = ask(socks[svc], mesh.services[svc])
            assert got is not None and got[0].startswith(backend[svc]), svc
            assert got[1] == (mesh.services[svc], L4_OUTBOUND_PORT)
            assert node.stat(f"{_prefix(mesh, svc)}.downstream_sess_total") == totals[svc] + 1
    finally:
        for sock in socks.values():
            sock.close()


def _flow(mesh: Mesh, sock: socket.socket, svc: str) -> conntrack.CtEntry | None:
    """The client netns's conntrack entry of the flow from `sock` to the Service's VIP:18082."""
    port, vip = sock.getsockname()[1], mesh.services[svc]
    got = [e for e in conntrack.entries(mesh.pods["client"].net.netns) if (e.sport, e.dst) == (port, vip)]
    return got[0] if got else None


def _gone(mesh: Mesh, sock: socket.socket, svc: str) -> bool:
    return _flow(mesh, sock, svc) is None


def _answered_and_tracked(mesh: Mesh, sock: socket.socket, svc: str, want: bytes) -> bool:
    """One more request on `sock`, then its flow read at once: a 1 s flow may already have idled out while the
    other Services' first replies were awaited, so its presence is only meaningful right after a datagram."""
    got = ask(sock, mesh.services[svc])
    return got is not None and got[0].startswith(want) and _flow(mesh, sock, svc) is not None


def _kernel_expiry(mesh: Mesh, socks: dict[str, socket.socket], backend: dict[str, bytes]) -> None:
    client, node = mesh.pods["client"], mesh.nodes["node-a"]
    assert _flow(mesh, socks["keep"], "keep") is not None
    for svc in SHORT:
        tracked = partial(_answered_and_tracked, mesh, socks[svc], svc, backend[svc])
        wait_for(tracked, 15, f"{svc}'s flow in the client's conntrack table right after a reply")
    for svc in SHORT:
        gone = partial(_gone, mesh, socks[svc], svc)
        wait_for(gone, 15, f"{svc}'s flow to idle out of conntrack")
    keep = _flow(mesh, socks["keep"], "keep")
    assert keep is not None and keep.timeout > 5, keep  # the node's default (60 s) holds it
    stats = node.running_envoy().stats("udp.")
    assert all(stats.get(f"{_prefix(mesh, s)}.downstream_sess_total", 0) == 0 for s in SHORT), stats
    for svc in SHORT:  # the same socket again: a new flow, answered from the VIP, counted by the table
        before = kernel_packets(client, mesh.services[svc])
        got = ask(socks[svc], mesh.services[svc])
        assert got is not None and got[0].startswith(backend[svc]), svc
        assert got[1] == (mesh.services[svc], L4_OUTBOUND_PORT)
        assert _flow(mesh, socks[svc], svc) is not None and kernel_packets(client, mesh.services[svc]) == before + 1


def test_a_bad_value_is_refused_alone_and_the_service_keeps_the_default(mesh: Mesh) -> None:
    vip = mesh.services["keep"]
    mesh.kube.annotate_service(mesh.namespace, "keep", {UDP_IDLE_TIMEOUT_ANNOTATION: "soon"})
    obj = mesh.kube.wait_meshnode(
        "node-a",
        lambda o: any(s["reason"] == "InvalidIdleTimeout" for s in o["status"]["udp"].get("unsupportedShapes") or []),
        what="InvalidIdleTimeout shape",
    )
    (shape,) = [s for s in obj["status"]["udp"]["unsupportedShapes"] if s["reason"] == "InvalidIdleTimeout"]
    assert shape["route"] == "e2e/keep" and "'soon' is not a duration" in shape["message"]
    arm = {a["vip"]: a for a in obj["status"]["udp"]["services"]}[vip]
    assert "idleTimeoutSeconds" not in arm and arm["endpoints"]
    sock = udp_socket_in(mesh.pods["client"].netns_path)
    try:
        wait_reply(sock, vip, b"keep-be")
    finally:
        sock.close()
    mesh.kube.annotate_service(mesh.namespace, "keep", {UDP_IDLE_TIMEOUT_ANNOTATION: None})
