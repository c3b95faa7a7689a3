"""UDPRoute API versions (Gateway API v1.6: v1 is GA; the standard channel serves v1 only, the experimental channel v1
and the deprecated v1alpha2): the real operator, against a real control plane with each channel's upstream CRDs
(`controlplane.start(channel=...)`; `AETHER_CONTROL_PLANE=emulated`: the API test bed with its test copies), watches
the most preferred version served (v1 before v1alpha2) and writes status through it. A route applied through any
served version gets its arm and its status (observedGeneration included), read back through the version the cluster
serves. A cluster before Gateway API v1.6 (v1alpha2 only) is upstream v1.5.1's experimental UDPRoute CRD, unchanged
(the test bed: its default test CRD).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aether.api.client import ApiException
from aether.api.crdgen import crds_dir
from aether.operator.routestatus import CONTROLLER_NAME
from aether.testing.apiserver import Kind, Server, api_server
from aether.testing.apitestbed import AuditRecord
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.controlplane.cluster import gateway_api_crds, mesh_crds
from aether.testing.wait import wait_for

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("AETHER_KUBECONFIG")), reason="installs its own Gateway API CRDs on a control plane of its own"
)

UDP = [("dns", 53, "UDP")]
SL = [("dns", 5353, "UDP")]
GROUP = "gateway.networking.k8s.io"
Bed = tuple[Server, Cluster]

# (channel, the version a route is applied through, the version the operator must watch and write through)
CASES = [
    ("standard", "v1", "v1"),
    ("experimental", "v1", "v1"),
    ("experimental", "v1alpha2", "v1"),
    (None, "v1alpha2", "v1alpha2"),  # a cluster before Gateway API v1.6: v1alpha2 only
]


def before_v1_6() -> list[Path]:
    """What a cluster serves before Gateway API v1.6: upstream v1.5.1's experimental UDPRoute CRD (v1alpha2 only,
    vendored unchanged in crds/gateway-api/v1.5.1/), beside the current ReferenceGrant CRD."""
    udproute = crds_dir() / "gateway-api" / "v1.5.1" / "experimental" / "gateway.networking.k8s.io_udproutes.yaml"
    return [udproute, *(p for p in gateway_api_crds("experimental") if not p.name.endswith("_udproutes.yaml"))]


@contextlib.contextmanager
def channel_server(kind: Kind, channel: str | None, workdir: Path) -> Iterator[Server]:
    if kind == "real" and channel is None:
        with api_server("real", crds=False) as server:
            assert server.control_plane is not None
            server.control_plane.install(mesh_crds() + before_v1_6())
            yield server
        return
    with api_server(kind, channel=channel) as server:
        yield server


def audit(server: Server) -> list[AuditRecord]:
    if server.control_plane is not None:
        return server.control_plane.audit
    assert server.bed is not None
    return server.bed.audit


def operator_requests(server: Server) -> list[AuditRecord]:
    """The operator's UDPRoute requests (its writes say aether-operator, kopf's lists and watches kopf/...), not
    those of any other client of a real server (the controller manager's included)."""
    return [
        r
        for r in audit(server)
        if r.resource == "udproutes" and (r.user_agent == "aether-operator" or r.user_agent.startswith("kopf"))
    ]


@pytest.fixture(scope="module")
def servers(api_kind: Kind, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str | None], Bed]]:
    """One API server per channel, each with its own operator, started when a test first asks for that channel and
    shared by its cases until the module ends (pytest does not group indirect parameters across functions)."""
    with contextlib.ExitStack() as stack:
        started: dict[str | None, Bed] = {}
        ops: dict[str | None, InProcessOperator] = {}

        def get(channel: str | None) -> Bed:
            if channel not in started:
                workdir = tmp_path_factory.mktemp("crds")
                server = stack.enter_context(channel_server(api_kind, channel, workdir))
                op = InProcessOperator(server.kubeconfig)
                op.start()
                stack.callback(op.stop)
                started[channel] = (server, Cluster(server.kubeconfig, server.faults))
                ops[channel] = op
            return started[channel]

        yield get
        for channel, op in ops.items():
            assert op.alive(), (channel, op.error)


@pytest.fixture
def bed(request: pytest.FixtureRequest, servers: Callable[[str | None], Bed]) -> Bed:
    """The API server with `channel`'s UDPRoute CRD and its operator."""
    return servers(request.param)


_VIPS = itertools.count(10, 3)


def _mesh(k: Cluster, emulated: bool) -> tuple[str, str]:
    """A namespace with a client pod on a node, a parent Service `dns` and backends `dns-v2`, `dns-v3` (on the test
    bed, which has no allocator, ClusterIPs unique across the module: a repeated VIP is a DuplicateVIP; on the real
    server the allocator picks them)."""
    ns, node = unique("ver"), unique("node")
    base = next(_VIPS)
    k.apply(o.namespace(ns))
    k.apply(o.node(node))
    k.apply(o.pod(ns, "client", node), status=o.pod_status("10.0.0.2"))
    for i, name in enumerate(("dns", "dns-v2", "dns-v3")):
        k.apply(o.service(ns, name, f"10.96.0.{base + i}" if emulated else None, UDP))
        k.apply(o.endpoint_slice(ns, name, SL, [(f"10.1.0.{base + i}", True, None)]))
    return ns, node


def upstream_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` as a real server stores it under upstream's CRD: each backendRef's group and kind defaulted (the test
    bed's test copy defaults nothing)."""
    rules = [
        {**rule, "backendRefs": [{"group": "", "kind": "Service", **ref} for ref in rule["backendRefs"]]}
        for rule in spec["rules"]
    ]
    return {**spec, "rules": rules}


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
def test_route_served_through_the_version_the_cluster_serves(bed: Bed, applied: str, watched: str) -> None:
    server, k = bed
    ns, node = _mesh(k, server.bed is not None)
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

    requests = operator_requests(server)
    writes = {r.path.split("/")[3] for r in requests if r.user_agent == "aether-operator" and r.subresource == "status"}
    assert writes == {watched}, writes
    watches = {r.path.split("/")[3] for r in requests if r.verb in ("list", "watch")}
    assert watches == {watched}, watches


@pytest.mark.parametrize("bed", ["experimental"], indirect=True)
def test_v1alpha2_route_with_two_rules_served_as_one_set_and_reported(bed: Bed) -> None:
    """v1alpha2 admits up to 16 rules; a UDPRoute rule has no matches, so every rule applies: the rules' backendRefs
    are one set, split by weight as for one rule; the Accepted message says so, through v1."""
    server, k = bed
    ns, node = _mesh(k, server.bed is not None)
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
def test_v1_refuses_a_second_rule(bed: Bed) -> None:
    server, k = bed
    ns, _node = _mesh(k, server.bed is not None)
    with pytest.raises(ApiException) as refused:
        k.apply(_two_rules(ns, "v1"))
    assert refused.value.status == 422 and "spec.rules" in str(refused.value.body)


@pytest.mark.parametrize("bed", ["experimental"], indirect=True)
def test_a_route_read_as_one_version_and_written_back_keeps_its_fields(bed: Bed) -> None:
    """Applied as v1alpha2 with every field a user may set (labels, annotations, a parentRef's sectionName and port,
    weights), plus another controller's entry in status.parents; the operator reads it as v1 and writes its status
    through v1. Read back as v1alpha2: the spec, metadata and the other controller's entry are what was applied."""
    server, k = bed
    ns, _node = _mesh(k, server.bed is not None)
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
    assert back["spec"] == (route["spec"] if server.bed is not None else upstream_defaults(route["spec"]))
    assert back["metadata"]["labels"] == {"team": "dns"}
    assert back["metadata"]["annotations"]["example.com/owner"] == "dns-team"
    parents = back["status"]["parents"]
    assert other in parents, parents
    assert _ours(back) is not None
    writes = {r.path.split("/")[3] for r in operator_requests(server) if r.user_agent == "aether-operator"}
    assert writes == {"v1"}, writes

    # drift: someone replaces status.parents with the other controller's entry alone; ours comes back beside it
    k.apply(route, status={"status": {"parents": [other]}})
    again = wait_for(
        lambda: (r := k.route(ns, "full", "v1alpha2")) and _ours(r) and r,
        what="our status entry restored after it was overwritten",
        diagnose=lambda: repr((k.route(ns, "full", "v1") or {}).get("status")),
    )
    assert other in again["status"]["parents"]
