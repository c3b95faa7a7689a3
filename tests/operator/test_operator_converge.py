"""Level-based reconcile: what the API stores converges to what the operator computes, however it diverged.

Drift of MeshNode status and of UDPRoute status.parents (a user's patch) is undone within the resync bound of
docs/operator.md (RESYNC_BOUND); a lost status write is retried; observedGeneration is the generation the verdict
was computed from; a route deleted and created again under its name gets its status; a write the API refuses for
one object (422) is tried once per change and never holds back another object."""

from __future__ import annotations

from typing import Any

import pytest

from aether.metrics import REGISTRY
from aether.operator.routestatus import CONTROLLER_NAME, comparable
from aether.testing.apitestbed import Fault
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.faults import Faults
from aether.testing.apitestbed.harness import MERGE, READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.wait import wait_for

UDP = [("dns", 53, "UDP")]
SL = [("dns", 5353, "UDP")]
ROUTE = ("gateway.networking.k8s.io/v1alpha2", "UDPRoute")
MESHNODE = ("mesh.aether.dev/v1alpha1", "MeshNode")
SLICE = ("mesh.aether.dev/v1alpha1", "MeshServiceSlice")
RESYNC_BOUND = 5.0  # docs/operator.md, "Convergence"


class Mesh:
    def __init__(self, k: Cluster) -> None:
        self.k, self.ns, self.node = k, unique("cv"), unique("cv-node")
        k.apply(o.namespace(self.ns))
        k.apply(o.node(self.node))
        k.apply(o.pod(self.ns, "client", self.node, "client"), status=o.pod_status("10.70.0.2"))

    def service(self, name: str, vip: str, ip: str) -> None:
        self.k.apply(o.service(self.ns, name, vip, UDP))
        self.k.apply(o.endpoint_slice(self.ns, name, SL, [(ip, True, None)]))

    def arms(self) -> dict[str, dict[str, Any]]:
        arms = (self.k.state(self.node).get("udp") or {}).get("services") or []
        return {a["service"]: a for a in arms if a["service"].startswith(f"{self.ns}/")}

    def ours(self, route: str) -> dict[str, Any] | None:
        r = self.k.route(self.ns, route) or {}
        parents = (r.get("status") or {}).get("parents") or []
        return next((p for p in parents if p.get("controllerName") == CONTROLLER_NAME), None)

    def conditions(self, route: str) -> dict[str, dict[str, Any]]:
        return {c["type"]: c for c in (self.ours(route) or {}).get("conditions") or []}

    def patch_status(self, api_version: str, kind: str, name: str, body: dict[str, Any], ns: str | None) -> None:
        res = self.k.res(api_version, kind).subresources["status"]
        res.patch(body=body, name=name, namespace=ns, content_type=MERGE)

    def generation(self, route: str) -> int:
        return int(((self.k.route(self.ns, route) or {}).get("metadata") or {}).get("generation") or 0)


@pytest.fixture
def mesh(cluster: Cluster) -> Mesh:
    return Mesh(cluster)


def bed_of(api: tuple[str, Faults | None]) -> Faults:
    if api[1] is None:
        pytest.skip("needs fault injection (the fault proxy or the API test bed), not a cluster of your own")
    return api[1]


def settled(pred: Any, what: str, within: float = RESYNC_BOUND) -> Any:
    return wait_for(pred, timeout=within, what=what, ignore=READ_ERRORS)


def test_meshnode_status_drift_is_undone(mesh: Mesh) -> None:
    mesh.service("a", "10.96.70.1", "10.70.1.1")
    mesh.service("b", "10.96.70.2", "10.70.1.2")
    want = wait_for(lambda: (arms := mesh.arms()) and len(arms) == 2 and arms, what="two arms", ignore=READ_ERRORS)
    pods = (mesh.k.meshnode(mesh.node) or {})["status"]["pods"]
    mesh.patch_status(*MESHNODE, mesh.node, {"status": {"pods": []}}, None)
    settled(lambda: (mesh.k.meshnode(mesh.node) or {})["status"]["pods"] == pods, "the wiped pods written back")

    # the arms are in the namespace's MeshServiceSlice (a MeshNode has none): a rewritten arm there is put back
    (name,) = [s["metadata"]["name"] for s in mesh.k.slices() if s["spec"]["namespace"] == mesh.ns]
    arms = next(s for s in mesh.k.slices() if s["metadata"]["name"] == name)["spec"]["udp"]["services"]
    evil = [{**a, "cluster": "udp:evil/x"} if a["service"] == f"{mesh.ns}/a" else a for a in arms]
    mesh.k.res(*SLICE).patch(body={"spec": {"udp": {"services": evil}}}, name=name, content_type=MERGE)
    settled(lambda: mesh.arms() == want, "the rewritten arm put back")

    conds = (mesh.k.meshnode(mesh.node) or {})["status"]["conditions"]
    flipped = [{**c, "status": "False", "reason": "Hacked"} if c["type"] == "Ready" else c for c in conds]
    mesh.patch_status(*MESHNODE, mesh.node, {"status": {"conditions": flipped}}, None)

    def ready() -> bool:
        cs = (mesh.k.meshnode(mesh.node) or {})["status"]["conditions"]
        return any(c["type"] == "Ready" and c["status"] == "True" and c["reason"] == "Reconciled" for c in cs)

    settled(ready, "Ready=True written back")


def test_route_status_drift_is_undone(mesh: Mesh) -> None:
    mesh.service("front", "10.96.70.11", "10.70.1.11")
    mesh.service("back", "10.96.70.12", "10.70.1.12")
    mesh.k.apply(o.udproute(mesh.ns, "r", "front", [o.backend("back", 53)]))
    want = wait_for(lambda: mesh.ours("r"), what="the route's status", ignore=READ_ERRORS)
    mesh.patch_status(*ROUTE, "r", {"status": {"parents": []}}, mesh.ns)
    settled(lambda: comparable([mesh.ours("r")]) == comparable([want]), "the wiped status.parents written back")
    want = wait_for(lambda: mesh.ours("r"), what="the route's status", ignore=READ_ERRORS)

    # a fake Accepted=True entry under our controllerName for a parent the route does not name
    accepted: dict[str, Any] = {
        "type": "Accepted",
        "status": "True",
        "reason": "Accepted",
        "message": "fake",
        "observedGeneration": 1,
        "lastTransitionTime": "2020-01-01T00:00:00Z",
    }
    fake = {
        "parentRef": {"group": "", "kind": "Service", "name": "ghost"},
        "controllerName": CONTROLLER_NAME,
        "conditions": [accepted],
    }
    other = {  # the parentRef as the server stores it: the CRD defaults group and kind
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"},
        "controllerName": "example.com/other",
        "conditions": [{**accepted, "message": "someone else's"}],
    }
    mesh.patch_status(*ROUTE, "r", {"status": {"parents": [want, fake, other]}}, mesh.ns)

    def cleaned() -> bool:
        parents = ((mesh.k.route(mesh.ns, "r") or {}).get("status") or {}).get("parents") or []
        return parents == [other, want]

    settled(cleaned, "the fake entry gone, the other controller's kept")


def test_a_lost_route_status_write_is_retried(mesh: Mesh, api: tuple[str, Faults | None]) -> None:
    bed = bed_of(api)
    mesh.service("front", "10.96.70.21", "10.70.1.21")
    fault = bed.inject(Fault(500, verb="patch", plural="udproutes", subresource="status", namespace=mesh.ns))
    mesh.k.apply(o.udproute(mesh.ns, "r", "front", [o.backend("front", 53)]))
    wait_for(lambda: fault.hits == 1, what="the injected 500")
    settled(lambda: mesh.conditions("r").get("Accepted"), "the route's status after the lost write")


def test_observed_generation_is_the_generation_of_the_verdict(mesh: Mesh) -> None:
    mesh.service("front", "10.96.70.31", "10.70.1.31")
    mesh.k.apply(o.udproute(mesh.ns, "r", "front", [o.backend("front", 53, weight=1)]))
    wait_for(lambda: mesh.conditions("r").get("Accepted"), what="the route's status", ignore=READ_ERRORS)
    mesh.k.apply(o.udproute(mesh.ns, "r", "front", [o.backend("front", 53, weight=7)]))  # same verdict
    assert mesh.generation("r") == 2

    def tracks(route: str, generation: int) -> bool:
        conds = mesh.conditions(route)
        return bool(conds) and all(c["observedGeneration"] == generation for c in conds.values())

    settled(lambda: tracks("r", 2), "observedGeneration 2 after a change that keeps the verdict")

    mesh.k.apply(o.udproute(mesh.ns, "rejected", "missing", [o.backend("front", 53)]))
    wait_for(lambda: mesh.conditions("rejected").get("Accepted"), what="the rejection", ignore=READ_ERRORS)
    mesh.k.apply(o.udproute(mesh.ns, "rejected", "missing", [o.backend("front", 53, weight=3)]))
    settled(lambda: tracks("rejected", 2), "observedGeneration 2 on the edited rejected route")


def test_a_route_deleted_and_created_again_gets_its_status(mesh: Mesh) -> None:
    mesh.service("front", "10.96.70.41", "10.70.1.41")
    for _ in range(3):
        mesh.k.apply(o.udproute(mesh.ns, "r", "front", [o.backend("front", 53)]))
        wait_for(lambda: mesh.conditions("r").get("Accepted"), what="the route's status", ignore=READ_ERRORS)
        mesh.k.delete(*ROUTE, "r", mesh.ns)
        wait_for(lambda: mesh.k.route(mesh.ns, "r") is None, what="the route gone")
    mesh.k.apply(o.udproute(mesh.ns, "r", "front", [o.backend("front", 53)]))
    settled(lambda: mesh.conditions("r").get("Accepted"), "the re-created route's status")


def _refused(kind: str) -> float:
    return REGISTRY.get_sample_value("aether_operator_write_refusals_total", {"kind": kind}) or 0.0


def test_a_refused_write_is_tried_once_per_change_and_blocks_nothing(
    mesh: Mesh, api: tuple[str, Faults | None], operator: InProcessOperator
) -> None:
    bed = bed_of(api)
    rec = operator.config.reconciler[0]
    mesh.service("front", "10.96.70.51", "10.70.1.51")
    mesh.service("side", "10.96.70.52", "10.70.1.52")
    before = _refused("udproute")
    fault = bed.inject(
        Fault(422, verb="patch", plural="udproutes", subresource="status", name="bad", namespace=mesh.ns, times=0)
    )
    try:
        mesh.k.apply(o.udproute(mesh.ns, "bad", "front", [o.backend("front", 53)]))
        mesh.k.apply(o.udproute(mesh.ns, "good", "side", [o.backend("side", 53)]))
        settled(lambda: mesh.conditions("good").get("Accepted"), "the good route's status beside the refused one")
        wait_for(lambda: fault.hits >= 1, what="the refused write")
        # a change elsewhere in the namespace, then two resyncs: the refused body is not sent again
        mesh.service("third", "10.96.70.53", "10.70.1.53")
        wait_for(lambda: f"{mesh.ns}/third" in mesh.arms(), what="the third arm", ignore=READ_ERRORS)
        resyncs = rec.resyncs
        wait_for(lambda: rec.resyncs >= resyncs + 2 and rec.idle.is_set(), timeout=3 * RESYNC_BOUND, what="resyncs")
        assert fault.hits == 1 and _refused("udproute") == before + 1
        # a change of the route: tried again, once
        mesh.k.apply(o.udproute(mesh.ns, "bad", "front", [o.backend("front", 53, weight=2)]))
        wait_for(lambda: fault.hits == 2, what="the changed route's write tried again")
        wait_for(lambda: _refused("udproute") == before + 2, what="the second refusal counted")
    finally:
        bed.clear_faults()
    # the same body is not sent again; the next change of the route is, and the API now takes it
    mesh.k.apply(o.udproute(mesh.ns, "bad", "front", [o.backend("front", 53, weight=3)]))
    settled(lambda: mesh.conditions("bad").get("Accepted"), "the route's status once the API accepts it")
