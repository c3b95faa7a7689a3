"""Policies that cannot be lost (issue 22, item 4), black-box through the whole mesh: the real control plane (its
EndpointSlice controller writes the slices of selector Services), the operator, cluster-mode sidecars and Envoys on
two nodes, STRICT inbound through aether-cni. web-0 and api-0 (node-b) back Services `web` and `api`, each selecting
its pod by label; alpha and beta are ServiceAccounts of pods on node-a. The callers are real clients aimed straight
at the pod's inbound (web-0's IP, 18008) from node-a's netns with alpha's or beta's SVID, as anything holding a mesh
identity can: Python ssl + h2 over TCP mTLS, aioquic over HTTP/3 (`aether.testing.inbound_clients`).

- a pod taken out of its Service's EndpointSlice stays guarded: `web-callers` allows alpha on web; the controller is
  stopped and web's slice edited by hand to list nobody (node-b's Envoy drops web's cluster: the state arrived);
  beta is still refused 403 (RBAC) and alpha still answered, over h2 and HTTP/3. Seen red on main: 200 for beta;
- a typo'd target under default-deny opens nothing: `deny-all` (targetRefs: the Namespace, no rules) and
  `api-callers` targeting `Api` (no such Service) allowing alpha: alpha and beta are both refused 403 on api-0;
  the typo fixed, alpha is answered and beta still refused. Seen red on main: 200 for both (the Namespace target was
  refused, the typo opened the namespace to the trust domain);
- the mesh-wide form: the same default-deny in the root namespace (`aether-system`) refuses alpha and beta on api-0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from aether.api import authz
from aether.api.meshnode import API_GROUP, API_VERSION
from aether.api.naming import h2_cluster, mesh_host, quic_sni, spiffe_id
from aether.e2e.harness import HTTP_APP_PORT, Mesh
from aether.e2e.kube import MERGE, ApiException
from aether.netns.contract import INBOUND_PORT
from aether.testing.apitestbed import objects as o
from aether.testing.controlplane import ControlPlane
from aether.testing.eastwest_lab import xfcc_uri
from aether.testing.inbound_clients import Pems, h2_get, h3_get
from aether.testing.wait import wait_for
from aether.xds.identity.pemdir import BUNDLE_FILE

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

NS = "bind"
ALPHA, BETA = spiffe_id(NS, "alpha"), spiffe_id(NS, "beta")
CLIENTS: dict[str, Callable[..., dict[str, object]]] = {"h2": h2_get, "h3": h3_get}
BACKENDS = {"web-0": "web", "api-0": "api"}  # pod -> its ServiceAccount and its Service (selector app=<pod>)


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    m = Mesh(namespace=NS, areas="udp,tcp-floor,eastwest", shared_ca=True)
    try:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        m.start_node_proxies()
        m.add_pod(a, "client-a", sa="alpha")  # issues alpha's and beta's SVIDs into the certs directory
        m.add_pod(a, "client-b", sa="beta")
        for pod, svc in BACKENDS.items():
            m.add_http_backend(b, pod, sa=svc)
            body = o.service(NS, svc, None, [("http", HTTP_APP_PORT, "TCP")], selector={"app": pod})
            m.kube.core.create_namespaced_service(NS, body)
        m.programmed(a)
        m.programmed(b)
        for pod in BACKENDS:
            got = wait_status(m, "h2", pod, BETA, 200, timeout=60)  # no policy yet: the trust domain
            assert xfcc_uri(str(got["body"])) == BETA
        yield m
    finally:
        m.close()


def pems(mesh: Mesh, identity: str) -> Pems:
    sa = identity.rsplit("/", 1)[1]
    d = mesh.certs_dir / NS / sa
    return Pems(d / "svid.pem", d / "svid_key.pem", mesh.certs_dir / BUNDLE_FILE)


def call(mesh: Mesh, protocol: str, pod: str, identity: str) -> dict[str, object]:
    """One GET straight at `pod`'s inbound from node-a's netns, as `identity`."""
    sni = quic_sni(HTTP_APP_PORT, BACKENDS[pod], NS)
    node = mesh.nodes["node-a"].net.netns
    host = mesh_host(NS, BACKENDS[pod])
    return CLIENTS[protocol](node, mesh.pods[pod].ip, INBOUND_PORT, sni, pems(mesh, identity), host)


def ok(got: dict[str, object]) -> dict[str, object] | None:
    return got if got.get("status") == 200 else None


def wait_status(
    mesh: Mesh, protocol: str, pod: str, identity: str, want: int, timeout: float = 30.0
) -> dict[str, object]:
    def answered() -> dict[str, object] | None:
        got = call(mesh, protocol, pod, identity)
        return got if got.get("status") == want else None

    return wait_for(
        answered,
        timeout,
        f"{identity} on {pod} over {protocol}: {want}",
        diagnose=lambda: f"now: {call(mesh, protocol, pod, identity)}",
    )


def refused(got: dict[str, object]) -> bool:
    return got.get("status") == 403 and "RBAC" in str(got.get("body"))


def apply_policy(mesh: Mesh, body: dict[str, Any]) -> None:
    try:
        mesh.kube.custom.create_namespaced_custom_object(API_GROUP, API_VERSION, NS, authz.PLURAL, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        name, spec = body["metadata"]["name"], {"spec": body["spec"]}
        mesh.kube.custom.patch_namespaced_custom_object(
            API_GROUP, API_VERSION, NS, authz.PLURAL, name, spec, _content_type=MERGE
        )


def delete_policy(mesh: Mesh, name: str) -> None:
    mesh.kube.custom.delete_namespaced_custom_object(API_GROUP, API_VERSION, NS, authz.PLURAL, name)


def test_a_pod_taken_out_of_its_slice_stays_guarded(mesh: Mesh) -> None:
    mesh.kube.authorization_policy(NS, "web-callers", "web", [ALPHA])
    envoy_b = mesh.nodes["node-b"].envoy
    assert envoy_b is not None and isinstance(mesh.api, ControlPlane), "the real control plane and node-b's Envoy"
    try:
        for protocol in CLIENTS:
            assert refused(wait_status(mesh, protocol, "web-0", BETA, 403))
            assert xfcc_uri(str(wait_status(mesh, protocol, "web-0", ALPHA, 200)["body"])) == ALPHA
        kcm = mesh.api.processes["kube-controller-manager"]
        kcm.stop()  # nobody puts the slice back
        try:
            slices = mesh.kube.discovery.list_namespaced_endpoint_slice(
                NS, label_selector="kubernetes.io/service-name=web"
            )
            assert [a for s in slices.items for e in s.endpoints or [] for a in e.addresses] == [mesh.pods["web-0"].ip]
            for s in slices.items:
                mesh.kube.discovery.patch_namespaced_endpoint_slice(s.metadata.name, NS, {"endpoints": []})
            cluster = h2_cluster(NS, "web")
            wait_for(
                lambda: cluster not in envoy_b.admin("/clusters"), 60, "node-b without web's cluster (no endpoint)"
            )
            for protocol in CLIENTS:
                got = call(mesh, protocol, "web-0", BETA)
                assert refused(got), f"beta over {protocol} on web-0 out of its slice: {got}"
                assert ok(call(mesh, protocol, "web-0", ALPHA)), protocol
        finally:
            kcm.start()
    finally:
        delete_policy(mesh, "web-callers")


def namespace_deny_all() -> dict[str, Any]:
    body = o.authorization_policy(NS, "deny-all", [], [])
    body["spec"]["targetRefs"] = [{"kind": "Namespace", "name": NS}]
    return body


def test_a_typod_target_under_default_deny_opens_nothing(mesh: Mesh) -> None:
    apply_policy(mesh, namespace_deny_all())
    apply_policy(mesh, o.authorization_policy(NS, "api-callers", ["Api"], [{"from": [ALPHA]}]))
    try:
        for protocol in CLIENTS:
            assert refused(wait_status(mesh, protocol, "api-0", ALPHA, 403))
            assert refused(call(mesh, protocol, "api-0", BETA))
        assert mesh.kube.policy_condition(NS, "api-callers", "ResolvedRefs") == "False/ServiceNotFound"
        assert mesh.kube.policy_condition(NS, "deny-all") == "True/DenyAll"
        apply_policy(mesh, o.authorization_policy(NS, "api-callers", ["api"], [{"from": [ALPHA]}]))  # typo fixed
        for protocol in CLIENTS:
            assert xfcc_uri(str(wait_status(mesh, protocol, "api-0", ALPHA, 200)["body"])) == ALPHA
            assert refused(call(mesh, protocol, "api-0", BETA))
    finally:
        delete_policy(mesh, "api-callers")
        delete_policy(mesh, "deny-all")
    for protocol in CLIENTS:
        wait_status(mesh, protocol, "api-0", BETA, 200)  # no policy left: the trust domain again


def test_a_mesh_wide_default_deny_from_the_root_namespace(mesh: Mesh) -> None:
    """A Namespace-targeted policy without rules in `aether-system` (authz.ROOT_NAMESPACE) denies every pod of the
    mesh what no other policy allows: beta and alpha refused on api-0 (no policy of its own); gone, both answered."""
    root = authz.ROOT_NAMESPACE
    try:
        mesh.kube.core.create_namespace(o.namespace(root, meshed=False))
    except ApiException as exc:
        if exc.status != 409:
            raise
    body = o.authorization_policy(root, "mesh-deny-all", [], [])
    body["spec"]["targetRefs"] = [{"kind": "Namespace", "name": root}]
    mesh.kube.custom.create_namespaced_custom_object(API_GROUP, API_VERSION, root, authz.PLURAL, body)
    try:
        for protocol in CLIENTS:
            assert refused(wait_status(mesh, protocol, "api-0", BETA, 403))
            assert refused(call(mesh, protocol, "api-0", ALPHA))
        assert mesh.kube.policy_condition(root, "mesh-deny-all") == "True/DenyAll"
    finally:
        mesh.kube.custom.delete_namespaced_custom_object(API_GROUP, API_VERSION, root, authz.PLURAL, "mesh-deny-all")
    for protocol in CLIENTS:
        wait_status(mesh, protocol, "api-0", BETA, 200)
