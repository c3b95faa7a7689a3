"""The in-kernel UDP path through the whole mesh: the real control plane and operator, each node's sidecar started
with `--udp-dataplane kernel` programming the client pod's real netns from its CNI record, real Envoys beside them.
A real client (socat, a connected UDP socket: it takes replies only from VIP:18082) reaches the backend on the
other node and on its own, while the capture's Envoy never sees the datagram (its udp_proxy session counters stay
where they were) and the table's named counters count it. A Service annotated `mesh.aether.dev/udp-dataplane:
envoy` stays on Envoy (the control that the Envoy counters are not vacuous); annotating it `kernel` moves it,
taking it back shrinks the table. The sidecar exports the counters on /metrics and Programmed is True. The rules
outlive a stopped sidecar, and the next one adopts them.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from collections.abc import Set as AbstractSet

import pytest

from aether.e2e.dataplane import kernel_packets, kernel_vips
from aether.e2e.harness import Mesh, MeshPod
from aether.e2e.lifecycle import STREAMS, restart_sidecar, start_sidecar, stop_sidecar
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.operator.reconcile.views import UDP_DATAPLANE_ANNOTATION
from aether.testing.netlab import sh
from aether.testing.promtext import scrape, value
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

SESSIONS = "udp.udp_capture_e2e_client.downstream_sess_total"  # the client's capture listener (udp_proxy)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


METRICS_PORT = free_port()  # node-a's sidecar's --metrics, in the harness's netns, on loopback


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    m = Mesh(namespace="e2e", udp_dataplane="kernel")
    try:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        m.start_node_proxies()
        m.sidecar_args = ("--metrics", f"127.0.0.1:{METRICS_PORT}")  # node-a's only: a restart with it
        restart_sidecar(m, a)
        m.sidecar_args = ()
        m.add_pod(a, "client")
        m.add_backend(b, "far")
        m.add_backend(a, "near")
        m.add_backend(b, "env")
        for svc, backend in (("svc-far", "far"), ("svc-near", "near"), ("svc-env", "env")):
            m.add_service(svc, [backend])
        m.kube.annotate_service(m.namespace, "svc-env", {UDP_DATAPLANE_ANNOTATION: "envoy"})
        env = m.services["svc-env"]
        m.kube.wait_meshnode(
            "node-a",
            lambda o: any(s["vip"] == env and s.get("dataplane") == "envoy" for s in o["status"]["udp"]["services"]),
            what="svc-env's arm with dataplane envoy",
        )
        yield m
    finally:
        m.close()


def socat(pod: MeshPod, vip: str, payload: str) -> str:
    """One datagram from a connected socat socket in the pod, its reply (empty: none within 2 s)."""
    argv = ["socat", "-T", "2", "-", f"UDP4:{vip}:{L4_OUTBOUND_PORT}"]
    return sh(*argv, netns=pod.net.netns, input=payload, check=False).strip()


def wait_programmed(mesh: Mesh, want: AbstractSet[str], absent: AbstractSet[str] = frozenset()) -> None:
    client = mesh.pods["client"]
    wait_for(
        lambda: want <= kernel_vips(client) and not absent & kernel_vips(client),
        60,
        f"the client's netns holding {sorted(want)} and not {sorted(absent)}",
        diagnose=mesh.diagnostics,
    )


def test_kernel_services_are_answered_with_no_datagram_through_envoy(mesh: Mesh) -> None:
    client, node = mesh.pods["client"], mesh.nodes["node-a"]
    far, near, env = (mesh.services[s] for s in ("svc-far", "svc-near", "svc-env"))
    wait_programmed(mesh, {far, near}, {env})
    assert SESSIONS in node.running_envoy().stats("udp."), "the capture listener's counter must exist"
    sessions, counted = node.stat(SESSIONS), {v: kernel_packets(client, v) for v in (far, near)}
    for i in range(5):
        assert socat(client, far, f"hello-{i}") == f"far|hello-{i}", mesh.diagnostics()
        assert socat(client, near, f"hi-{i}") == f"near|hi-{i}", mesh.diagnostics()
    assert node.stat(SESSIONS) == sessions, "a kernel Service's datagram reached the capture's Envoy"
    assert {v: kernel_packets(client, v) - counted[v] for v in (far, near)} == {far: 5, near: 5}
    backend = f"{mesh.pods['far'].ip}:5353"

    def counted_on_metrics() -> bool:  # the collector's next sweep (every 15 s) carries them
        got = scrape(f"http://127.0.0.1:{METRICS_PORT}/metrics")
        far_labels = {"service": "e2e/svc-far", "backend": backend}
        return (
            value(got, "aether_kernel_udp_service_packets_total", service="e2e/svc-far") >= 5
            and value(got, "aether_kernel_udp_backend_packets_total", **far_labels) >= 5
        )

    wait_for(counted_on_metrics, 45, "aether_kernel_udp_* counting svc-far on the sidecar's /metrics")
    mesh.programmed(node)  # waits for Programmed=True: no pod netns failed


def test_a_service_annotated_envoy_goes_through_envoy_then_moves_to_the_kernel_and_back(mesh: Mesh) -> None:
    client, node = mesh.pods["client"], mesh.nodes["node-a"]
    env = mesh.services["svc-env"]
    sessions = node.stat(SESSIONS)
    wait_for(lambda: socat(client, env, "via-envoy") == "env|via-envoy", 30, "svc-env answering through Envoy")
    assert node.stat(SESSIONS) > sessions  # the control: Envoy's counter counts what goes through it
    mesh.kube.annotate_service(mesh.namespace, "svc-env", {UDP_DATAPLANE_ANNOTATION: None})  # the node's: kernel
    try:
        wait_programmed(mesh, {env})
        before, sessions = kernel_packets(client, env), node.stat(SESSIONS)
        assert socat(client, env, "via-kernel") == "env|via-kernel"
        assert node.stat(SESSIONS) == sessions and kernel_packets(client, env) == before + 1
    finally:
        mesh.kube.annotate_service(mesh.namespace, "svc-env", {UDP_DATAPLANE_ANNOTATION: "envoy"})
    wait_programmed(mesh, {mesh.services["svc-far"]}, {env})  # the table shrank: svc-env is Envoy's again
    assert socat(client, env, "again") == "env|again"


def test_the_rules_outlive_the_sidecar_and_a_new_one_adopts_them(mesh: Mesh) -> None:
    """The kernel path needs no process on the data path: with node-a's sidecar stopped the client still reaches
    svc-far; the new sidecar replaces the table in one transaction (no gap) and Programmed comes back True."""
    client, node = mesh.pods["client"], mesh.nodes["node-a"]
    far = mesh.services["svc-far"]
    wait_programmed(mesh, {far})
    streams = node.stat(STREAMS)
    stop_sidecar(mesh, node)
    try:
        assert socat(client, far, "sidecar-down") == "far|sidecar-down"
        assert far in kernel_vips(client)
    finally:
        start_sidecar(mesh, node, streams)
    wait_for(lambda: "holds" in (node.workdir / "sidecar.log").read_text().rsplit("ADS on", 1)[-1], 30, "an apply")
    assert far in kernel_vips(client) and socat(client, far, "adopted") == "far|adopted"
    mesh.programmed(node)
