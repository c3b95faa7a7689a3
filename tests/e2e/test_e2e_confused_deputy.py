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
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from aether.api.naming import mesh_host, spiffe_id
from aether.e2e.harness import Mesh
from aether.testing.probe import HttpAnswer, http_get, wait_http
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
        m.programmed(a)
        m.programmed(b)
        m.kube.authorization_policy(NS, "web-callers", "web", [ALPHA])
        got = wait_http(m.pods["client-a"].netns_path, HOST)
        assert (got.status, got.spiffe_id) == (200, ALPHA), m.diagnostics()
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
    """The pod's raw TCP listener on 18082 picks its chain by the destination VIP: a caller dialling the pod's own IP
    matches none (Envoy closes the connection, `no_filter_chain_match`), while the pod's own connection to the VIP
    reaches web-0 (the control). It carries no identity either way; this guards the shape."""
    client = mesh.pods["client-a"]
    vip = mesh.services["web"]
    assert http_get(client.netns_path, HOST, port=18082, ip=vip).status == 200
    got = http_get(mesh.nodes[caller].net.path, HOST, port=18082, ip=client.ip)
    assert got.status is None, got
