"""UDPRoute API versions (Gateway API v1.6: v1 is GA; the standard channel serves v1 only, the experimental channel v1
and the deprecated v1alpha2): the real operator, against a test bed with each channel's CRD, watches the most
preferred version served (v1 before v1alpha2) and writes status through it. A route applied through any served
version gets its arm and its status (observedGeneration included), read back through the version the cluster serves.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest

from aether.api.client import ApiException
from aether.operator.routestatus import CONTROLLER_NAME
from aether.testing.apitestbed import TestBed, start
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.wait import wait_for

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("AETHER_KUBECONFIG")), reason="installs its own Gateway API CRDs on the API test bed"
)

UDP = [("dns", 53, "UDP")]
SL = [("dns", 5353, "UDP")]
GROUP = "gateway.networking.k8s.io"

# (channel, the version a route is applied through, the version the operator must watch and write through)
CASES = [
    ("standard", "v1", "v1"),
    ("experimental", "v1", "v1"),
    ("experimental", "v1alpha2", "v1"),
    (None, "v1alpha2", "v1alpha2"),  # the default test CRD: v1alpha2 only (a cluster before Gateway API v1.6)
]


@pytest.fixture(scope="module")
def bed(request: pytest.FixtureRequest) -> Iterator[tuple[TestBed, Cluster]]:
    """One test bed with `channel`'s UDPRoute CRD and one operator, shared by that channel's cases."""
    channel: str | None = request.param
    tb = start(channel=channel)
    op = InProcessOperator(str(tb.kubeconfig_path))
    op.start()
    try:
        yield tb, Cluster(str(tb.kubeconfig_path), tb)
        assert op.alive(), op.error
    finally:
        op.stop()
        tb.stop()


_VIPS = itertools.count(10, 3)


def _mesh(k: Cluster) -> tuple[str, str]:
    """A namespace with a client pod on a node, a parent Service `dns` and backends `dns-v2`, `dns-v3` (ClusterIPs
    unique across the module: its tests share one test bed, and a repeated VIP is a DuplicateVIP)."""
    ns, node = unique("ver"), unique("node")
    base = next(_VIPS)
    k.apply(o.namespace(ns))
    k.apply(o.node(node))
    k.apply(o.pod(ns, "client", node), status=o.pod_status("10.0.0.2"))
    for i, name in enumerate(("dns", "dns-v2", "dns-v3")):
        k.apply(o.service(ns, name, f"10.96.0.{base + i}", UDP))
        k.apply(o.endpoint_slice(ns, name, SL, [(f"10.1.0.{base + i}", True, None)]))
    return ns, node


def _two_rules(ns: str, version: str) -> dict[str, Any]:
    route = o.udproute(ns, "two", "dns", [o.backend("dns-v2", 53, weight=2)], version=version)
    route["spec"]["rules"].append({"backendRefs": [o.backend("dns-v3", 53, weight=1)]})
    return route


def _ours(route: dict[str, Any] | None) -> dict[str, Any] | None:
    parents = ((route or {}).get("status") or {}).get("parents") or []
    return next((p for p in parents if p.get("controllerName") == CONTROLLER_NAME), None)


def _accepted_at(k: Cluster, ns: str, name: str, version: str, generation: int) -> dict[str, Any] | None:
    route = k.route(ns, name, version)
    ours = _ours(route) or {}
    conds = {c["type"]: c for c in ours.get("conditions") or []}
    accepted = conds.get("Accepted") or {}
    if accepted.get("status") != "True" or any(c.get("observedGeneration") != generation for c in conds.values()):
        return None
    return route


@pytest.mark.parametrize(
    ("bed", "applied", "watched"), CASES, ids=[f"{c or 'default'}-{a}" for c, a, _w in CASES], indirect=["bed"]
)
def test_route_served_through_the_version_the_cluster_serves(
    bed: tuple[TestBed, Cluster], applied: str, watched: str
) -> None:
    tb, k = bed
    ns, node = _mesh(k)
    k.apply(o.udproute(ns, "r", "dns", [o.backend("dns-v2", 53)], version=applied))

    def arm() -> dict[str, Any] | None:
        a = k.arm(node, f"{ns}/dns")
        return a if a and a["cluster"] == f"udp:{ns}/dns-v2" else None

    wait_for(arm, what=f"the route's arm (applied as {applied})", ignore=READ_ERRORS)
    route = wait_for(lambda: _accepted_at(k, ns, "r", watched, 1), what=f"Accepted at generation 1 through {watched}")
    assert route["apiVersion"] == f"{GROUP}/{watched}"

    # a spec change: the conditions follow the new generation, still written through the watched version
    k.apply(o.udproute(ns, "r", "dns", [o.backend("dns-v2", 53, weight=2)], version=applied))
    wait_for(lambda: _accepted_at(k, ns, "r", watched, 2), what=f"observedGeneration 2 through {watched}")

    writes = {
        r.path.split("/")[3]
        for r in tb.audit
        if r.user_agent == "aether-operator" and r.resource == "udproutes" and r.subresource == "status"
    }
    assert writes == {watched}, writes
    watches = {r.path.split("/")[3] for r in tb.audit if r.resource == "udproutes" and r.verb in ("list", "watch")}
    assert watches == {watched}, watches


@pytest.mark.parametrize("bed", ["experimental"], indirect=True)
def test_v1alpha2_route_with_two_rules_served_as_one_set_and_reported(bed: tuple[TestBed, Cluster]) -> None:
    """v1alpha2 admits up to 16 rules; a UDPRoute rule has no matches, so every rule applies: the rules' backendRefs
    are one set, split by weight as for one rule; the Accepted message says so, through v1."""
    _tb, k = bed
    ns, node = _mesh(k)
    k.apply(_two_rules(ns, "v1alpha2"))
    arm = wait_for(
        lambda: (a := k.arm(node, f"{ns}/dns")) and a["cluster"] == f"udp-split:{ns}/dns" and a,
        what="the split arm of two rules",
        ignore=READ_ERRORS,
    )
    assert [(b["backend"], b["weight"], b["share"]) for b in arm["backends"]] == [
        (f"{ns}/dns-v2", 2, 66.67),
        (f"{ns}/dns-v3", 1, 33.33),
    ]
    route = wait_for(lambda: _accepted_at(k, ns, "two", "v1", 1), what="Accepted through v1")
    conds = {c["type"]: c for c in (_ours(route) or {})["conditions"]}
    assert "2 rules" in conds["Accepted"]["message"], conds
    assert f"{ns}/dns-v2 66.67%, {ns}/dns-v3 33.33%" in conds["Accepted"]["message"], conds
    assert "mesh.aether.dev/UnsupportedShape" not in conds, conds
    assert len(route["spec"]["rules"]) == 2  # read through v1, written back through v1: the rules are kept


@pytest.mark.parametrize("bed", ["standard"], indirect=True)
def test_v1_refuses_a_second_rule(bed: tuple[TestBed, Cluster]) -> None:
    _tb, k = bed
    ns, _node = _mesh(k)
    with pytest.raises(ApiException) as refused:
        k.apply(_two_rules(ns, "v1"))
    assert refused.value.status == 422 and "spec.rules" in str(refused.value.body)


@pytest.mark.parametrize("bed", ["experimental"], indirect=True)
def test_a_route_read_as_one_version_and_written_back_keeps_its_fields(bed: tuple[TestBed, Cluster]) -> None:
    """Applied as v1alpha2 with every field a user may set (labels, annotations, a parentRef's sectionName and port,
    weights), plus another controller's entry in status.parents; the operator reads it as v1 and writes its status
    through v1. Read back as v1alpha2: the spec, metadata and the other controller's entry are what was applied."""
    tb, k = bed
    ns, _node = _mesh(k)
    route = o.udproute(ns, "full", "dns", [o.backend("dns-v2", 53, weight=3), o.backend("dns-v3", 53, weight=1)])
    route["apiVersion"] = f"{GROUP}/v1alpha2"
    route["metadata"]["labels"] = {"team": "dns"}
    route["metadata"]["annotations"] = {"example.com/owner": "dns-team"}
    route["spec"]["parentRefs"][0].update({"sectionName": "dns", "port": 53})
    other = {
        "parentRef": {"group": "", "kind": "Service", "name": "dns"},
        "controllerName": "example.com/other-mesh",
        "conditions": [
            {
                "type": "Accepted",
                "status": "False",
                "reason": "NotMine",
                "message": "another controller's view",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "observedGeneration": 1,
            }
        ],
    }
    k.apply(route, status={"status": {"parents": [other]}})
    wait_for(
        lambda: _accepted_at(k, ns, "full", "v1", 1),
        what="Accepted through v1",
        diagnose=lambda: repr((k.route(ns, "full", "v1") or {}).get("status")),
    )
    back = k.route(ns, "full", "v1alpha2")
    assert back is not None
    assert back["spec"] == route["spec"]
    assert back["metadata"]["labels"] == {"team": "dns"}
    assert back["metadata"]["annotations"]["example.com/owner"] == "dns-team"
    parents = back["status"]["parents"]
    assert other in parents, parents
    assert _ours(back) is not None
    writes = {r.path.split("/")[3] for r in tb.audit if r.user_agent == "aether-operator" and r.resource == "udproutes"}
    assert writes == {"v1"}, writes

    # drift: someone replaces status.parents with the other controller's entry alone; ours comes back beside it
    k.apply(route, status={"status": {"parents": [other]}})
    again = wait_for(
        lambda: (r := k.route(ns, "full", "v1alpha2")) and _ours(r) and r,
        what="our status entry restored after it was overwritten",
        diagnose=lambda: repr((k.route(ns, "full", "v1") or {}).get("status")),
    )
    assert other in again["status"]["parents"]
