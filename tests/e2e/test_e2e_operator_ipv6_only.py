"""An IPv6-only mesh through the operator on two nodes (issue 27): the real control plane with the IPv6 service
CIDR alone, IPv6-only pods and Services, `aether operator` writing the MeshNodes, the real sidecars and Envoys, pods
captured by the real aether-cni, and IPv6 between the nodes.

A client pod on node-a reaches each Service's IPv6 VIP and gets its own backend on node-b (per-service selection by
VIP), and STRICT on the backends drops the client's plaintext datagram to a backend's own IPv6 address while the
same datagram from node-a (a mesh source) is answered; two client pods with their own ServiceAccounts call an HTTP Service on node-b east-west (HTTP/3 twins over
IPv6) and each arrives with its own SPIFFE ID.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from aether.api.naming import in_family, mesh_host, quic_twin, spiffe_id
from aether.e2e.harness import BACKEND_PORT, Mesh
from aether.testing.probe import HttpAnswer, ask, pod_socket, wait_answer, wait_http

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

NS = "e2e-v6"
BACKENDS = {"svc-a": "echo-a", "svc-b": "echo-b"}
CLIENTS = {"client-a": "alpha", "client-b": "beta"}  # pod -> ServiceAccount


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    m = Mesh(namespace=NS, ip_family="ipv6", control_plane="real", areas="udp,tcp-floor,eastwest", shared_ca=True)
    try:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        m.start_node_proxies()
        for pod, sa in CLIENTS.items():
            m.add_pod(a, pod, sa=sa)
        for svc, pod in BACKENDS.items():
            m.add_backend(b, pod)
            m.add_service(svc, [pod])
        m.add_http_backend(b, "web-0", sa="web")
        m.add_http_service("web", ["web-0"])
        m.wait_arms(a, {m.services[s]: in_family(f"udp:{NS}/{s}", "IPv6") for s in BACKENDS})
        m.programmed(a)
        m.programmed(b)
        yield m
    finally:
        m.close()


def test_each_ipv6_vip_selects_its_own_backend_across_nodes(mesh: Mesh) -> None:
    client = mesh.pods["client-a"]
    assert ":" in client.ip and client.net.ip6 == client.ip  # an IPv6-only pod
    for svc, backend in BACKENDS.items():
        got = wait_answer(client.netns_path, mesh.services[svc], backend)
        assert got.backend == backend and got.from_vip, (svc, got, mesh.diagnostics())


def test_each_source_arrives_with_its_own_spiffe_id_over_http3_across_nodes(mesh: Mesh) -> None:
    node_a = mesh.nodes["node-a"]
    for pod, sa in CLIENTS.items():
        got = wait_http(mesh.pods[pod].netns_path, mesh_host(NS, "web"))
        assert got == HttpAnswer(200, "web-0", spiffe_id(NS, sa)), f"{pod}: {got}\n{mesh.diagnostics()}"
        twin = quic_twin(NS, "web", sa)
        assert node_a.hosts(twin) == {mesh.pods["web-0"].ip}  # the twin dials web-0's IPv6 address
        assert node_a.stat(f"cluster.{twin.replace(':', '_')}.upstream_cx_http3_total") >= 1
    # node-b terminated them as HTTP/3 on web-0's inbound QUIC listener, on its IPv6 address
    stats = mesh.nodes["node-b"].running_envoy().stats("inbound_http3.downstream_rq_2xx$")
    assert sum(stats.values()) >= len(CLIENTS), stats


def _direct(netns_path: str, ip: str) -> str | None:
    """One datagram from `netns_path` to ip:BACKEND_PORT (around the mesh); the backend that answered, or None."""
    sock = pod_socket(netns_path, 0.5, socket.AF_INET6)
    try:
        return ask(sock, ip, b"direct", BACKEND_PORT).backend
    finally:
        sock.close()


def test_strict_drops_a_plaintext_ipv6_call_and_admits_the_node_across_nodes(mesh: Mesh) -> None:
    backend = mesh.pods["echo-a"]
    wait_answer(mesh.pods["client-a"].netns_path, mesh.services["svc-a"], "echo-a")  # the mesh path works
    assert [_direct(mesh.pods["client-a"].netns_path, backend.ip) for _ in range(3)] == [None] * 3
    # the control: node-a's datagram (from its link address, a mesh source) reaches the same port
    assert _direct(mesh.nodes["node-a"].net.path, backend.ip) == "echo-a"
