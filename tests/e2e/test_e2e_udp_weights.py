"""UDPRoute weights on the real data path (API test bed, operator, sidecars, real Envoy per node, pods captured by
the real aether-cni), modelled on the Gateway API conformance suite's weighted-route test, once per API version:
the route applied as `v1` on the standard-channel CRD and as `v1alpha2` on the experimental-channel one.

- 70/30/0: 500 probes, each from a fresh UDP socket (a new session), 10 in flight: shares within 5 points of
  70/30, the weight-0 backend gets nothing; the datagrams of one socket all reach one backend;
- changing the weights moves new sessions only: open sockets keep their backend, new ones follow the new weights;
- 80 (a Service that does not exist) / 20: ~80% of new sessions get no reply, the valid backend the rest, and the
  route says why (ResolvedRefs=False, BackendNotFound).

The backends are on both nodes (w1 beside the client, w2 and w3 on the other node). Shares are printed (`pytest -s`).

Both UDP data paths (`aether.e2e.dataplane`): Envoy (both API versions) and the in-kernel path (`v1` only: the
route's version is the operator's business, the same arm reaches either path). What differs is asserted per path:
Envoy's split is a deterministic schedule (within 5 points), the kernel's `numgen random` is a binomial draw per
new flow (within 5 sigma); an invalid backend's share is lost in Envoy (no reply) and dropped in the pod's own
output path on the kernel path (the send fails with EPERM).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest

from aether.e2e.dataplane import kernel_shares, on_kernel, wait_kernel_vips
from aether.e2e.harness import Mesh
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.operator.routestatus import CONTROLLER_NAME
from aether.testing.nodebed import udp_socket_in
from aether.testing.split_probe import (
    NO_REPLY,
    SEND_REFUSED,
    Split,
    locality_weights,
    probe_split,
    sticky_backends,
)
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

NS = "e2e"
CLUSTER = f"udp-split:{NS}/front"
VERSIONS = [("standard", "v1", "envoy"), ("experimental", "v1alpha2", "envoy"), ("standard", "v1", "kernel")]


@pytest.fixture(scope="module", params=VERSIONS, ids=["-".join(v) for v in VERSIONS])
def mesh(request: pytest.FixtureRequest) -> Iterator[tuple[Mesh, str]]:
    channel, version, dataplane = request.param
    m = Mesh(namespace=NS, channel=channel, udp_dataplane=dataplane)
    try:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        m.start_node_proxies()
        m.add_pod(a, "client")
        m.add_backend(a, "w1")
        m.add_backend(b, "w2")
        m.add_backend(b, "w3")
        m.add_service("front", ["w1"])  # the parent: dialled by the client, its own endpoints unused once routed
        for name in ("w1", "w2", "w3"):
            m.add_service(name, [name])
        m.wait_listeners(a, 1)
        wait_kernel_vips(m, [m.pods["client"]], m.services.values())
        yield m, version
    finally:
        m.close()


def _apply(mesh: Mesh, version: str, weights: dict[str, int]) -> dict[str, Any]:
    """Apply the route with these weights; wait until node-a's MeshNode arm and Envoy's EDS both have them."""
    mesh.weighted_route("split", "front", weights, version)
    want = {f"{NS}/{b}": w for b, w in weights.items()}

    def arm_ok(obj: dict[str, Any]) -> bool:
        arm = {a["vip"]: a for a in obj["status"]["udp"]["services"]}.get(mesh.services["front"], {})
        return arm.get("cluster") == CLUSTER and {x["backend"]: x["weight"] for x in arm.get("backends", [])} == want

    obj = mesh.kube.wait_meshnode("node-a", arm_ok, what=f"split arm {want}")
    node = mesh.nodes["node-a"]
    wait_for(
        lambda: locality_weights(json.loads(node.running_envoy().admin("/config_dump?include_eds")), CLUSTER) == want,
        timeout=30,
        what=f"Envoy EDS weights {want}",
    )
    if on_kernel(mesh):  # the client's table: each backend's buckets of 100 (every weight set here sums to 100)
        ips = {f"{NS}/{b}": f"{mesh.pods[b].ip}:5353" if b in mesh.pods else "drop" for b in weights}
        shares = {ips[b]: w for b, w in want.items() if w}
        wait_for(
            lambda: kernel_shares(mesh.pods["client"], mesh.services["front"]) == shares,
            timeout=30,
            what=f"the client's table splitting {shares}",
        )
    found: dict[str, Any] = {a["vip"]: a for a in obj["status"]["udp"]["services"]}[mesh.services["front"]]
    return found


def _within(mesh: Mesh, split: Split, backend: str, percent: float) -> bool:
    """Envoy's locality schedule is deterministic: within 5 points. The kernel's `numgen random` draws per new
    flow: within 5 sigma of binomial(probes, percent)."""
    if not on_kernel(mesh):
        return abs(split.share(backend) - percent) <= 5
    p = percent / 100
    return abs(split.share(backend) - percent) <= 5 * 100 * math.sqrt(p * (1 - p) / split.probes)


def _dropped(mesh: Mesh) -> str:
    """How a probe of an invalid backend's share ends: no reply through Envoy, a refused send on the kernel path."""
    return SEND_REFUSED if on_kernel(mesh) else NO_REPLY


def _probe(mesh: Mesh, n: int, timeout: float = 1.0) -> Split:
    return probe_split(mesh.pods["client"].netns_path, mesh.services["front"], L4_OUTBOUND_PORT, n, 10, timeout)


def _ours(mesh: Mesh, version: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    route = mesh.kube.udproute_as(NS, "split", version)
    parent = next(p for p in route["status"]["parents"] if p["controllerName"] == CONTROLLER_NAME)
    return route, {c["type"]: c for c in parent["conditions"]}


def test_seventy_thirty_zero_over_500_fresh_sessions_and_one_socket_sticks(mesh: tuple[Mesh, str]) -> None:
    m, version = mesh
    arm = _apply(m, version, {"w1": 70, "w2": 30, "w3": 0})
    assert [(b["backend"], b["weight"], b["share"], b.get("reason")) for b in arm["backends"]] == [
        (f"{NS}/w1", 70, 70.0, None),
        (f"{NS}/w2", 30, 30.0, None),
        (f"{NS}/w3", 0, 0.0, "Drained"),
    ]
    # what `kubectl get` explains: the arm is in its namespace's MeshServiceSlice (the MeshNode names the slices)
    shown = m.kubectl("get", "meshserviceslices", "-l", f"mesh.aether.dev/namespace={NS}", "-o", "yaml")
    if shown is not None:
        for line in ("cluster: udp-split:e2e/front", "backend: e2e/w1", "share: 70", "weight: 70", "reason: Drained"):
            assert line in shown, shown
    split = _probe(m, 500)
    print(f"\n{version}: 70/30/0, 500 fresh sessions, 10 in flight\n{split.table()}")
    assert _within(m, split, "w1", 70) and _within(m, split, "w2", 30), split.table()
    assert split.by_backend["w3"] == 0 and split.by_backend[NO_REPLY] == 0, split.table()
    assert split.by_backend[SEND_REFUSED] == 0, split.table()
    sock = udp_socket_in(m.pods["client"].netns_path)
    try:
        seen = sticky_backends(sock, m.services["front"], L4_OUTBOUND_PORT, 30)
        assert len(seen) == 1 and NO_REPLY not in seen, seen
    finally:
        sock.close()
    route, conds = _ours(m, version)
    gen = route["metadata"]["generation"]
    assert conds["Accepted"]["status"] == "True" and conds["ResolvedRefs"]["status"] == "True", conds
    assert conds["Accepted"]["observedGeneration"] == gen and conds["ResolvedRefs"]["observedGeneration"] == gen
    assert f"{NS}/w1 70%, {NS}/w2 30%, {NS}/w3 0% (Drained)" in conds["Accepted"]["message"], conds
    assert [b.get("weight") for b in route["spec"]["rules"][0]["backendRefs"]] == [70, 30, 0]  # fields kept


def test_changing_weights_moves_new_sessions_only(mesh: tuple[Mesh, str]) -> None:
    m, version = mesh
    _apply(m, version, {"w1": 50, "w2": 50, "w3": 0})
    socks = [udp_socket_in(m.pods["client"].netns_path) for _ in range(20)]
    try:
        first = [sticky_backends(s, m.services["front"], L4_OUTBOUND_PORT, 3) for s in socks]
        assert all(len(x) == 1 and NO_REPLY not in x for x in first), first
        owners = [next(iter(x)) for x in first]
        assert {"w1", "w2"} <= set(owners), owners
        _apply(m, version, {"w1": 0, "w2": 20, "w3": 80})  # w1 drained: its open sessions finish there
        again = [sticky_backends(s, m.services["front"], L4_OUTBOUND_PORT, 3) for s in socks]
        assert [next(iter(x)) for x in again] == owners and all(len(x) == 1 for x in again), again
        split = _probe(m, 300)
        print(f"\n{version}: after 0/20/80, 300 fresh sessions\n{split.table()}")
        assert split.by_backend["w1"] == 0 and split.by_backend[NO_REPLY] == 0, split.table()
        assert _within(m, split, "w3", 80) and _within(m, split, "w2", 20), split.table()
    finally:
        for s in socks:
            s.close()


def test_an_invalid_backends_share_is_dropped_and_the_route_says_why(mesh: tuple[Mesh, str]) -> None:
    m, version = mesh
    _apply(m, version, {"missing": 80, "w2": 20})
    split = _probe(m, 200, timeout=0.5)
    print(f"\n{version}: 80 (missing Service) / 20, 200 fresh sessions\n{split.table()}")
    assert _within(m, split, _dropped(m), 80) and _within(m, split, "w2", 20), split.table()
    assert set(split.by_backend) == {_dropped(m), "w2"}, split.table()

    def resolved_false() -> dict[str, dict[str, Any]] | None:
        _, conds = _ours(m, version)
        return conds if conds["ResolvedRefs"]["status"] == "False" else None

    conds = wait_for(resolved_false, what="ResolvedRefs=False", ignore=(KeyError, StopIteration))
    assert conds["ResolvedRefs"]["reason"] == "BackendNotFound", conds
    assert f"{NS}/missing" in conds["ResolvedRefs"]["message"] and conds["Accepted"]["status"] == "True", conds
