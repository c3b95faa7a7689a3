"""STRICT admits only what the node proxies deliver, not what a pod sends in their name (issue 22, item 2), through the
whole mesh: the operator, sidecars and Envoys on two nodes, pods captured by the real aether-cni (STRICT, mesh sources
the gateway and the node links 10.250.0.0/16), the node's mesh-source guard as the harness installs it on every node
(`e2e/cni_runtime.guard_node`, what the DaemonSet's install-cni does), and the anti-spoofing of the lab's pod network
off (`rp_filter=0` on node-a and its veths).

target (a UDP echo counting every datagram its app gets) runs on node-a behind Service `echo`; client-b (meshed) on
node-b; rogue, on node-a, is a pod the mesh never saw (no aether-cni ADD: nothing in its own netns stops it) with a
raw socket (CAP_NET_RAW, which container runtimes grant by default).

- the legitimate path: client-b's datagram to echo's VIP reaches target through node-b's proxy (from node-b's address,
  a mesh source) and is answered from the VIP;
- rogue's datagram to target's app port from node-b's address, and from an address of the prefix no node holds, is
  dropped on node-a where it enters (counted by node-a's guard) and never reaches target's app or its STRICT's
  mesh-source accept.

Seen red with the harness's guard left out (cni_runtime.guard_node a no-op): target's app got the spoofed datagrams.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aether.e2e.harness import BACKEND_PORT, Mesh
from aether.netns import node_guard
from aether.testing.netlab import Pod, sh
from aether.testing.probe import wait_answer
from aether.testing.spoofing import counter, raw_send
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

NS = "spoof"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mesh, Pod, Path]]:
    hits = tmp_path_factory.mktemp("spoof") / "target-hits"
    hits.touch()
    m = Mesh(namespace=NS, areas="udp")
    try:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        m.start_node_proxies()
        echo = [sys.executable, "-m", "aether.testing.udp_echo", "target"]
        m.add_backend(a, "target", app=lambda ip, port: [*echo, str(port), "--hits", str(hits)])
        m.add_pod(b, "client-b")
        m.add_service("echo", ["target"])
        m.wait_arms(b, {m.services["echo"]: f"udp:{NS}/echo"})
        rogue = m.lab.add_pod(a.net, "rogue", "10.200.1.250")  # no aether-cni ADD: not meshed
        for conf in ("all", "default", rogue.host_if, m.pods["target"].net.host_if):
            sh("sysctl", "-qw", f"net.ipv4.conf.{conf}.rp_filter=0", netns=a.net.netns)
        yield m, rogue, hits
    finally:
        m.close()


def app_hits(hits: Path) -> int:
    return len(hits.read_text().splitlines())


def guard_drops(mesh: Mesh) -> int:
    text = sh("nft", "list", "table", "inet", node_guard.GUARD_TABLE, netns=mesh.nodes["node-a"].net.netns, check=False)
    return sum(int(ln.split("packets")[1].split()[0]) for ln in text.splitlines() if "packets" in ln)


def test_the_proxys_cross_node_path_still_delivers(world: tuple[Mesh, Pod, Path]) -> None:
    mesh, _, hits = world
    before = app_hits(hits)
    got = wait_answer(mesh.pods["client-b"].netns_path, mesh.services["echo"], "target")
    assert got.backend == "target" and got.from_vip, got.show()
    assert app_hits(hits) > before


def test_a_pod_sending_as_a_node_never_reaches_the_app(world: tuple[Mesh, Pod, Path]) -> None:
    mesh, rogue, hits = world
    target = mesh.pods["target"].net
    node_b = mesh.nodes["node-b"].net.ip
    assert node_b is not None and node_b.startswith("10.250.")
    hits_before, drops_before = app_hits(hits), guard_drops(mesh)
    accepted_before = counter(target, "inbound_in", "10.250.0.0/16")
    for src in (node_b, "10.250.77.7"):
        subprocess.run(raw_send(rogue, src, target.ip, BACKEND_PORT, "udp"), check=True, timeout=30)

    def settled() -> bool:
        return guard_drops(mesh) >= drops_before + 2 or app_hits(hits) >= hits_before + 2

    wait_for(settled, 10, "both datagrams dropped by node-a's guard, or delivered")
    assert app_hits(hits) == hits_before, f"target's app got {hits.read_text()!r}"  # red without the guard
    assert counter(target, "inbound_in", "10.250.0.0/16") == accepted_before
    assert guard_drops(mesh) == drops_before + 2
