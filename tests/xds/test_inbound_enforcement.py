"""Inbound enforcement in the pod netns, real Envoy and real netns (the rig: `aether.testing.quic_mesh`): web-0 on
node B gets the CNI plugin's ruleset in each mode (`aether.netns.rules`, `inbound_in`).

- today's ruleset (PERMISSIVE, no inbound chain), the red case: from client-0 on node A, a plain GET to web-0's app
  port 8080 answers, and a hand-written XFCC reaches the app as the caller; a UDP datagram to 8080 is echoed;
- STRICT: both get no answer (dropped and counted), while the mesh still answers over HTTP/3 and h2 with the
  verified identity (a forged XFCC never reaches the app), and plaintext UDP through the mesh still delivers;
- PERMISSIVE again: the direct path answers.

How the kernel tells the node proxies apart, measured here on Envoy 1.40 and pinned by the per-source counters:
the inbound (18008) is bound inside the pod's netns and its hop to the app is a socket Envoy makes there too (the
app clusters' `upstream_bind_config` with the pod's netns), so it arrives over loopback and needs no mesh source (the
gateway counter does not move; with the gateway left out of the mesh sources h2 and HTTP/3 still answer: seen red
before, when that hop came from the gateway); node A's proxy reaches node B's pods from node A's address (udp_proxy's
upstream socket, not transparent); kubelet probes and the node's own plaintext deliveries come from the pod's
gateway 169.254.1.1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from aether.netns.contract import CaptureMode, InboundMode, InboundPolicy
from aether.netns.install import install_capture
from aether.testing.eastwest_lab import xfcc_uri
from aether.testing.netlab import GATEWAY_LL
from aether.testing.quic_mesh import CLIENT, NODE_A_IP, TWIN, VIP_UDP, Mesh, quic_mesh
from aether.testing.wait import wait_for
from aether.xds.identity.sds import secrets
from aether.xds.resources import CLUSTER

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

ADMIN = "spiffe://cluster.local/ns/kube-system/sa/admin"
FORGED = {"x-forwarded-client-cert": f"URI={ADMIN}"}

# From inside a pod: one plain TCP GET (with a forged XFCC) and one UDP datagram to ip:port, each waiting at most
# `wait` seconds for an answer; prints {"tcp": answer or error, "udp": answer or error}.
DIRECT = r"""
import json, socket, sys
ip, port, wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
out = {}
try:
    t = socket.create_connection((ip, port), timeout=wait)
    t.sendall(b"GET / HTTP/1.1\r\nHost: web\r\nx-forwarded-client-cert: URI=%s\r\nConnection: close\r\n\r\n"
              % sys.argv[4].encode())
    data = b""
    while True:
        chunk = t.recv(65536)
        if not chunk:
            break
        data += chunk
    out["tcp"] = data.decode(errors="replace")
except OSError as exc:
    out["tcp"] = "error " + type(exc).__name__
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(wait)
try:
    u.sendto(b"direct-probe", (ip, port))
    out["udp"] = u.recv(65536).decode(errors="replace")
except OSError as exc:
    out["udp"] = "error " + type(exc).__name__
print(json.dumps(out))
"""


def _direct(mesh: Mesh, wait: float = 2.0) -> dict[str, str]:
    """What a pod reaching web-0's app port straight (not through the mesh) gets back."""
    out = subprocess.run(
        ["ip", "netns", "exec", mesh.client.netns, sys.executable, "-c", DIRECT, mesh.web.ip, "8080", str(wait), ADMIN],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, str] = json.loads(out.stdout)
    return result


def _answers(direct: dict[str, str]) -> bool:
    return (
        " 200 " in direct["tcp"].split("\r\n", 1)[0] and direct["udp"] != "" and not direct["udp"].startswith("error")
    )


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with quic_mesh(tmp_path_factory.mktemp("enforce")) as m:
        m.enforce(InboundMode.PERMISSIVE)
        m.until_200(m.client)
        yield m


def _body_json(tcp_answer: str) -> dict[str, object]:
    body: dict[str, object] = json.loads(tcp_answer.split("\r\n\r\n", 1)[1])
    return body


def test_strict_closes_the_app_port_and_keeps_the_mesh(mesh: Mesh) -> None:
    # red: today's ruleset answers the direct path, and the app believes a forged XFCC
    mesh.enforce(InboundMode.PERMISSIVE)
    before = _direct(mesh)
    assert _answers(before), before
    assert xfcc_uri(json.dumps(_body_json(before["tcp"]))) == ADMIN

    mesh.enforce(InboundMode.STRICT)
    counters = mesh.inbound_counters()
    hits = mesh.app_hits()
    strict = _direct(mesh)
    assert strict == {"tcp": "error TimeoutError", "udp": "error TimeoutError"}, strict
    assert mesh.app_hits() == hits  # neither reached the app
    after = mesh.inbound_counters()
    assert after["drop tcp"] > counters["drop tcp"] and after["drop udp"] > counters["drop udp"], after

    # the mesh still answers, with the verified identity and never the forged one: HTTP/3 on the twin ...
    gateway = f"saddr {GATEWAY_LL}"
    for status, body in mesh.until_200(mesh.client) + mesh.get(mesh.client, n=2, headers=FORGED):
        assert (status, xfcc_uri(body)) == (200, CLIENT)
    # node B's proxy reaches the app from its own socket inside web-0's netns (over loopback), not from the gateway
    assert mesh.inbound_counters()[gateway] == after[gateway]
    assert any(line.startswith("HTTP/3 200") for line in mesh.access_b_flushed()[-3:])
    # ... and h2 with the twin absent
    try:
        mesh.serve_a(mesh.resources_a(quic=False))
        wait_for(lambda: TWIN not in mesh.a.admin("/clusters"), 30, "twins gone")
        for status, body in mesh.until_200(mesh.client) + mesh.get(mesh.client, n=2, headers=FORGED):
            assert (status, xfcc_uri(body)) == (200, CLIENT)
        assert any(line.startswith("HTTP/2 200") for line in mesh.access_b_flushed()[-3:])
    finally:
        mesh.serve_a()
        mesh.wait_applied(mesh.a, TWIN)


def fresh_app_connections(mesh: Mesh) -> None:
    """Node B's app clusters re-created (a changed connect timeout): the pooled connections to the app, which
    conntrack would let through as established whatever the ruleset, are closed, and the next request dials anew."""
    res = mesh.resources_b()
    ms = 1 + time.monotonic_ns() % 899
    stamp = f"1.{ms + (ms % 10 == 0):03d}s"  # three digits, the last not 0: config_dump prints it back as is
    for name, cluster in res[CLUSTER].items():
        if name.startswith("inbound:"):
            cluster["connectTimeout" if "connectTimeout" in cluster else "connect_timeout"] = stamp
    mesh.serve_b(res=res)
    wait_for(lambda: stamp in mesh.b.active_config("dynamic_active_clusters"), 30, "B's app clusters re-created")
    wait_for(lambda: mesh.b.stat_sum(r"^cluster\.inbound_.*\.upstream_cx_active$") == 0, 30, "the old pools closed")


def test_the_inbound_reaches_the_app_from_inside_the_pod(mesh: Mesh) -> None:
    """STRICT with node A's address as the only mesh source (no gateway): the mesh still answers over HTTP/3 and h2
    with the verified identity, because the inbound's hop to the app is Envoy's own socket in web-0's netns. Red
    before it was: that hop came from the gateway, which this STRICT drops (every request 503)."""
    install_capture(mesh.web.path, CaptureMode.TPROXY, inbound=InboundPolicy(InboundMode.STRICT, (NODE_A_IP,)))
    try:
        fresh_app_connections(mesh)
        got = mesh.get(mesh.client, n=3)
        assert [status for status, _ in got] == [200] * 3, got
        assert [xfcc_uri(body) for _, body in got] == [CLIENT] * 3
        assert any(line.startswith("HTTP/3 200") for line in mesh.access_b_flushed()[-3:])
        try:
            mesh.serve_a(mesh.resources_a(quic=False))
            wait_for(lambda: TWIN not in mesh.a.admin("/clusters"), 30, "twins gone")
            got = mesh.get(mesh.client, n=3)
            assert [status for status, _ in got] == [200] * 3, got
            assert [xfcc_uri(body) for _, body in got] == [CLIENT] * 3
            assert any(line.startswith("HTTP/2 200") for line in mesh.access_b_flushed()[-3:])
        finally:
            mesh.serve_a()
            mesh.wait_applied(mesh.a, TWIN)
    finally:
        mesh.enforce(InboundMode.STRICT)


def test_strict_still_delivers_plaintext_udp_through_the_mesh(mesh: Mesh) -> None:
    """Node A's udp_proxy delivers VIP_UDP:18082 to web-0:8080 from node A's address, a mesh source."""
    mesh.enforce(InboundMode.STRICT)
    node_a = f"saddr {NODE_A_IP}"
    try:
        mesh.ads.set("node-a", mesh.resources_a_with_udp(), secrets(mesh.ca, [CLIENT]))
        wait_for(lambda: "capture-udp:" in mesh.a.active_config("dynamic_listeners"), 30, "UDP capture listener")
        mesh.wait_synced(mesh.a)
        before, udp_hits = mesh.inbound_counters(), mesh.app_udp_hits()
        reply = _udp_via_mesh(mesh)
        assert reply.endswith("mesh-udp"), reply
        assert mesh.app_udp_hits() > udp_hits
        after = mesh.inbound_counters()
        assert after[node_a] > before[node_a], after
        assert after["drop udp"] == before["drop udp"]
    finally:
        mesh.serve_a()


def _udp_via_mesh(mesh: Mesh) -> str:
    code = (
        "import socket,sys\nu=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);u.settimeout(2)\n"
        "for _ in range(5):\n"
        "    u.sendto(b'mesh-udp',(sys.argv[1],18082))\n"
        "    try:\n        print(u.recv(65536).decode()); break\n    except TimeoutError:\n        pass\n"
        "else:\n    print('no reply')"
    )
    out = subprocess.run(
        ["ip", "netns", "exec", mesh.client.netns, sys.executable, "-c", code, VIP_UDP],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.strip()


def test_permissive_opens_the_direct_path_again(mesh: Mesh) -> None:
    mesh.enforce(InboundMode.STRICT)
    assert not _answers(_direct(mesh, wait=1.0))
    mesh.enforce(InboundMode.PERMISSIVE)
    again = _direct(mesh)
    assert _answers(again), again
    assert "drop tcp" not in mesh.inbound_counters()  # no inbound chain at all
