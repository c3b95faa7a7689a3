"""Create/delete/update storms with operator restarts in the sequence end in the state the last event implies: a
hypothesis state machine drives the real control plane (routes created, deleted, re-created under their name,
edited, their status wiped, Services' endpoints flipped, Services re-created with a new ClusterIP; on the emulator
their ClusterIPs duplicated and given back, which a real allocator refuses) and restarts the real operator; at the end the API must hold
what a from-scratch reconcile of the final objects computes (every MeshNode's operator-owned status and every
route's entries under our controllerName, observedGeneration included).

Seen red on the old operator: a route deleted and created again kept no status, wiped status stayed wiped."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from aether.operator.nodestatus import same_owned
from aether.operator.reconcile.model import ClusterModel, Kind
from aether.operator.routestatus import CONTROLLER_NAME, comparable, parents_status
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.faults import Faults
from aether.testing.apitestbed.harness import MERGE, Cluster, InProcessOperator, unique
from aether.testing.wait import wait_for

UDP = [("dns", 53, "UDP")]
SL = [("dns", 5353, "UDP")]
GW = "gateway.networking.k8s.io/v1alpha2"
KINDS: dict[Kind, tuple[str, str]] = {
    "namespace": ("v1", "Namespace"),
    "node": ("v1", "Node"),
    "pod": ("v1", "Pod"),
    "service": ("v1", "Service"),
    "slice": ("discovery.k8s.io/v1", "EndpointSlice"),
    "route": (GW, "UDPRoute"),
    "grant": ("gateway.networking.k8s.io/v1beta1", "ReferenceGrant"),
}
ROUTES, SERVICES = ("r0", "r1", "r2"), ("s0", "s1", "s2")


def snapshot(k: Cluster) -> dict[str, list[dict[str, Any]]]:
    """Every object of the kinds the operator reads, and the MeshNodes, as listed through the API."""
    kinds: dict[str, tuple[str, str]] = {str(k): v for k, v in KINDS.items()}
    kinds["meshnode"] = ("mesh.aether.dev/v1alpha1", "MeshNode")
    return {kind: k.res(*gvk).get().to_dict()["items"] for kind, gvk in kinds.items()}


def differences(objs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What the API holds that a from-scratch reconcile of the same objects would not write."""
    model = ClusterModel()
    for kind in KINDS:
        for obj in objs[str(kind)]:
            model.apply_raw(kind, obj)
    out = model.reconcile(full=True)
    wrong = []
    stored = {m["metadata"]["name"]: m for m in objs["meshnode"]}
    for name, desired in out.desired.items():
        if not same_owned((stored.get(name) or {}).get("status"), desired.owned):
            wrong.append(f"MeshNode {name}")
    for route in objs["route"]:
        meta = route["metadata"]
        key = (meta["namespace"], meta["name"])
        verdicts = model.results[key[0]].route_verdicts.get(key, ()) if key[0] in model.results else ()
        existing = (route.get("status") or {}).get("parents") or []
        want = parents_status(verdicts, existing, meta["generation"], "")
        if comparable(want) != comparable(existing):
            wrong.append(f"UDPRoute {key[0]}/{key[1]}: {existing} != {want}")
    return wrong


class Storm(RuleBasedStateMachine):
    api: tuple[str, Faults | None]
    emulated: bool

    def __init__(self) -> None:
        super().__init__()
        self.k = Cluster(*self.api)
        self.ns, self.node = unique("storm"), unique("storm-node")
        self.op: InProcessOperator | None = None

    @initialize()
    def setup(self) -> None:
        self.k.apply(o.namespace(self.ns))
        self.k.apply(o.node(self.node))
        self.k.apply(o.pod(self.ns, "client", self.node), status=o.pod_status("10.95.0.2"))
        for i, name in enumerate(SERVICES):
            self.k.apply(self.service(name, f"10.96.95.{i + 1}"))
            self.k.apply(o.endpoint_slice(self.ns, name, SL, [(f"10.95.1.{i + 1}", True, None)]))

    def service(self, name: str, vip: str) -> dict[str, Any]:
        """The emulator takes the VIP asked for; the real allocator picks one (each example's namespace is new, and
        the last one's Services still hold theirs)."""
        body = o.service(self.ns, name, vip, UDP)
        if not self.emulated:
            del body["spec"]["clusterIP"]
        return body
        self.start()

    def start(self) -> None:
        self.op = InProcessOperator(self.api[0])
        self.op.start()

    @rule(name=st.sampled_from(ROUTES), parent=st.sampled_from(SERVICES), backend=st.sampled_from(SERVICES))
    def apply_route(self, name: str, parent: str, backend: str) -> None:
        self.k.apply(o.udproute(self.ns, name, parent, [o.backend(backend, 53)]))

    @rule(name=st.sampled_from(ROUTES), weight=st.integers(0, 9))
    def reweigh(self, name: str, weight: int) -> None:
        route = self.k.route(self.ns, name)
        if route is not None:
            refs = route["spec"]["rules"][0]["backendRefs"]
            self.k.apply(
                o.udproute(self.ns, name, route["spec"]["parentRefs"][0]["name"], [{**refs[0], "weight": weight}])
            )

    @rule(name=st.sampled_from(ROUTES))
    def delete_route(self, name: str) -> None:
        self.k.delete(GW, "UDPRoute", name, self.ns)

    @rule(name=st.sampled_from(ROUTES))
    def wipe_status(self, name: str) -> None:
        if self.k.route(self.ns, name) is not None:
            res = self.k.res(GW, "UDPRoute").subresources["status"]
            res.patch(body={"status": {"parents": []}}, name=name, namespace=self.ns, content_type=MERGE)

    @rule(svc=st.sampled_from(SERVICES), ready=st.booleans())
    def flip_endpoints(self, svc: str, ready: bool) -> None:
        i = SERVICES.index(svc)
        self.k.apply(o.endpoint_slice(self.ns, svc, SL, [(f"10.95.1.{i + 1}", ready, None)]))

    @rule(svc=st.sampled_from(SERVICES), like=st.sampled_from(SERVICES))
    def take_vip(self, svc: str, like: str) -> None:
        """Emulated: give `svc` the ClusterIP of `like` (a duplicate VIP, or its own back when svc == like). Real: a
        ClusterIP is immutable and the allocator refuses a taken one, so `svc` is re-created with a new one."""
        if self.emulated:
            self.k.apply(o.service(self.ns, svc, f"10.96.95.{SERVICES.index(like) + 1}", UDP))
            return
        self.k.delete("v1", "Service", svc, self.ns)
        wait_for(lambda: self.k.get("v1", "Service", svc, self.ns) is None, what=f"Service {svc} deleted")
        self.k.apply(self.service(svc, ""))

    @rule()
    def restart(self) -> None:
        if self.op is not None:
            self.op.stop()
        self.start()

    def teardown(self) -> None:
        try:
            if self.op is not None:
                wrong = wait_for(
                    lambda: not differences(snapshot(self.k)) or None,
                    timeout=15,
                    what="the API converged to a from-scratch reconcile",
                    diagnose=lambda: "\n".join(differences(snapshot(self.k))),
                )
                assert wrong
                assert self.op.alive()
        finally:
            if self.op is not None:
                self.op.stop()


def test_storms_with_restarts_end_in_the_state_the_last_event_implies(
    api: tuple[str, Faults | None], api_kind: str
) -> None:
    Storm.api, Storm.emulated = api, api_kind == "emulated"
    run_state_machine_as_test(
        Storm,
        settings=settings(
            max_examples=4, stateful_step_count=12, deadline=None, suppress_health_check=list(HealthCheck)
        ),
    )
    assert CONTROLLER_NAME
