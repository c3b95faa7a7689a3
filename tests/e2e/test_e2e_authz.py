"""Authorization by identity through the whole mesh: MeshAuthorizationPolicies applied through the API, the operator's
status and MeshNode counts, each node's cluster-mode sidecar reading the policies and programming its Envoy, across
two nodes over HTTP/3 (client-a as ServiceAccount alpha, client-b as beta on node-a; web-0 on node-b).

- a policy allowing alpha: alpha 200 with its SPIFFE ID, beta 403; Accepted, node-b counts it, node-a does not;
- a change while alpha's traffic flows on one keep-alive connection (beta added, then removed): every alpha request
  answers 200, beta follows the policy;
- a hostile policy (a wildcard) on web: Accepted=False, it opens nothing (beta still denied, alpha still allowed
  by web-callers); alone on web it closes it (alpha denied too); with no policy left both are admitted again.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aether.api import authz
from aether.api.meshnode import API_GROUP, API_VERSION
from aether.api.naming import mesh_host, spiffe_id
from aether.e2e.harness import Mesh
from aether.testing.eastwest_lab import client_result, start_client, xfcc_uri
from aether.testing.probe import wait_http
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

NS = "authz"
CLIENTS = {"client-a": "alpha", "client-b": "beta"}  # pod -> ServiceAccount
HOST = mesh_host(NS, "web")
ALPHA, BETA = spiffe_id(NS, "alpha"), spiffe_id(NS, "beta")


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    m = Mesh(namespace=NS, areas="udp,tcp-floor,eastwest", shared_ca=True)
    try:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        m.start_node_proxies()
        for pod, sa in CLIENTS.items():
            m.add_pod(a, pod, sa=sa)
        m.add_http_backend(b, "web-0", sa="web")
        m.add_http_service("web", ["web-0"])
        m.programmed(a)
        m.programmed(b)
        for pod in CLIENTS:
            assert wait_http(m.pods[pod].netns_path, HOST).status == 200, m.diagnostics()
        yield m
    finally:
        m.close()


def status(mesh: Mesh, pod: str) -> int | None:
    return wait_http(mesh.pods[pod].netns_path, HOST, timeout=0.1).status


def wait_status(mesh: Mesh, pod: str, want: int) -> None:
    got = wait_http(mesh.pods[pod].netns_path, HOST, want=want)
    assert got.status == want, f"{pod}: {got}\n{mesh.diagnostics()}"


def counts(mesh: Mesh, node: str) -> dict[str, int] | None:
    obj = mesh.kube.meshnode(node) or {}
    found: dict[str, int] | None = (obj.get("status") or {}).get("authorization")
    return found


def test_policy_allows_alpha_denies_beta_and_is_counted(mesh: Mesh) -> None:
    mesh.kube.authorization_policy(NS, "web-callers", "web", [ALPHA])
    assert mesh.kube.policy_condition(NS, "web-callers") == "True/Accepted"
    assert mesh.kube.policy_condition(NS, "web-callers", "ResolvedRefs") == "True/ResolvedRefs"
    wait_status(mesh, "client-b", 403)
    got = wait_http(mesh.pods["client-a"].netns_path, HOST)
    assert (got.status, got.spiffe_id) == (200, ALPHA), got
    wait_for(lambda: counts(mesh, "node-b") == {"guardedServices": 1, "policies": 1, "notAccepted": 0}, 30, "counts")
    assert counts(mesh, "node-a") is None  # no guarded pod there


def test_a_policy_change_while_alpha_traffic_flows(mesh: Mesh) -> None:
    mesh.kube.authorization_policy(NS, "web-callers", "web", [ALPHA])
    wait_status(mesh, "client-b", 403)
    traffic = start_client(mesh.lab, mesh.pods["client-a"].net.netns, HOST, n=120, pause=0.03)
    try:
        mesh.kube.authorization_policy(NS, "web-callers", "web", [ALPHA, BETA])
        wait_status(mesh, "client-b", 200)
        mesh.kube.authorization_policy(NS, "web-callers", "web", [ALPHA])
        wait_status(mesh, "client-b", 403)
    finally:
        results = client_result(traffic)
    assert [s for s, _ in results] == [200] * 120, [r for r in results if r[0] != 200][:3]
    assert {xfcc_uri(body) for _, body in results} == {ALPHA}


def test_a_hostile_policy_fails_closed_on_its_service_only(mesh: Mesh) -> None:
    mesh.kube.authorization_policy(NS, "open-to-all", "web", ["*"])
    try:
        assert mesh.kube.policy_condition(NS, "open-to-all") == "False/InvalidSource"
        wait_for(lambda: counts(mesh, "node-b") == {"guardedServices": 1, "policies": 2, "notAccepted": 1}, 30, "")
        # the sidecar has compiled it: the wildcard opened nothing (beta still denied), web-callers still holds
        assert status(mesh, "client-b") == 403 and status(mesh, "client-a") == 200
        assert mesh.kube.policy_condition(NS, "web-callers") == "True/Accepted"  # the other policy untouched
        # alone on web, the invalid policy closes it: it allows nothing (fails closed)
        mesh.kube.custom.delete_namespaced_custom_object(API_GROUP, API_VERSION, NS, authz.PLURAL, "web-callers")
        wait_for(lambda: counts(mesh, "node-b") == {"guardedServices": 1, "policies": 1, "notAccepted": 1}, 30, "")
        wait_status(mesh, "client-a", 403)
        assert status(mesh, "client-b") == 403
    finally:
        mesh.kube.custom.delete_namespaced_custom_object(API_GROUP, API_VERSION, NS, authz.PLURAL, "open-to-all")
    wait_status(mesh, "client-b", 200)  # no policy left: any identity of the trust domain again
    wait_status(mesh, "client-a", 200)
