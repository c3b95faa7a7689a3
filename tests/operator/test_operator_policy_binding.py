"""Policies that cannot be lost (issue 22, item 4), the real operator (in-process) on the real control plane
(kube-apiserver, etcd, kube-controller-manager with its EndpointSlice controller):

- a Service with a selector: its policy binds to the pod the selector selects, and keeps guarding it when the
  EndpointSlice no longer lists it (the controller stopped, the slice edited by hand): the MeshNode state the
  sidecar reads still carries the pod's IP as guarded, the counts still count it;
- a policy naming a Service that does not exist (a typo, `Web` for `web`): ResolvedRefs=False/ServiceNotFound and a
  Warning Event `ServiceNotFound` on the policy;
- a default-deny policy (targetRefs: its own Namespace, no rules): Accepted=True/DenyAll, resolved to every pod of the
  namespace, counted on the node; one naming another Namespace is refused (InvalidSpec)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from aether.metrics import REGISTRY
from aether.testing.apiserver import Kind, Server, api_server
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.wait import wait_for

V = "mesh.aether.dev/v1alpha1"
KIND = "MeshAuthorizationPolicy"
TD = "cluster.local"
HTTP: list[o.Port] = [("http", 8080, "TCP")]
WEB_IP = "10.62.0.7"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(api_kind: Kind) -> Iterator[Server]:
    with api_server(api_kind) as s:
        yield s


@pytest.fixture(scope="module")
def api(server: Server) -> tuple[str, None]:
    """The conftest's operator and cluster on this module's server (whose controller manager a test stops)."""
    return server.kubeconfig, None


def condition(k: Cluster, ns: str, name: str, kind: str) -> tuple[str, str, str] | None:
    status = (k.get(V, KIND, name, ns) or {}).get("status") or {}
    found = [c for c in status.get("conditions") or [] if c["type"] == kind]
    return (found[0]["status"], found[0]["reason"], found[0]["message"]) if found else None


def wait_condition(k: Cluster, ns: str, name: str, kind: str, status: str, reason: str) -> str:
    def ok() -> str | None:
        c = condition(k, ns, name, kind)
        return c[2] if c and c[:2] == (status, reason) else None

    return wait_for(ok, what=f"{ns}/{name}: {kind}={status}/{reason}", timeout=30, ignore=READ_ERRORS)


def counts(k: Cluster, node: str) -> dict[str, int] | None:
    found: dict[str, int] | None = ((k.meshnode(node) or {}).get("status") or {}).get("authorization")
    return found


def guarded_ips(k: Cluster, node: str, service: str) -> set[str] | None:
    """The IPs the sidecar guards for `service` (what plan.guarded reads), None while the state lists it nowhere."""
    quic = k.state(node).get("quic") or {}
    for d in quic.get("destinations") or []:
        if d["service"] == service:
            return {e["ip"] for e in d.get("endpoints") or []} | set(d.get("unreadyIps") or [])
    for i in quic.get("ineligible") or []:
        if i["service"] == service:
            return set(i.get("endpointIps") or [])
    return None


def slice_ips(k: Cluster, ns: str, service: str) -> set[str]:
    items = k.res("discovery.k8s.io/v1", "EndpointSlice").get(namespace=ns).to_dict()["items"]
    mine = [s for s in items if (s["metadata"].get("labels") or {}).get("kubernetes.io/service-name") == service]
    return {a for s in mine for e in s.get("endpoints") or [] for a in e["addresses"]}


def setup(k: Cluster) -> tuple[str, str]:
    ns, node = unique("bind"), unique("bind-node")
    k.apply(o.namespace(ns))
    k.apply(o.node(node))
    k.apply(o.pod(ns, "web-0", node, "web"), status=o.pod_status(WEB_IP))  # labels app=web-0
    k.apply(o.service(ns, "web", None, HTTP, selector={"app": "web-0"}))
    wait_for(lambda: k.meshnode(node), what="the MeshNode", ignore=READ_ERRORS)
    return ns, node


def test_the_selected_pod_stays_guarded_when_the_slice_drops_it(
    server: Server, cluster: Cluster, operator: InProcessOperator
) -> None:
    k = cluster
    ns, node = setup(k)
    client = f"spiffe://{TD}/ns/{ns}/sa/client"
    k.apply(o.authorization_policy(ns, "web-callers", ["web"], [{"from": [client]}]))
    wait_for(lambda: slice_ips(k, ns, "web") == {WEB_IP} or None, what="the controller's slice lists web-0")
    wait_for(lambda: guarded_ips(k, node, f"{ns}/web") == {WEB_IP}, what="web-0 guarded", ignore=READ_ERRORS)
    want = {"guardedServices": 1, "policies": 1, "notAccepted": 0}
    wait_for(lambda: counts(k, node) == want, what="counted", ignore=READ_ERRORS)
    if server.control_plane is None:
        pytest.skip("the emulator runs no EndpointSlice controller to stop")
    kcm = server.control_plane.processes["kube-controller-manager"]
    kcm.stop()  # nobody puts the slice back: it stays as edited
    try:
        res = k.res("discovery.k8s.io/v1", "EndpointSlice")
        for s in res.get(namespace=ns, label_selector="kubernetes.io/service-name=web").to_dict()["items"]:
            res.patch(body={"endpoints": []}, name=s["metadata"]["name"], namespace=ns, content_type=MERGE)
        wait_for(lambda: not slice_ips(k, ns, "web") or None, what="the slice edited by hand")

        def unserved() -> bool:  # the operator has seen the edit: web has no ready endpoint in the state
            quic = k.state(node).get("quic") or {}
            return any(i["service"] == f"{ns}/web" for i in quic.get("ineligible") or [])

        wait_for(unserved, what="the state follows the slice", ignore=READ_ERRORS)
        assert guarded_ips(k, node, f"{ns}/web") == {WEB_IP}, k.state(node).get("quic")
        assert counts(k, node) == want
    finally:
        kcm.start()


MERGE = "application/merge-patch+json"


def warning_events(k: Cluster, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    events = k.res("v1", "Event").get(namespace=ns).to_dict()["items"]
    return [
        e
        for e in events
        if e["involvedObject"]["name"] == name
        and e["involvedObject"]["kind"] == KIND
        and (e["type"], e["reason"]) == ("Warning", reason)
    ]


def test_a_typod_target_is_a_condition_and_a_warning_event(cluster: Cluster, operator: InProcessOperator) -> None:
    k = cluster
    ns, _ = setup(k)
    k.apply(o.authorization_policy(ns, "typo", ["Web"], [{"from": [f"spiffe://{TD}/ns/{ns}/sa/client"]}]))
    message = wait_condition(k, ns, "typo", "ResolvedRefs", "False", "ServiceNotFound")
    assert f"Service {ns}/Web does not exist" in message
    (event,) = wait_for(lambda: warning_events(k, ns, "typo", "ServiceNotFound"), what="the Warning Event")
    assert f"Service {ns}/Web does not exist" in event["message"] and "opens nothing" in event["message"]
    assert event["source"]["component"] == "aether-operator"
    wait_for(  # what an alert reads (docs/operations.md)
        lambda: (REGISTRY.get_sample_value("aether_operator_policies", {"state": "unresolved"}) or 0) >= 1,
        what="aether_operator_policies{state=unresolved}",
    )


def test_a_default_deny_policy_resolves_to_its_namespace(cluster: Cluster, operator: InProcessOperator) -> None:
    k = cluster
    ns, node = setup(k)
    deny = o.authorization_policy(ns, "deny-all", [], [])
    deny["spec"]["targetRefs"] = [{"kind": "Namespace", "name": ns}]
    k.apply(deny)
    message = wait_condition(k, ns, "deny-all", "Accepted", "True", "DenyAll")
    assert f"every caller of every pod of namespace {ns} is denied" in message
    assert condition(k, ns, "deny-all", "ResolvedRefs") == (
        "True",
        "ResolvedRefs",
        f"selects every pod of namespace {ns}",
    )
    want = {"guardedServices": 1, "policies": 1, "notAccepted": 0}
    wait_for(lambda: counts(k, node) == want, what="web counted under the default-deny", ignore=READ_ERRORS)
    foreign = o.authorization_policy(ns, "foreign", [], [])
    foreign["spec"]["targetRefs"] = [{"kind": "Namespace", "name": "kube-system"}]
    k.apply(foreign)
    assert "its own Namespace" in wait_condition(k, ns, "foreign", "Accepted", "False", "InvalidSpec")
