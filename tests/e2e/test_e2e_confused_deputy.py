"""No confused deputy on the node (issue 22, item 1): a pod's outbound HTTP listener (18080, bound in the pod's netns
by the node's Envoy, stamping the pod's SPIFFE ID on everything it forwards) takes only that pod's own traffic. The
whole mesh (operator, cluster-mode sidecars, Envoys on two nodes, STRICT inbound through the real aether-cni): client-a
(ServiceAccount alpha) on node-a, web-0 on node-b, a policy allowing alpha only.

- the control: client-a's own request answers 200 with alpha's SPIFFE ID;
- `GET http://<client-a's IP>:18080/` with `Host: web...` from node-a's netns (any hostNetwork process) and from
  node-b's (another node, whose address is a mesh source): refused with Envoy's 403 (nothing forwarded, no
  identity stamped), counted on node-a (`http.http_outbound_foreign_source.rbac.denied`) and logged (one JSON line
  `aether-outbound-refused` naming the pod, the peer and why).

Seen red on main: both calls answered 200 as spiffe://cluster.local/ns/deputy/sa/alpha.

The capture's L4 listeners (TCP and UDP 18082, issue 22 item 1's rest) take only the pod's own diverted traffic
too: a SYN or a datagram from node-a's or node-b's netns to `<client-a's IP>:18082` is dropped in client-a's netns
(chain `capture_in` of `inet aether`: anything to 18082 arriving on another interface than loopback), counted there,
and never reaches node-a's Envoy; client-a's own connection and datagram to a VIP still go through (the controls).
Seen red on main: the SYN was answered (Envoy's listener accepted, then closed the connection) and the datagram
reached client-a's UDP capture listener.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from aether.api.naming import mesh_host, spiffe_id
from aether.e2e.harness import Mesh
from aether.netns.nsthread import run_in_netns
from aether.testing.probe import HttpAnswer, http_get, wait_answer, wait_http
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

NS = "deputy"
HOST = mesh_host(NS, "web")
ALPHA = spiffe_id(NS, "alpha")
REFUSED = "http.http_outbound_foreign_source.rbac.denied"


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    m = Mesh(namespace=NS, areas="udp,tcp-floor,eastwest", shared_ca=True)
    try:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        m.start_node_proxies()
        m.add_pod(a, "client-a", sa="alpha")
        m.add_http_backend(b, "web-0", sa="web")
        m.add_http_service("web", ["web-0"])
        m.add_backend(b, "echo-0")
        m.add_service("echo", ["echo-0"])
        m.programmed(a)
        m.programmed(b)
        m.kube.authorization_policy(NS, "web-callers", "web", [ALPHA])
        got = wait_http(m.pods["client-a"].netns_path, HOST)
        assert (got.status, got.spiffe_id) == (200, ALPHA), m.diagnostics()
        assert wait_answer(m.pods["client-a"].netns_path, m.services["echo"], "echo-0").backend == "echo-0"
        yield m
    finally:
        m.close()


def refused_lines(mesh: Mesh) -> list[dict[str, Any]]:
    log = mesh.nodes["node-a"].envoy
    assert log is not None
    text = log.log_path.read_text(errors="replace")
    return [json.loads(ln) for ln in text.splitlines() if ln.startswith("{") and '"aether-outbound-refused"' in ln]


@pytest.mark.parametrize("caller", ["node-a", "node-b"])
def test_the_pods_outbound_listener_refuses_a_caller_from_outside_the_pod(mesh: Mesh, caller: str) -> None:
    client = mesh.pods["client-a"]
    envoy = mesh.nodes["node-a"].envoy
    assert envoy is not None
    before, lines = envoy.stat(REFUSED), len(refused_lines(mesh))
    got: HttpAnswer = http_get(mesh.nodes[caller].net.path, HOST, ip=client.ip)
    assert (got.status, got.spiffe_id) == (403, None), f"{caller} called as {got.spiffe_id}: {got}"
    assert wait_http(client.netns_path, HOST).status == 200  # the pod itself still goes through
    wait_for(
        lambda: envoy.stat(REFUSED) == before + 1,
        10,
        f"{REFUSED} counted",
        diagnose=lambda: f"{envoy.stats('rbac|foreign|no_filter_chain')}\n{envoy.log_tail(2000)}",
    )

    def line() -> dict[str, Any] | None:
        found = refused_lines(mesh)[lines:]
        return found[-1] if found else None

    got_line = wait_for(line, 10, "the refusal's line in node-a's Envoy stdout")
    assert got_line["pod"] == f"{NS}/client-a", got_line
    assert got_line["local"] == f"{client.ip}:18080", got_line
    assert not got_line["peer"].startswith(client.ip + ":"), got_line
    assert (got_line["status"], got_line["authority"]) == (403, HOST), got_line
    assert got_line["responseCodeDetails"] == "rbac_access_denied_matched_policy[aether:not-this-pods-traffic]"


@pytest.mark.parametrize("caller", ["node-a", "node-b"])
def test_the_raw_tcp_floor_is_no_deputy_either(mesh: Mesh, caller: str) -> None:
    """A caller dialling the pod's own IP on the raw TCP floor (18082) gets no answer (its SYN is dropped by the
    pod's `capture_in`; before, the listener's chains, matched by destination VIP, matched none and Envoy closed the
    connection), while the pod's own connection to the VIP reaches web-0 (the control)."""
    client = mesh.pods["client-a"]
    vip = mesh.services["web"]
    assert http_get(client.netns_path, HOST, port=18082, ip=vip).status == 200
    got = http_get(mesh.nodes[caller].net.path, HOST, port=18082, ip=client.ip)
    assert got.status is None, got


def capture_in(pod_netns: str, proto: str) -> int:
    """Packets counted by the pod's `capture_in` rule for `proto` dport 18082 (0 when there is none)."""
    out = subprocess.run(
        ["nsenter", f"--net={pod_netns}", "nft", "list", "chain", "inet", "aether", "capture_in"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    lines = [ln for ln in out.splitlines() if f"{proto} dport 18082" in ln and "packets" in ln]
    return sum(int(ln.split("packets")[1].split()[0]) for ln in lines)


def dial(netns: str, ip: str, port: int) -> str:
    """A TCP connect from `netns`: "answered" (SYN-ACK), "reset" or "no answer" within 2 s."""

    def go() -> str:
        try:
            socket.create_connection((ip, port), timeout=2).close()
        except ConnectionRefusedError:
            return "reset"
        except TimeoutError:
            return "no answer"
        return "answered"

    return run_in_netns(netns, go)


@pytest.mark.parametrize("caller", ["node-a", "node-b"])
def test_the_capture_listeners_take_only_the_pods_own_traffic(mesh: Mesh, caller: str) -> None:
    client = mesh.pods["client-a"]
    envoy = mesh.nodes["node-a"].envoy
    assert envoy is not None
    own = "udp_capture_deputy_client-a"
    tcp_before, udp_before, seen = (
        capture_in(client.netns_path, "tcp"),
        capture_in(client.netns_path, "udp"),
        envoy.stats(own),
    )
    where = mesh.nodes[caller].net.path
    assert dial(where, client.ip, 18082) == "no answer"  # red on main: "answered"

    def send() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.sendto(b"from " + caller.encode(), (client.ip, 18082))

    run_in_netns(where, send)
    wait_for(lambda: capture_in(client.netns_path, "udp") == udp_before + 1, 10, "the datagram counted in capture_in")
    assert capture_in(client.netns_path, "tcp") > tcp_before  # the SYN (and its retransmits) counted
    assert envoy.stats(own) == seen  # nothing reached client-a's UDP capture listener
    # the controls: the pod's own connection and datagram to VIPs still reach the backends on node-b
    assert http_get(client.netns_path, HOST, port=18082, ip=mesh.services["web"]).status == 200
    assert wait_answer(client.netns_path, mesh.services["echo"], "echo-0").backend == "echo-0"
