"""A dual-stack mesh through the operator on two nodes (issue 27): the real control plane with both service CIDRs,
`aether operator` writing the MeshNodes, the real sidecars and Envoys, pods captured by the real aether-cni, and
IPv6 between the nodes (the harness's node links carry a ULA /126 each, e2e/addresses.py).

One client pod on node-a; the backends on node-b. Each dual-stack Service answers on both of its VIPs from its own
backend; a weighted UDPRoute (70/30) on a dual-stack parent holds on each family's VIP; the TCP floor answers on
an IPv6 VIP. The red control, last: node-a's IPv6 address on the link removed, the IPv6 VIP gets no answer while
the IPv4 one still does.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest

from aether.api.naming import in_family, udp_split_cluster
from aether.e2e.harness import BACKEND_PORT, Mesh
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.netns.nsthread import run_in_netns
from aether.testing.netlab import sh
from aether.testing.probe import wait_answer, who_answers
from aether.testing.split_probe import NO_REPLY, probe_split
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

NS = "e2e-ds"
BACKENDS = {"svc-a": "echo-a", "svc-b": "echo-b"}
WEIGHTS = {"svc-a": 70, "svc-b": 30}
PROBES = 200  # per family: 70% +- 15 points is more than 4.5 standard deviations (3.2 points) either way


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    m = Mesh(namespace=NS, ip_family="dual", control_plane="real")
    try:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        m.start_node_proxies()
        m.add_pod(a, "client")
        for svc, pod in BACKENDS.items():
            m.add_backend(b, pod)
            m.add_service(svc, [pod])
        tcp = m.add_pod(b, "tcp-0")
        m.run_app(tcp, ["socat", f"TCP6-LISTEN:{BACKEND_PORT},fork,reuseaddr", "SYSTEM:echo tcp-0"])
        m.add_service("floor", ["tcp-0"], protocol="TCP")
        m.add_service("front", ["echo-a"])
        m.weighted_route("split", "front", WEIGHTS)
        split = udp_split_cluster(NS, "front")
        want = {m.services["front"]: split, m.services6["front"]: in_family(split, "IPv6")}
        for svc in BACKENDS:
            want |= {m.services[svc]: f"udp:{NS}/{svc}", m.services6[svc]: in_family(f"udp:{NS}/{svc}", "IPv6")}
        m.wait_arms(a, want)
        yield m
    finally:
        m.close()


def test_each_service_answers_on_both_vips_from_its_backend_across_nodes(mesh: Mesh) -> None:
    client = mesh.pods["client"].netns_path
    for svc, backend in BACKENDS.items():
        for vip in (mesh.services[svc], mesh.services6[svc]):
            got = wait_answer(client, vip, backend)
            assert got.backend == backend and got.from_vip, (vip, got, mesh.diagnostics())


def test_the_weighted_route_holds_per_family(mesh: Mesh) -> None:
    client = mesh.pods["client"].netns_path
    for vip in (mesh.services["front"], mesh.services6["front"]):
        wait_answer(client, vip, "echo-a")
        split = probe_split(client, vip, L4_OUTBOUND_PORT, PROBES)
        print(f"\n{vip}: 70/30, {PROBES} fresh sessions\n{split.table()}")
        assert split.by_backend[NO_REPLY] == 0, split.table()
        assert abs(split.share("echo-a") - 70) <= 15 and abs(split.share("echo-b") - 30) <= 15, split.table()


def _tcp_call(netns: str, vip: str) -> bytes:
    def call() -> bytes:
        with socket.create_connection((vip, L4_OUTBOUND_PORT), timeout=3) as s:
            return s.recv(64)

    with contextlib.suppress(OSError):
        return run_in_netns(netns, call)
    return b""


def test_the_tcp_floor_on_the_ipv6_vip(mesh: Mesh) -> None:
    client = mesh.pods["client"].netns_path
    vip6 = mesh.services6["floor"]
    wait_for(lambda: _tcp_call(client, vip6) == b"tcp-0\n", 30, what=f"tcp-0 over {vip6}:{L4_OUTBOUND_PORT}")


def test_red_control_without_the_links_ipv6_address_the_ipv6_vip_is_silent(mesh: Mesh) -> None:
    """Last (it breaks the mesh's IPv6): what the harness did before its node links carried IPv6."""
    client, node_a = mesh.pods["client"].netns_path, mesh.nodes["node-a"].net
    assert node_a.ip6 is not None
    out = sh("ip", "-6", "-o", "addr", "show", "to", f"{node_a.ip6}/128", netns=node_a.netns)
    sh("ip", "-6", "addr", "del", f"{node_a.ip6}/126", "dev", out.split()[1], netns=node_a.netns)
    assert who_answers(client, mesh.services6["svc-a"], tries=5).backend is None
    assert who_answers(client, mesh.services["svc-a"]).backend == "echo-a"
