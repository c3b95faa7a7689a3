"""--udp-preserve-source across two nodes, through the whole mesh: a backend on the other node and one on the client's
node each see the client pod's own address, and the replies come back from the VIP, every size included. The return
path (aether.netns.node_return) is installed in both nodes' netns, as the DaemonSet's init container would.

Both UDP data paths (`aether.e2e.dataplane`): on Envoy the sidecars run `--udp-preserve-source`; on the in-kernel
path no flag is given, since the client's netns rewrites only the destination, so the same assertions hold with the
node's defaults (and the datagrams are counted by the client's table, never by Envoy)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial

import pytest

from aether.e2e.dataplane import UDP_DATAPLANES, PathCounters, wait_kernel_vips
from aether.e2e.harness import Mesh, MeshPod
from aether.netns import node_return
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.testing.udp_clients import exchange, socat_echo_argv, socat_peer_argv
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]


@pytest.fixture(scope="module", params=UDP_DATAPLANES)
def mesh(request: pytest.FixtureRequest) -> Iterator[Mesh]:
    kernel = request.param == "kernel"
    m = Mesh(namespace="e2e", sidecar_args=() if kernel else ("--udp-preserve-source",), udp_dataplane=request.param)
    try:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        for node in (a, b):
            node_return.install(node.net.path)
        m.start_node_proxies()
        m.add_pod(a, "client")
        m.add_backend(b, "far", socat_peer_argv)
        m.add_backend(a, "near", socat_peer_argv)
        m.add_backend(b, "echo", socat_echo_argv)
        for svc in ("far", "near", "echo"):
            m.add_service(svc, [svc])
        m.wait_arms(a, {vip: f"udp:e2e/{svc}" for svc, vip in m.services.items()})
        m.wait_listeners(a, 1)
        a.wait_hosts({f"udp:e2e/{svc}": {m.pods[svc].ip} for svc in m.services})
        wait_kernel_vips(m, [m.pods["client"]], m.services.values())
        yield m
    finally:
        m.close()


def _ask(client: MeshPod, vip: str, payload: bytes) -> tuple[bytes, tuple[str, int]] | None:
    return exchange(client.netns_path, vip, L4_OUTBOUND_PORT, payload)


def test_backends_on_both_nodes_see_the_client_pod(mesh: Mesh) -> None:
    client = mesh.pods["client"]
    counted = PathCounters(client, [mesh.services[svc] for svc in ("far", "near")])
    for svc in ("far", "near"):
        vip = mesh.services[svc]
        got = wait_for(partial(_ask, client, vip, b"who"), what=f"{svc} through the mesh")
        assert got == (f"{client.ip}\n".encode(), (vip, L4_OUTBOUND_PORT)), (svc, got, mesh.diagnostics())
    counted.check(mesh)


def test_every_size_across_nodes(mesh: Mesh) -> None:
    client, vip = mesh.pods["client"], mesh.services["echo"]
    counted = PathCounters(client, [vip])
    for size in (64, 1453, 9000, 65507):
        payload = os.urandom(size)
        got = _ask(client, vip, payload)
        assert got is not None and got[0] == payload, (
            f"{size} B across nodes with the source preserved",
            mesh.nodes["node-a"].hosts("udp:e2e/echo"),
            mesh.diagnostics(),
        )
    counted.check(mesh, want_datagrams=4)
