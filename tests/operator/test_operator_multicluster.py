"""Discovery across clusters on the real kube-apiserver with the upstream mcs-api v0.5.0 CRDs (ServiceExport,
ServiceImport) and our MeshPeer, the real operator in-process (docs/architecture.md#discovery-across-clusters).

Exporting side: a ServiceExport makes its Service's QUIC destination `exported` in the slice and says so in its
status (Valid, Ready=Exported, Conflict=False); one whose Service is missing is Valid=False NoService with a Warning
Event, and turns valid once the Service exists; a UDP-only Service is InvalidServiceType.
Importing side: a ServiceImport naming a MeshPeer becomes a QUIC destination with the peer's gateways (no endpoint
of its own) on every node whose pods may dial its namespace, with status.clusters naming the peer and Ready=True;
an unknown peer, no TCP port, a missing ServiceAccount annotation and a local Service of the same name are each
Ready=False with their reason (and a Warning Event), while the other imports are served; the peer's gateways
moving moves the destination's. GEP-1748: a UDPRoute backendRef of kind ServiceImport is ResolvedRefs=False
InvalidKind."""

from __future__ import annotations

from typing import Any

import pytest

from aether.testing.apiserver import Kind
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.wait import wait_for

pytestmark = pytest.mark.slow
MCS = "multicluster.x-k8s.io/v1beta1"


@pytest.fixture(autouse=True)
def _real_only(api_kind: Kind) -> None:
    if api_kind == "emulated":
        pytest.skip("the API test bed serves no multicluster Services API CRDs")


def conditions(k: Cluster, kind: str, ns: str, name: str) -> dict[str, dict[str, Any]]:
    status = (k.get(MCS, kind, name, ns) or {}).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


def wait_condition(k: Cluster, kind: str, ns: str, name: str, type_: str, status: str, reason: str) -> dict[str, Any]:
    def seen() -> dict[str, Any] | None:
        c = conditions(k, kind, ns, name).get(type_)
        return c if c and (c["status"], c["reason"]) == (status, reason) else None

    found: dict[str, Any] = wait_for(seen, what=f"{kind} {ns}/{name}: {type_}={status} {reason}", ignore=READ_ERRORS)
    return found


def destination(k: Cluster, node: str, service: str) -> dict[str, Any] | None:
    dests = ((k.state(node).get("quic") or {}).get("destinations")) or []
    return next((d for d in dests if d.get("service") == service), None)


def warnings(k: Cluster, ns: str, name: str, reason: str) -> list[Any]:
    events = k.res("v1", "Event").get(namespace=ns).to_dict()["items"]
    return [
        e
        for e in events
        if e["involvedObject"].get("name") == name and e["reason"] == reason and e["type"] == "Warning"
    ]


def setup(k: Cluster, prefix: str) -> tuple[str, str]:
    ns, node = unique(prefix), unique(f"{prefix}-node")
    k.apply(o.namespace(ns))
    k.apply(o.node(node))
    k.apply(o.pod(ns, "client-0", node, "client"), status=o.pod_status("10.62.0.2"))
    wait_for(lambda: k.meshnode(node), what="the MeshNode", ignore=READ_ERRORS)
    return ns, node


def test_a_service_export_marks_its_destination_exported(cluster: Cluster, operator: InProcessOperator) -> None:
    k = cluster
    ns, node = setup(k, "mcx")
    k.apply(o.pod(ns, "web-0", node, "web"), status=o.pod_status("10.62.0.7"))
    k.apply(o.service(ns, "web", None, [("http", 8080, "TCP")]))
    k.apply(o.endpoint_slice(ns, "web", [("http", 8080, "TCP")], [("10.62.0.7", True, "web-0")]))
    k.apply(o.service(ns, "dns", None, [("dns", 53, "UDP")]))
    wait_for(lambda: destination(k, node, f"{ns}/web"), what="web's destination", ignore=READ_ERRORS)
    assert "exported" not in (destination(k, node, f"{ns}/web") or {})

    k.apply(o.service_export(ns, "web"))
    wait_condition(k, "ServiceExport", ns, "web", "Valid", "True", "Valid")
    wait_condition(k, "ServiceExport", ns, "web", "Ready", "True", "Exported")
    assert conditions(k, "ServiceExport", ns, "web")["Conflict"]["status"] == "False"
    wait_for(lambda: (destination(k, node, f"{ns}/web") or {}).get("exported"), what="exported", ignore=READ_ERRORS)

    # a ServiceExport whose Service does not exist (yet): Valid=False NoService, a Warning; valid once it exists
    k.apply(o.service_export(ns, "api"))
    c = wait_condition(k, "ServiceExport", ns, "api", "Valid", "False", "NoService")
    assert c["message"] == f"Service {ns}/api does not exist"
    assert conditions(k, "ServiceExport", ns, "api")["Ready"]["status"] == "False"
    wait_for(lambda: warnings(k, ns, "api", "NoService"), what="the NoService Event", ignore=READ_ERRORS)
    k.apply(o.service(ns, "api", None, [("http", 8080, "TCP")]))
    wait_condition(k, "ServiceExport", ns, "api", "Valid", "True", "Valid")
    # valid, but no ready endpoint: not a QUIC destination, so not exported
    c = wait_condition(k, "ServiceExport", ns, "api", "Ready", "False", "Pending")
    assert "NoReadyEndpoints" in c["message"]

    # a Service with no TCP port: the gateways carry mTLS by SNI only
    k.apply(o.service_export(ns, "dns"))
    wait_condition(k, "ServiceExport", ns, "dns", "Valid", "False", "InvalidServiceType")

    k.delete(MCS, "ServiceExport", "web", ns)
    wait_for(
        lambda: not (destination(k, node, f"{ns}/web") or {"exported": True}).get("exported"),
        what="web no longer exported",
        ignore=READ_ERRORS,
    )


def test_a_service_import_becomes_a_destination_through_its_peers_gateways(
    cluster: Cluster, operator: InProcessOperator
) -> None:
    k = cluster
    ns, node = setup(k, "mci")
    peer = unique("cluster-a")
    k.apply(o.mesh_peer(peer, ["192.0.2.10", "192.0.2.11"]))
    k.apply(o.service_import(ns, "web", [("http", 8080, "TCP")], peer, "web"))
    c = wait_condition(k, "ServiceImport", ns, "web", "Ready", "True", "Ready")
    assert "192.0.2.10, 192.0.2.11" in c["message"]
    assert (k.get(MCS, "ServiceImport", "web", ns) or {})["status"]["clusters"] == [{"cluster": peer}]
    d = wait_for(lambda: destination(k, node, f"{ns}/web"), what="the imported destination", ignore=READ_ERRORS)
    assert d == {
        "service": f"{ns}/web",
        "serviceAccount": "web",
        "ports": [8080],
        "endpoints": [],
        "gateways": ["192.0.2.10", "192.0.2.11"],
    }

    # the peer's gateways move: the destination's follow
    k.apply(o.mesh_peer(peer, ["192.0.2.12"]))
    wait_for(
        lambda: (destination(k, node, f"{ns}/web") or {}).get("gateways") == ["192.0.2.12"],
        what="the new gateway",
        ignore=READ_ERRORS,
    )

    # bad inputs: each its own reason and a Warning, none served, the good import stays
    k.apply(o.service_import(ns, "lost", [("http", 8080, "TCP")], "no-such-peer", "lost"))
    k.apply(o.service_import(ns, "portless", [("dns", 53, "UDP")], peer, "portless"))
    k.apply(o.service_import(ns, "anonymous", [("http", 8080, "TCP")], peer, None))
    k.apply(o.service(ns, "local", None, [("http", 8080, "TCP")]))
    k.apply(o.service_import(ns, "local", [("http", 8080, "TCP")], peer, "local"))
    c = wait_condition(k, "ServiceImport", ns, "lost", "Ready", "False", "UnknownPeer")
    assert c["message"] == "MeshPeer no-such-peer does not exist"
    wait_condition(k, "ServiceImport", ns, "portless", "Ready", "False", "NoPorts")
    wait_condition(k, "ServiceImport", ns, "anonymous", "Ready", "False", "NoServiceAccount")
    wait_condition(k, "ServiceImport", ns, "local", "Ready", "False", "LocalService")
    wait_for(lambda: warnings(k, ns, "lost", "UnknownPeer"), what="the UnknownPeer Event", ignore=READ_ERRORS)
    for name in ("lost", "portless", "anonymous", "local"):  # the local Service has no endpoint: ineligible
        assert destination(k, node, f"{ns}/{name}") is None
    assert (destination(k, node, f"{ns}/web") or {}).get("gateways") == ["192.0.2.12"]

    # a peer with an unusable gateway address, and one in another trust domain: UnknownPeer, saying why
    k.apply(o.mesh_peer("bad-address", ["gw.example"]))
    k.apply(o.service_import(ns, "badaddr", [("http", 8080, "TCP")], "bad-address", "badaddr"))
    c = wait_condition(k, "ServiceImport", ns, "badaddr", "Ready", "False", "UnknownPeer")
    assert "'gw.example' is not an IP address" in c["message"], c
    k.apply(o.mesh_peer("federated", ["192.0.2.40"], trust_domain="other.example"))
    k.apply(o.service_import(ns, "fed", [("http", 8080, "TCP")], "federated", "fed"))
    c = wait_condition(k, "ServiceImport", ns, "fed", "Ready", "False", "UnknownPeer")
    assert "trust domain other.example" in c["message"] and "federating bundles is not" in c["message"], c
    assert destination(k, node, f"{ns}/badaddr") is None and destination(k, node, f"{ns}/fed") is None

    # the peer appears: the import is served
    k.apply(o.mesh_peer("no-such-peer", ["192.0.2.20"]))
    wait_condition(k, "ServiceImport", ns, "lost", "Ready", "True", "Ready")
    wait_for(lambda: destination(k, node, f"{ns}/lost"), what="lost served", ignore=READ_ERRORS)

    k.delete(MCS, "ServiceImport", "web", ns)
    wait_for(lambda: destination(k, node, f"{ns}/web") is None, what="the import gone", ignore=READ_ERRORS)
    k.delete("mesh.aether.dev/v1alpha1", "MeshPeer", "no-such-peer")
    wait_condition(k, "ServiceImport", ns, "lost", "Ready", "False", "UnknownPeer")


def test_a_udproute_backend_of_kind_serviceimport_is_invalid_kind(
    cluster: Cluster, operator: InProcessOperator
) -> None:
    """GEP-1748 lets a route name a ServiceImport; plaintext UDP has no SNI for the gateway to route by, so the
    mesh refuses it explicitly (ResolvedRefs=False InvalidKind) instead of ignoring it."""
    k = cluster
    ns, _node = setup(k, "mcr")
    k.apply(o.service(ns, "dns", None, [("dns", 53, "UDP")]))
    ref = {"group": "multicluster.x-k8s.io", "kind": "ServiceImport", "name": "dns-remote", "port": 53}
    k.apply(o.udproute(ns, "r", "dns", [ref], version="v1"))

    def resolved() -> dict[str, Any] | None:
        parents = ((k.route(ns, "r", "v1") or {}).get("status") or {}).get("parents") or []
        conds = {c["type"]: c for p in parents for c in p.get("conditions") or []}
        return conds.get("ResolvedRefs")

    c = wait_for(resolved, what="the route's ResolvedRefs", ignore=READ_ERRORS)
    assert (c["status"], c["reason"]) == ("False", "InvalidKind")
    assert "multicluster.x-k8s.io/ServiceImport" in c["message"]


def test_a_labelled_node_plays_the_gateway_for_the_exported_services(
    cluster: Cluster, operator: InProcessOperator
) -> None:
    """A Node labelled mesh.aether.dev/east-west-gateway=true gets `status.gateway.address` (its InternalIP) and,
    with no meshed pod of its own, depends on the namespaces with a ServiceExport: its MeshNode names their slices,
    so its proxy has the exported destinations to export. An unlabelled node gets no role."""
    k = cluster
    ns, node = setup(k, "mcg")
    k.apply(o.pod(ns, "web-0", node, "web"), status=o.pod_status("10.62.0.7"))
    k.apply(o.service(ns, "web", None, [("http", 8080, "TCP")]))
    k.apply(o.endpoint_slice(ns, "web", [("http", 8080, "TCP")], [("10.62.0.7", True, "web-0")]))
    gw = unique("mcg-gw")
    labelled = {**o.node(gw), "metadata": {"name": gw, "labels": {"mesh.aether.dev/east-west-gateway": "true"}}}
    k.apply(labelled, status=o.node_status("192.0.2.31"))

    def role(name: str) -> Any:
        return ((k.meshnode(name) or {}).get("status") or {}).get("gateway")

    assert wait_for(lambda: role(gw), what="the gateway role", ignore=READ_ERRORS) == {"address": "192.0.2.31"}
    assert destination(k, gw, f"{ns}/web") is None  # nothing exported: the gateway node depends on nothing
    k.apply(o.service_export(ns, "web"))
    d = wait_for(lambda: destination(k, gw, f"{ns}/web"), what="the export on the gateway", ignore=READ_ERRORS)
    assert d["exported"] is True and d["endpoints"] == [{"ip": "10.62.0.7", "port": 18008}]
    assert role(node) is None
    # the label going takes the role away
    k.apply({**o.node(gw), "metadata": {"name": gw, "labels": {"mesh.aether.dev/east-west-gateway": None}}})
    wait_for(lambda: role(gw) is None, what="the role gone", ignore=READ_ERRORS)
