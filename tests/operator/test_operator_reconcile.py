"""The pure reconcile: arms, GAMMA UDPRoute selection, QUIC destinations, dependency sets, incrementality."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aether.api.meshnode import EffectiveStatus, ServiceArm
from aether.operator.reconcile.model import ClusterModel, Output
from aether.testing.apitestbed import objects as o

UDP = [("dns", 53, "UDP")]
SLICE_UDP = [("dns", 5353, "UDP")]


def base(model: ClusterModel | None = None) -> ClusterModel:
    m = model or ClusterModel()
    m.apply_raw("namespace", o.namespace("app"))
    m.apply_raw("node", {"metadata": {"name": "n1", "uid": "u1"}})
    m.apply_raw("node", {"metadata": {"name": "n2", "uid": "u2"}})
    add_pod(m, "app", "client", "n1", "10.0.0.2", "client")
    for i, name in enumerate(["a", "b", "c"]):
        m.apply_raw("service", o.service("app", name, f"10.96.0.{10 + i}", UDP))
        m.apply_raw("slice", o.endpoint_slice("app", name, SLICE_UDP, [(f"10.1.0.{10 + i}", True, None)]))
    return m


def add_pod(m: ClusterModel, ns: str, name: str, node: str, ip: str, sa: str = "default") -> None:
    body = o.pod(ns, name, node, sa)
    body["metadata"]["uid"] = f"uid-{ns}-{name}"
    body.update(o.pod_status(ip))
    m.apply_raw("pod", body)


def route(
    m: ClusterModel, name: str, parent: str, backends: list[dict[str, Any]], created: str = "2026-01-01T00:00:00Z"
) -> None:
    body = o.udproute("app", name, parent, backends)
    body["metadata"].update({"generation": 1, "creationTimestamp": created})
    m.apply_raw("route", body)


def arms(status: EffectiveStatus) -> dict[str, ServiceArm]:
    return {a.service: a for a in status.udp.services}


def node_status(m: ClusterModel, node: str = "n1") -> EffectiveStatus:
    out = m.reconcile()
    if node in out.nodes:
        return out.nodes[node]
    return m.reconcile(full=True).nodes[node]


def test_plain_service_arm_points_at_its_own_ready_endpoints() -> None:
    m = base()
    a = arms(node_status(m))["app/a"]
    assert (a.vip, a.cluster, a.backend) == ("10.96.0.10", "udp:app/a", "app/a")
    assert [(e.ip, e.port) for e in a.endpoints] == [("10.1.0.10", 5353)]
    assert node_status(m, "n2").udp.services == []  # no meshed pod on n2: nothing to serve there


def test_one_live_backend_uses_its_own_cluster_and_an_empty_one_is_no_healthy_backend() -> None:
    """(Weighted splits: tests/operator/test_operator_weights.py.)"""
    m = base()
    route(m, "r", "a", [o.backend("b", 53, 3)])
    assert arms(node_status(m))["app/a"].cluster == "udp:app/b"
    m.apply_raw("slice", o.endpoint_slice("app", "b", SLICE_UDP, []))
    a = arms(node_status(m))["app/a"]
    assert (a.cluster, a.reason, a.endpoints) == ("blackhole", "NoHealthyBackend", [])


def test_cross_namespace_backend_needs_a_reference_grant() -> None:
    m = base()
    m.apply_raw("namespace", o.namespace("other"))
    m.apply_raw("service", o.service("other", "x", "10.96.1.1", UDP))
    m.apply_raw("slice", o.endpoint_slice("other", "x", SLICE_UDP, [("10.2.0.1", True, None)]))
    route(m, "r", "a", [o.backend("x", 53, 1, namespace="other")])
    out = m.reconcile(full=True)
    assert arms(out.nodes["n1"])["app/a"].cluster == "blackhole"
    v = out.routes[("app", "r")][0]
    assert (v.accepted, v.resolved, v.resolved_reason) == (True, False, "RefNotPermitted")
    m.apply_raw("grant", o.reference_grant("other", "g", "app"))
    out = m.reconcile()
    assert out.routes[("app", "r")][0].resolved
    assert arms(node_status(m))["app/a"].cluster == "udp:other/x"  # the slice changed, not n1's MeshNode


def test_older_route_wins_a_parent_and_deleting_it_hands_over_then_restores() -> None:
    m = base()
    route(m, "young", "a", [o.backend("c", 53)], created="2026-02-01T00:00:00Z")
    route(m, "old", "a", [o.backend("b", 53)], created="2026-01-01T00:00:00Z")
    out = m.reconcile(full=True)
    assert arms(out.nodes["n1"])["app/a"].cluster == "udp:app/b"
    young = out.routes[("app", "young")][0]
    assert (young.accepted, young.accepted_reason, young.chosen) == (True, "Accepted", None)
    m.apply_raw("route", {"metadata": {"namespace": "app", "name": "old"}}, deleted=True)
    assert arms(node_status(m))["app/a"].cluster == "udp:app/c"
    m.apply_raw("route", {"metadata": {"namespace": "app", "name": "young"}}, deleted=True)
    a = arms(node_status(m))["app/a"]
    assert (a.cluster, a.route) == ("udp:app/a", None)


def test_a_tie_in_age_goes_to_the_first_name_and_the_loser_is_told() -> None:
    m = base()
    route(m, "b-route", "a", [o.backend("c", 53)])
    route(m, "a-route", "a", [o.backend("b", 53)])  # same creationTimestamp
    out = m.reconcile(full=True)
    assert arms(out.nodes["n1"])["app/a"].route == "app/a-route"
    loser = out.routes[("app", "b-route")][0]
    assert (loser.accepted, loser.accepted_reason, loser.chosen) == (True, "Accepted", None)
    assert "app/a-route" in loser.accepted_message


def test_pod_moving_between_nodes_updates_both() -> None:
    m = base()
    m.reconcile(full=True)
    add_pod(m, "app", "client", "n2", "10.0.0.3", "client")
    out = m.reconcile()
    assert set(out.nodes) == {"n1", "n2"}
    assert out.nodes["n1"].pods == [] and out.nodes["n1"].quic.identities == []
    assert [p.name for p in out.nodes["n2"].pods] == ["client"]


def test_quic_identities_destinations_and_ineligible() -> None:
    m = base()
    add_pod(m, "app", "web-0", "n2", "10.0.1.7", "web")
    add_pod(m, "app", "web-1", "n2", "10.0.1.8", "web")
    add_pod(m, "app", "mix-0", "n2", "10.0.1.9", "web")
    add_pod(m, "app", "mix-1", "n2", "10.0.1.10", "other")
    m.apply_raw("service", o.service("app", "web", "10.96.0.20", [("http", 8080, "TCP")]))
    m.apply_raw(
        "slice",
        o.endpoint_slice(
            "app", "web", [("http", 8080, "TCP")], [("10.0.1.7", True, "web-0"), ("10.0.1.8", True, "web-1")]
        ),
    )
    m.apply_raw("service", o.service("app", "mix", "10.96.0.21", [("http", 8080, "TCP")]))
    m.apply_raw(
        "slice",
        o.endpoint_slice(
            "app", "mix", [("http", 8080, "TCP")], [("10.0.1.9", True, "mix-0"), ("10.0.1.10", True, "mix-1")]
        ),
    )
    m.apply_raw("service", o.service("app", "idle", "10.96.0.22", [("http", 8080, "TCP")]))
    s = m.reconcile(full=True).nodes["n1"]
    assert s.quic.identities == ["spiffe://cluster.local/ns/app/sa/client"]
    d = {x.service: x for x in s.quic.destinations}
    assert d["app/web"].service_account == "web" and d["app/web"].ports == [8080]
    assert [(e.ip, e.port) for e in d["app/web"].endpoints] == [("10.0.1.7", 18008), ("10.0.1.8", 18008)]
    assert {(x.service, x.reason) for x in s.quic.ineligible} == {
        ("app/mix", "MixedServiceAccounts"),
        ("app/idle", "NoReadyEndpoints"),
    }


def test_egress_annotation_scopes_the_dependency_set() -> None:
    m = base()
    m.apply_raw("namespace", o.namespace("far"))
    m.apply_raw("service", o.service("far", "f", "10.96.2.1", UDP))
    assert "far/f" in arms(m.reconcile(full=True).nodes["n1"])
    m.apply_raw("namespace", o.namespace("app", egress="app"))
    assert "far/f" not in arms(node_status(m))
    m.apply_raw("service", o.service("far", "g", "10.96.2.2", UDP))
    assert "n1" not in m.reconcile().nodes  # a change outside n1's dependency set does not touch it


def test_non_mesh_namespace_pods_and_services_are_ignored() -> None:
    m = base()
    m.apply_raw("namespace", o.namespace("plain", meshed=False))
    add_pod(m, "plain", "p", "n1", "10.0.0.9")
    m.apply_raw("service", o.service("plain", "s", "10.96.3.1", UDP))
    s = m.reconcile(full=True).nodes["n1"]
    assert [p.name for p in s.pods] == ["client"] and "plain/s" not in arms(s)


def test_multiple_udp_ports_use_the_first_by_name_and_are_reported() -> None:
    m = base()
    m.apply_raw("service", o.service("app", "multi", "10.96.0.30", [("zeta", 1, "UDP"), ("alpha", 2, "UDP")]))
    m.apply_raw(
        "slice",
        o.endpoint_slice("app", "multi", [("alpha", 20, "UDP"), ("zeta", 10, "UDP")], [("10.1.1.1", True, None)]),
    )
    s = m.reconcile(full=True).nodes["n1"]
    assert [(e.ip, e.port) for e in arms(s)["app/multi"].endpoints] == [("10.1.1.1", 20)]
    assert ("app/multi", "MultipleUDPPorts", ["app/multi:zeta"]) in [
        (x.route, x.reason, x.discarded) for x in s.udp.unsupported_shapes
    ]


# ---- properties ---------------------------------------------------------------------------------------

backend_st = st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b", "c", "d", "missing"]), "port": st.sampled_from([53, 54])},
    optional={
        "weight": st.one_of(st.integers(-5, 5), st.integers(0, 2_000_000), st.none(), st.text(max_size=2)),
        "namespace": st.sampled_from(["app", "other"]),
        "kind": st.sampled_from(["Service", "Gateway"]),
    },
)
route_st = st.tuples(st.sampled_from(["a", "b", "c", "d", "nope"]), st.lists(backend_st, max_size=5), st.integers(0, 3))


def world(routes: list[tuple[str, list[dict[str, Any]], int]], ready: list[bool]) -> ClusterModel:
    m = base()
    m.apply_raw("service", o.service("app", "d", "10.96.0.13", UDP))
    for name, ok in zip(["a", "b", "c", "d"], ready, strict=True):
        ip = {"a": "10.1.0.10", "b": "10.1.0.11", "c": "10.1.0.12", "d": "10.1.0.13"}[name]
        m.apply_raw("slice", o.endpoint_slice("app", name, SLICE_UDP, [(ip, ok, None)]))
    for i, (parent, backends, day) in enumerate(routes):
        route(m, f"r{i}", parent, backends, created=f"2026-01-0{day + 1}T00:00:00Z")
    return m


@settings(max_examples=60, deadline=None)
@given(st.lists(route_st, max_size=5), st.lists(st.booleans(), min_size=4, max_size=4))
def test_property_incremental_equals_full_and_is_deterministic(routes: list[Any], ready: list[bool]) -> None:
    m = world(routes, ready)
    first = m.reconcile()
    again = world(routes, ready).reconcile()
    assert first.nodes["n1"] == again.nodes["n1"]
    assert m.reconcile(full=True).nodes["n1"] == first.nodes["n1"]


@settings(max_examples=60, deadline=None)
@given(st.lists(route_st, max_size=5), st.lists(st.booleans(), min_size=4, max_size=4))
def test_property_every_backend_ref_is_in_the_split_or_the_arm(routes: list[Any], ready: list[bool]) -> None:
    """An accepted route's arm accounts for every backendRef: the one backend it points at, or one split entry per
    distinct (backend, port) whose shares add up to 100 (0 when every weight is 0); routes add no shapes."""
    m = world(routes, ready)
    out: Output = m.reconcile(full=True)
    status = out.nodes["n1"]
    assert not [x for x in status.udp.unsupported_shapes if x.route.split("/")[1].startswith("r")]
    by_service = arms(status)
    for key, verdicts in out.routes.items():
        accepted = [v for v in verdicts if v.accepted and v.routing]  # not a newer route an older one outranks
        if not accepted:
            continue
        arm = by_service[f"app/{accepted[0].parent.name}"]
        assert arm.route == f"{key[0]}/{key[1]}"
        split = arm.backends or []
        if split:
            weights = sum(b.weight for b in split)
            assert round(sum(b.share for b in split) * 100) == (10_000 if weights else 0)
            assert all(b.endpoints == [] for b in split if b.reason not in (None, "Drained"))


@settings(max_examples=60, deadline=None)
@given(st.lists(route_st, max_size=4), st.lists(st.booleans(), min_size=4, max_size=4), route_st)
def test_property_a_route_on_another_parent_never_changes_unrelated_arms(
    routes: list[Any], ready: list[bool], extra: Any
) -> None:
    before = arms(world(routes, ready).reconcile(full=True).nodes["n1"])
    after_model = world([*routes, extra], ready)
    after = arms(after_model.reconcile(full=True).nodes["n1"])
    for svc, arm in before.items():
        if svc != f"app/{extra[0]}":
            assert after[svc] == arm


json_st = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
hostile_route_st = st.fixed_dictionaries(
    {},
    optional={
        "spec": st.one_of(
            json_st,
            st.fixed_dictionaries(
                {},
                optional={
                    "parentRefs": st.one_of(
                        json_st,
                        st.lists(
                            st.one_of(
                                json_st,
                                st.fixed_dictionaries(
                                    {"name": st.sampled_from(["a", "b", "", "zz"])},
                                    optional={
                                        "kind": json_st | st.just("Service"),
                                        "group": json_st | st.just(""),
                                        "port": json_st | st.just(53),
                                        "sectionName": json_st,
                                        "namespace": json_st,
                                    },
                                ),
                            ),
                            max_size=3,
                        ),
                    ),
                    "rules": st.one_of(
                        json_st,
                        st.lists(
                            st.fixed_dictionaries(
                                {},
                                optional={
                                    "backendRefs": st.one_of(
                                        json_st, st.lists(st.one_of(json_st, backend_st), max_size=4)
                                    )
                                },
                            ),
                            max_size=3,
                        ),
                    ),
                },
            ),
        ),
        "status": json_st,
    },
)


@settings(max_examples=150, deadline=None)
@given(st.lists(hostile_route_st, max_size=4), st.lists(st.booleans(), min_size=4, max_size=4))
def test_property_hostile_route_json_never_crashes_and_every_route_gets_a_verdict(
    bodies: list[dict[str, Any]], ready: list[bool]
) -> None:
    m = world([("b", [o.backend("c", 53)], 0)], ready)
    before = arms(m.reconcile(full=True).nodes["n1"])["app/b"]
    for i, body in enumerate(bodies):
        body = {**body, "metadata": {"namespace": "app", "name": f"h{i}", "creationTimestamp": "2026-05-01T00:00:00Z"}}
        m.apply_raw("route", body)
    out = m.reconcile(full=True)
    for i, body in enumerate(bodies):
        spec = body.get("spec")
        refs = spec.get("parentRefs") if isinstance(spec, dict) else None
        claimed = (
            not isinstance(refs, list)
            or not refs
            or any(
                not isinstance(r, dict)
                or (r.get("kind") == "Service" and r.get("group", "x") in ("", "core"))
                or not isinstance(r.get("name"), str)
                or not r.get("name")
                or not isinstance(r.get("kind", ""), str)
                or not isinstance(r.get("group", ""), str)
                for r in refs
            )
        )
        if claimed:
            assert out.routes[("app", f"h{i}")], f"route h{i} got no condition: {body!r}"
        for v in out.routes[("app", f"h{i}")]:
            assert v.accepted_message and v.resolved_message
    assert arms(out.nodes["n1"])["app/b"] == before  # the older control route keeps its parent


@settings(max_examples=40, deadline=None)
@given(st.lists(route_st, max_size=4), st.lists(st.booleans(), min_size=4, max_size=4))
def test_property_meshnode_and_its_slices_are_the_whole_desired_state(routes: list[Any], ready: list[bool]) -> None:
    """What the reconciler writes (NodeDesired.owned: the node's own state and slice names; Output.slices: the
    shared tables) is, read back through api.slices.effective as the sidecar reads it, exactly the whole desired
    state of the model; equal statuses have equal digests; the MeshNode itself holds no arm."""
    from aether.api.meshnode import MeshNode
    from aether.api.slices import MeshServiceSlice, effective, problems_of
    from aether.operator.nodestatus import same_owned

    out = world(routes, ready).reconcile(full=True)
    again = world(routes, ready).reconcile(full=True)
    slices = {
        n: MeshServiceSlice.model_validate({"metadata": {"name": n}, "spec": spec})
        for n, spec in out.slices.items()
        if spec is not None
    }
    for name, desired in out.desired.items():
        node = MeshNode.model_validate({"metadata": {"name": name}, "status": desired.owned})
        assert node.status.udp.services == [] and node.status.quic.destinations == []
        assert problems_of(node, slices) == []
        got, want = effective(node, slices).status, desired.status()
        for part in ("udp", "tcp"):
            for field in ("services", "unsupported_shapes"):
                assert sorted(x.wire().__repr__() for x in getattr(getattr(got, part), field)) == sorted(
                    x.wire().__repr__() for x in getattr(getattr(want, part), field)
                ), (part, field)
        assert sorted(d.service for d in got.quic.destinations) == sorted(d.service for d in want.quic.destinations)
        assert got.quic.identities == want.quic.identities and got.pods == want.pods
        assert desired.digest == again.desired[name].digest
        stored = {**desired.owned, "quic": {**desired.owned["quic"], "pairs": [{"source": "s"}]}}
        assert same_owned(stored, desired.owned)


def test_new_discards_are_reported_once_until_they_change() -> None:
    m = base()
    m.apply_raw("service", o.service("app", "multi", "10.96.0.41", [("a", 1, "UDP"), ("b", 2, "UDP")]))
    assert m.reconcile().new_discards == {("app/multi", "app/multi:b", "MultipleUDPPorts")}
    m.apply_raw("service", o.service("app", "d", "10.96.0.40", UDP))
    assert m.reconcile().new_discards == set()  # still unsupported, not counted again
    route(m, "r", "a", [o.backend("b", 53, 2), o.backend("c", 53, 0)])
    assert m.reconcile().new_discards == set()  # weights and drain are supported: nothing counted
