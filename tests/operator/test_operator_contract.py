"""API-contract tests: the real operator (in-process kopf) against the API test bed, or against a real cluster
when AETHER_KUBECONFIG is set. Objects go in through the API; MeshNode and UDPRoute status must converge."""

from __future__ import annotations

from typing import Any

import pytest

from aether.metrics import REGISTRY
from aether.operator.routestatus import CONTROLLER_NAME
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.wait import wait_for

UDP = [("dns", 53, "UDP")]
SL = [("dns", 5353, "UDP")]
ROUTE = ("gateway.networking.k8s.io/v1alpha2", "UDPRoute")


class Mesh:
    """One test's own namespace(s) and nodes, so tests can share one operator."""

    def __init__(self, k: Cluster) -> None:
        self.k = k
        self.ns = unique("ct")
        self.n1, self.n2 = unique("node"), unique("node")
        k.apply(o.namespace(self.ns))
        for n in (self.n1, self.n2):
            k.apply(o.node(n))
        self.pod("client", self.n1, "10.0.0.2", "client")

    def pod(self, name: str, node: str, ip: str, sa: str = "default", ns: str | None = None) -> None:
        self.k.apply(o.pod(ns or self.ns, name, node, sa), status=o.pod_status(ip))["status"]

    def service(self, name: str, vip: str, eps: list[tuple[str, bool, str | None]], ns: str | None = None) -> None:
        self.k.apply(o.service(ns or self.ns, name, vip, UDP))
        self.k.apply(o.endpoint_slice(ns or self.ns, name, SL, eps))

    def route(self, name: str, parent: str, backends: list[dict[str, Any]]) -> None:
        self.k.apply(o.udproute(self.ns, name, parent, backends))

    def arm(self, svc: str, node: str | None = None) -> dict[str, Any] | None:
        return self.k.arm(node or self.n1, f"{self.ns}/{svc}")

    def wait_arm(self, svc: str, cluster: str, node: str | None = None) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            arm = self.arm(svc, node)
            return arm if arm and arm["cluster"] == cluster else None

        return wait_for(check, what=f"arm {self.ns}/{svc} -> {cluster}", ignore=READ_ERRORS)

    def ours(self, route: str) -> dict[str, Any] | None:
        r = self.k.route(self.ns, route) or {}
        parents = (r.get("status") or {}).get("parents") or []
        return next((p for p in parents if p.get("controllerName") == CONTROLLER_NAME), None)

    def condition(self, route: str, type_: str) -> dict[str, Any] | None:
        p = self.ours(route) or {}
        return next((c for c in p.get("conditions") or [] if c["type"] == type_), None)


@pytest.fixture
def mesh(cluster: Cluster) -> Mesh:
    return Mesh(cluster)


def test_meshnode_per_node_owned_by_it_with_pods_arms_and_identities(mesh: Mesh, cluster: Cluster) -> None:
    mesh.service("a", "10.96.0.10", [("10.1.0.10", True, None), ("10.1.0.11", False, None)])
    arm = mesh.wait_arm("a", f"udp:{mesh.ns}/a")
    assert arm["vip"] == "10.96.0.10" and arm["endpoints"] == [{"ip": "10.1.0.10", "port": 5353}]
    mn = cluster.meshnode(mesh.n1) or {}
    node = cluster.get("v1", "Node", mesh.n1) or {}
    owners = mn["metadata"]["ownerReferences"]
    assert [(r["kind"], r["name"], r["uid"]) for r in owners] == [("Node", mesh.n1, node["metadata"]["uid"])]
    status = mn["status"]
    assert [p["name"] for p in status["pods"] if p["namespace"] == mesh.ns] == ["client"]
    assert f"spiffe://cluster.local/ns/{mesh.ns}/sa/client" in status["quic"]["identities"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    assert wait_for(lambda: cluster.meshnode(mesh.n2), what="MeshNode for the second node", ignore=READ_ERRORS)


def test_only_shapes_still_unsupported_are_counted(mesh: Mesh, cluster: Cluster) -> None:
    """aether_udp_unsupported_total: a Service with two UDP ports counts once (MultipleUDPPorts); a weighted split
    and a drain count nothing (they are supported)."""

    def counted(reason: str) -> float:
        return REGISTRY.get_sample_value("aether_udp_unsupported_total", {"reason": reason}) or 0.0

    before = {r: counted(r) for r in ("MultipleUDPPorts", "WeightedSplit", "Drained")}
    cluster.apply(o.service(mesh.ns, "two", "10.96.0.30", [("a", 53, "UDP"), ("b", 54, "UDP")]))
    for i, name in enumerate("xy"):
        mesh.service(name, f"10.96.0.{31 + i}", [(f"10.1.0.{31 + i}", True, None)])
    mesh.route("split", "x", [o.backend("x", 53, 0), o.backend("y", 53, 1)])
    mesh.wait_arm("x", f"udp-split:{mesh.ns}/x")
    shapes = wait_for(
        lambda: [s for s in cluster.state(mesh.n1)["udp"].get("unsupportedShapes", [])] or None,
        what="the MultipleUDPPorts shape",
        ignore=READ_ERRORS,
    )
    assert [(s["route"], s["reason"]) for s in shapes] == [(f"{mesh.ns}/two", "MultipleUDPPorts")]
    if cluster.bed is not None:  # the counter is readable when the operator runs in-process
        assert counted("MultipleUDPPorts") == before["MultipleUDPPorts"] + 1
        assert counted("WeightedSplit") == before["WeightedSplit"] and counted("Drained") == before["Drained"]


def test_weights_drain_no_live_backend_and_route_deleted(mesh: Mesh, cluster: Cluster) -> None:
    for i, name in enumerate("abc"):
        mesh.service(name, f"10.96.0.{20 + i}", [(f"10.1.0.{20 + i}", True, None)])

    def backends(arm: dict[str, Any]) -> list[tuple[str, int, float, str | None]]:
        return [(b["backend"], b["weight"], b["share"], b.get("reason")) for b in arm.get("backends") or []]

    mesh.route("r", "a", [o.backend("c", 53, 1), o.backend("b", 53, 3)])
    arm = mesh.wait_arm("a", f"udp-split:{mesh.ns}/a")
    assert arm["route"] == f"{mesh.ns}/r" and arm["vip"] == "10.96.0.20"
    assert backends(arm) == [(f"{mesh.ns}/b", 3, 75.0, None), (f"{mesh.ns}/c", 1, 25.0, None)]
    parent = wait_for(lambda: mesh.ours("r"), what="our status parent", ignore=READ_ERRORS)
    conds = {c["type"]: c for c in parent["conditions"]}
    assert parent["parentRef"] == {"group": "", "kind": "Service", "name": "a"}
    assert conds["Accepted"]["status"] == "True" and conds["Accepted"]["reason"] == "Accepted"
    assert conds["ResolvedRefs"]["status"] == "True" and conds["Accepted"]["observedGeneration"] >= 1
    assert set(conds) == {"Accepted", "ResolvedRefs"}  # a weighted split is supported: no shape condition
    shapes = cluster.state(mesh.n1)["udp"].get("unsupportedShapes", [])
    assert [s for s in shapes if s["route"] in (f"{mesh.ns}/r", f"{mesh.ns}/a")] == []

    mesh.route("r", "a", [o.backend("c", 53, 1), o.backend("b", 53, 0)])  # b drained
    wait_for(
        lambda: (
            backends(mesh.arm("a") or {}) == [(f"{mesh.ns}/b", 0, 0.0, "Drained"), (f"{mesh.ns}/c", 1, 100.0, None)]
        ),
        what="b drained",
        ignore=READ_ERRORS,
    )
    mesh.route("r", "a", [o.backend("c", 53, 1)])
    mesh.wait_arm("a", f"udp:{mesh.ns}/c")  # one backend: its own cluster
    cluster.apply(o.endpoint_slice(mesh.ns, "c", SL, [("10.1.0.22", False, None)]))  # c not live
    arm = mesh.wait_arm("a", "blackhole")
    assert arm["reason"] == "NoHealthyBackend" and arm["endpoints"] == []

    cluster.delete(*ROUTE, "r", mesh.ns)  # the parent gets its own arm back
    arm = mesh.wait_arm("a", f"udp:{mesh.ns}/a")
    assert "route" not in arm and arm["endpoints"] == [{"ip": "10.1.0.20", "port": 5353}]


def test_cross_namespace_backend_with_and_without_reference_grant(mesh: Mesh, cluster: Cluster) -> None:
    other = unique("ct-other")
    cluster.apply(o.namespace(other))
    mesh.service("front", "10.96.1.1", [("10.1.1.1", True, None)])
    mesh.service("x", "10.96.1.2", [("10.1.1.2", True, None)], ns=other)
    mesh.route("r", "front", [o.backend("x", 53, namespace=other)])
    mesh.wait_arm("front", "blackhole")
    resolved = wait_for(lambda: mesh.condition("r", "ResolvedRefs"), what="ResolvedRefs False", ignore=READ_ERRORS)
    assert (resolved["status"], resolved["reason"]) == ("False", "RefNotPermitted")
    cluster.apply(o.reference_grant(other, "allow", mesh.ns))
    arm = mesh.wait_arm("front", f"udp:{other}/x")
    assert arm["backend"] == f"{other}/x" and arm["endpoints"] == [{"ip": "10.1.1.2", "port": 5353}]
    wait_for(
        lambda: (mesh.condition("r", "ResolvedRefs") or {}).get("status") == "True",
        what="ResolvedRefs True",
        ignore=READ_ERRORS,
    )


def test_older_route_wins_and_the_other_is_told_with_an_event(mesh: Mesh, cluster: Cluster) -> None:
    for i, name in enumerate("pqs"):
        mesh.service(name, f"10.96.2.{i + 1}", [(f"10.1.2.{i + 1}", True, None)])
    mesh.route("r-a-first", "p", [o.backend("q", 53)])
    mesh.wait_arm("p", f"udp:{mesh.ns}/q")
    mesh.route("r-b-second", "p", [o.backend("s", 53)])
    # both Accepted (Gateway API v1.6.1 defines no route reason for a conflict; upstream's multiple-routes test)
    acc = wait_for(lambda: mesh.condition("r-b-second", "Accepted"), what="second route's status", ignore=READ_ERRORS)
    assert (acc["status"], acc["reason"]) == ("True", "Accepted") and "r-a-first" in acc["message"]
    assert (mesh.arm("p") or {})["cluster"] == f"udp:{mesh.ns}/q"

    def warning() -> list[Any]:
        events = cluster.res("v1", "Event").get(namespace=mesh.ns).to_dict()["items"]
        return [e for e in events if e["involvedObject"]["name"] == "r-b-second" and e["type"] == "Warning"]

    assert (
        "carries no traffic"
        in wait_for(warning, what="a Warning for the newer route", ignore=READ_ERRORS)[0]["message"]
    )


def test_other_controllers_parents_are_left_alone(mesh: Mesh, cluster: Cluster) -> None:
    mesh.service("g", "10.96.3.1", [("10.1.3.1", True, None)])
    foreign = {
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"},
        "controllerName": "example.com/gateway-controller",
        "conditions": [
            {
                "type": "Accepted",
                "status": "True",
                "reason": "Accepted",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "observedGeneration": 1,
            }
        ],
    }
    body = o.udproute(mesh.ns, "shared", "g", [o.backend("g", 53)])
    body["spec"]["parentRefs"].append({"name": "gw"})
    cluster.apply(body, status={"status": {"parents": [foreign]}})
    wait_for(lambda: mesh.ours("shared"), what="our parent added", ignore=READ_ERRORS)
    parents = ((cluster.route(mesh.ns, "shared") or {}).get("status") or {})["parents"]
    assert parents[0] == foreign and len(parents) == 2


def test_pod_moved_between_nodes_updates_both_meshnodes(mesh: Mesh, cluster: Cluster) -> None:
    def pods_on(node: str) -> list[str]:
        return [
            p["name"]
            for p in ((cluster.meshnode(node) or {}).get("status") or {}).get("pods", [])
            if p["namespace"] == mesh.ns
        ]

    wait_for(lambda: pods_on(mesh.n1) == ["client"], what="client on n1", ignore=READ_ERRORS)
    cluster.delete("v1", "Pod", "client", mesh.ns)  # nodeName is immutable: a moved pod is a new pod
    mesh.pod("client", mesh.n2, "10.0.0.3", "client")
    wait_for(lambda: pods_on(mesh.n2) == ["client"], what="client on n2", ignore=READ_ERRORS)
    wait_for(lambda: pods_on(mesh.n1) == [], what="client gone from n1", ignore=READ_ERRORS)
    ids = (cluster.meshnode(mesh.n1) or {})["status"]["quic"]["identities"]
    assert f"spiffe://cluster.local/ns/{mesh.ns}/sa/client" not in ids


def test_node_deleted_meshnode_gone(mesh: Mesh, cluster: Cluster) -> None:
    wait_for(lambda: cluster.meshnode(mesh.n2), what="MeshNode exists", ignore=READ_ERRORS)
    cluster.delete("v1", "Node", mesh.n2)
    wait_for(lambda: cluster.meshnode(mesh.n2) is None, what="MeshNode gone", ignore=READ_ERRORS)


def test_sidecar_owned_pairs_survive_and_unchanged_status_is_not_rewritten(
    mesh: Mesh, cluster: Cluster, operator: InProcessOperator
) -> None:
    mesh.service("w", "10.96.4.1", [("10.1.4.1", True, None)])
    mesh.wait_arm("w", f"udp:{mesh.ns}/w")
    pair = {"source": "spiffe://cluster.local/ns/x/sa/y", "destination": "x/web", "twin": "quic:x/web@y"}
    mn = cluster.res("mesh.aether.dev/v1alpha1", "MeshNode")
    mn.subresources["status"].patch(
        body={
            "status": {
                "quic": {"pairs": [pair], "pairCount": 1},
                "conditions": [{"type": "Programmed", "status": "True", "reason": "Served"}],
            }
        },
        name=mesh.n1,
        content_type="application/merge-patch+json",
    )
    mesh.service("w2", "10.96.4.2", [("10.1.4.2", True, None)])
    mesh.wait_arm("w2", f"udp:{mesh.ns}/w2")
    # the Service and its EndpointSlice may land in two passes: wait for the second one's write too
    wait_for(lambda: (mesh.arm("w2") or {}).get("endpoints"), what="w2's endpoints", ignore=READ_ERRORS)
    status = (cluster.meshnode(mesh.n1) or {})["status"]
    assert status["quic"]["pairs"] == [pair] and status["quic"]["pairCount"] == 1
    assert "Programmed" in [c["type"] for c in status["conditions"]]
    rec = operator.config.reconciler[0]
    # every write already due has landed: a resync has compared every MeshNode with the API since, and the loop is idle
    resyncs = rec.resyncs
    wait_for(lambda: rec.resyncs > resyncs and rec.idle.is_set(), timeout=15, what="a resync and an idle loop")
    writes, cycles = rec.node_writes, rec.cycles
    cluster.apply(
        {
            **o.pod(mesh.ns, "client", mesh.n1, "client"),
            "metadata": {"name": "client", "namespace": mesh.ns, "labels": {"touched": "yes"}},
        }
    )
    wait_for(lambda: rec.cycles > cycles and rec.idle.is_set(), what="a reconcile cycle ran", ignore=READ_ERRORS)
    assert rec.node_writes == writes, "a change that does not alter any status must not patch a MeshNode"
    assert operator.alive()


def test_meshnode_deleted_by_hand_is_made_again(mesh: Mesh, cluster: Cluster) -> None:
    mesh.service("h", "10.96.5.1", [("10.1.5.1", True, None)])
    mesh.wait_arm("h", f"udp:{mesh.ns}/h")
    cluster.delete("mesh.aether.dev/v1alpha1", "MeshNode", mesh.n1)
    mesh.wait_arm("h", f"udp:{mesh.ns}/h")
