"""One Service on the in-kernel UDP path by its annotation, on nodes whose default is Envoy: `kubectl annotate service
... mesh.aether.dev/udp-dataplane=kernel` through the real API reaches the arm (`dataplane: kernel`), the client
pod's netns gets that VIP alone, and a real client (dig, against dnsmasq backends) is answered with Envoy's
udp_proxy session counter flat; the Service beside it stays on Envoy (its counter moves). A bad value is refused
alone: an `InvalidUdpDataplane` shape, the Service stays on Envoy. Backends run PERMISSIVE: a kernel-path datagram
comes from the client pod's own address (docs/limits.md)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from aether.e2e.dataplane import kernel_vips
from aether.e2e.harness import Mesh, MeshPod
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.operator.reconcile.views import UDP_DATAPLANE_ANNOTATION
from aether.testing.netlab import sh
from aether.testing.udp_clients import WHO_NAME, dnsmasq_argv, program
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

SESSIONS = "udp.udp_capture_e2e_client.downstream_sess_total"
ANSWERS = {"dns-kernel": "192.0.2.10", "dns-envoy": "192.0.2.20"}  # what each Service's dnsmasq answers


def dnsmasq_app(answer: str, work: Path, ip: str, port: int) -> list[str]:
    return dnsmasq_argv(ip, port, answer, work)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    work = tmp_path_factory.mktemp("dns")
    m = Mesh(namespace="e2e", inbound="permissive")  # the node's default path: envoy
    try:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        m.start_node_proxies()
        m.add_pod(a, "client")
        for svc, answer in ANSWERS.items():
            m.add_backend(b, f"{svc}-be", partial(dnsmasq_app, answer, work))
            m.add_service(svc, [f"{svc}-be"])
        m.kube.annotate_service(m.namespace, "dns-kernel", {UDP_DATAPLANE_ANNOTATION: "kernel"})
        yield m
    finally:
        m.close()


def shapes(mesh: Mesh) -> set[str]:
    """The reasons of every UDP shape the slices list."""
    return {
        s["reason"]
        for sl in mesh.kube.slices().values()
        for s in sl["spec"].get("udp", {}).get("unsupportedShapes", [])
    }


def dig(pod: MeshPod, vip: str) -> str:
    argv = [program("dig"), "+short", "+time=1", "+tries=1", "-p", str(L4_OUTBOUND_PORT), f"@{vip}", WHO_NAME, "A"]
    return sh(*argv, netns=pod.net.netns, check=False).strip()


def test_the_annotated_service_alone_goes_through_the_kernel(mesh: Mesh) -> None:
    client, node = mesh.pods["client"], mesh.nodes["node-a"]
    kernel, envoy = mesh.services["dns-kernel"], mesh.services["dns-envoy"]
    wait_for(lambda: kernel_vips(client) == {kernel}, 60, "the client's netns holding dns-kernel's VIP alone")
    wait_for(lambda: dig(client, envoy) == ANSWERS["dns-envoy"], 30, "dns-envoy answering through Envoy")
    sessions = node.stat(SESSIONS)
    for _ in range(3):
        assert dig(client, kernel) == ANSWERS["dns-kernel"], mesh.diagnostics()
    assert node.stat(SESSIONS) == sessions, "a datagram of the kernel Service reached the capture's Envoy"
    assert dig(client, envoy) == ANSWERS["dns-envoy"]
    assert node.stat(SESSIONS) > sessions  # the control: what goes through Envoy is counted there
    mesh.programmed(node)


def test_a_bad_value_is_refused_alone_and_the_service_goes_back_to_envoy(mesh: Mesh) -> None:
    client = mesh.pods["client"]
    kernel = mesh.services["dns-kernel"]
    mesh.kube.annotate_service(mesh.namespace, "dns-kernel", {UDP_DATAPLANE_ANNOTATION: "ebpf"})
    try:
        wait_for(lambda: "InvalidUdpDataplane" in shapes(mesh), 30, "an InvalidUdpDataplane shape in a slice")
        wait_for(lambda: kernel not in kernel_vips(client), 60, "dns-kernel's VIP gone from the client's table")
        assert dig(client, kernel) == ANSWERS["dns-kernel"]  # on Envoy again, not interrupted for long
    finally:
        mesh.kube.annotate_service(mesh.namespace, "dns-kernel", {UDP_DATAPLANE_ANNOTATION: "kernel"})
