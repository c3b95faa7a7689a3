"""Which pods a policy guards (issue 22, item 4), the pure part: a Service's policies bind to every pod its
`spec.selector` selects in its namespace *and* every endpoint of its EndpointSlices, so a pod missing from the slices
(unready, or a slice edited by hand) is still guarded; a selector-less Service keeps the slice binding. What the
operator publishes (the QUIC destination's `unreadyIps`, the ineligible Service's `endpointIps`), the MeshNode
counts, and the status of Namespace-wide (default-deny) and typo'd policies."""

from __future__ import annotations

from typing import Any

from aether.api.authz import ROOT_NAMESPACE, compile_bodies
from aether.api.meshnode import IneligibleDestination, QuicDestination
from aether.operator.policies import bound_nodes, node_counts, policy_status, unresolved
from aether.operator.reconcile.model import ClusterModel
from aether.operator.reconcile.views import parse_pod, parse_service, parse_slice
from aether.testing.apitestbed import objects as o

NS, TD = "shop", "cluster.local"
HTTP: list[o.Port] = [("http", 8080, "TCP")]
CLIENT = f"spiffe://{TD}/ns/{NS}/sa/client"


def model(selector: dict[str, str] | None, endpoints: list[tuple[str, Any, str | None]]) -> ClusterModel:
    """Namespace shop: pods web-0 (10.0.0.7, label app=web-0) and web-1 (10.0.0.8, app=web-1) on node n1, both
    Running; Service web with `selector`; its one EndpointSlice with `endpoints`."""
    m = ClusterModel()
    m.apply_raw("namespace", o.namespace(NS))
    m.apply_raw("node", o.node("n1"))
    for name, ip in (("web-0", "10.0.0.7"), ("web-1", "10.0.0.8")):
        m.apply_raw("pod", {**o.pod(NS, name, "n1", "web"), **o.pod_status(ip)})
    m.apply_raw("service", o.service(NS, "web", "10.96.0.20", HTTP, selector))
    m.apply_raw("slice", o.endpoint_slice(NS, "web", HTTP, endpoints))
    m.reconcile()
    return m


def published(m: ClusterModel) -> QuicDestination | IneligibleDestination:
    tables = m.results[NS].tables
    found: list[QuicDestination | IneligibleDestination] = [*tables.destinations, *tables.ineligible]
    assert len(found) == 1, found
    return found[0]


def guarded_ips(d: QuicDestination | IneligibleDestination) -> set[str]:
    if isinstance(d, QuicDestination):
        return {e.ip for e in d.endpoints} | set(d.unready_ips)
    return set(d.endpoint_ips)


def test_a_selected_pod_missing_from_the_slice_is_still_guarded() -> None:
    m = model({"app": "web-0"}, [])  # the slice lists nobody (edited by hand, or not written yet)
    d = published(m)
    assert isinstance(d, IneligibleDestination) and d.reason == "NoReadyEndpoints"
    assert d.endpoint_ips == ["10.0.0.7"] and d.ports == [8080]  # guarded, takes no traffic


def test_union_of_slice_endpoints_and_selector_matches() -> None:
    # the slice lists web-1 only (ready): web-0, selected, is guarded beside it and takes no traffic
    d = published(model({"app": "web-0"}, [("10.0.0.8", True, "web-1")]))
    assert isinstance(d, QuicDestination)
    assert [e.ip for e in d.endpoints] == ["10.0.0.8"] and d.unready_ips == ["10.0.0.7"]
    assert guarded_ips(d) == {"10.0.0.7", "10.0.0.8"}


def test_a_selector_less_service_keeps_the_slice_binding() -> None:
    d = published(model(None, [("10.0.0.8", True, "web-1")]))
    assert isinstance(d, QuicDestination) and guarded_ips(d) == {"10.0.0.8"}
    assert published(model(None, [])) == IneligibleDestination(service=f"{NS}/web", reason="NoReadyEndpoints")


def test_the_selector_follows_pod_labels_and_phase() -> None:
    m = model({"app": "web-0"}, [])
    m.apply_raw("pod", {**o.pod(NS, "web-0", "n1", "web"), **o.pod_status("10.0.0.7", phase="Succeeded")})
    m.reconcile()
    assert guarded_ips(published(m)) == set()  # finished: no longer the node proxy's pod
    relabelled = o.pod(NS, "web-1", "n1", "web")
    relabelled["metadata"]["labels"] = {"app": "web-0", "tier": "x"}
    m.apply_raw("pod", {**relabelled, **o.pod_status("10.0.0.8")})
    m.reconcile()
    assert guarded_ips(published(m)) == {"10.0.0.8"}  # a label change binds it (every selector label present)


def test_counts_follow_the_selector_and_namespace_wide_policies() -> None:
    pods = [parse_pod({**o.pod(NS, "web-0", "n1", "web"), **o.pod_status("10.0.0.7")})]
    services = [parse_service(o.service(NS, "web", "10.96.0.20", HTTP, {"app": "web-0"}))]
    empty = [parse_slice(o.endpoint_slice(NS, "web", HTTP, []))]
    assert bound_nodes(services, pods, empty) == {(NS, "web"): {"n1"}}
    assert bound_nodes([parse_service(o.service(NS, "web", "10.96.0.20", HTTP))], pods, empty) == {}
    on_web = compile_bodies([o.authorization_policy(NS, "p", ["web"], [{"from": [CLIENT]}])], TD)
    assert node_counts(on_web, pods, empty, ["n1"], services)["n1"] == {
        "guardedServices": 1,
        "policies": 1,
        "notAccepted": 0,
    }
    deny = namespace_policy(NS, "deny-all")
    assert node_counts(compile_bodies([deny], TD), pods, empty, ["n1"], services)["n1"]["policies"] == 1
    mesh = namespace_policy(ROOT_NAMESPACE, "mesh-deny")
    assert node_counts(compile_bodies([mesh], TD), pods, empty, ["n1"], services)["n1"]["policies"] == 1
    other = namespace_policy("elsewhere", "deny-all")
    assert node_counts(compile_bodies([other], TD), pods, empty, ["n1"], services)["n1"]["policies"] == 0


def namespace_policy(ns: str, name: str, rules: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body = o.authorization_policy(ns, name, [], rules or [])
    body["spec"]["targetRefs"] = [{"kind": "Namespace", "name": ns}]
    return body


def test_status_of_namespace_wide_policies() -> None:
    services = {"web": parse_service(o.service(NS, "web", "10.96.0.20", HTTP))}
    status = policy_status(namespace_policy(NS, "deny-all"), services, TD)
    accepted, resolved = status["conditions"]
    assert (accepted["status"], accepted["reason"]) == ("True", "DenyAll")
    assert "every caller of every pod of namespace shop is denied" in accepted["message"]
    assert (resolved["status"], resolved["message"]) == ("True", "selects every pod of namespace shop")
    mesh = policy_status(namespace_policy(ROOT_NAMESPACE, "deny-all"), {}, TD)
    assert "every pod of the mesh" in mesh["conditions"][0]["message"]
    foreign = namespace_policy(NS, "foreign")
    foreign["spec"]["targetRefs"] = [{"kind": "Namespace", "name": "other"}]
    accepted = policy_status(foreign, services, TD)["conditions"][0]
    assert (accepted["status"], accepted["reason"]) == ("False", "InvalidSpec")
    assert "only its own Namespace ('shop'), not 'other'" in accepted["message"]
    assert unresolved(status) is None


def test_a_typod_target_is_unresolved_and_warned() -> None:
    services = {"web": parse_service(o.service(NS, "web", "10.96.0.20", HTTP))}
    status = policy_status(o.authorization_policy(NS, "typo", ["Web"], [{"from": [CLIENT]}]), services, TD)
    resolved = status["conditions"][1]
    assert (resolved["status"], resolved["reason"]) == ("False", "ServiceNotFound")
    assert status["services"] == []
    message = unresolved(status)
    assert message is not None and f"Service {NS}/Web does not exist" in message and "opens nothing" in message
