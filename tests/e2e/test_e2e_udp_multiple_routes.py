"""Several UDPRoutes on one parent Service on the real data path (the real control plane or the API test bed, the
operator, sidecars, real Envoy per node, pods captured by the real aether-cni), as upstream Gateway API v1.6.1's
UDPRouteMultipleRoutesAttachment conformance test has them on one listener: both routes Accepted=True, only the
oldest carries traffic. dnsmasq backends answer `who.test` with an address of their own; the client asks with dig
(a fresh socket, a new session, per query) through `front`'s VIP on 18082:

- before any route, front's own backend answers; with the older route, the older route's backend answers every
  query; a newer route on the same parent is Accepted too and its backend answers none (though it answers through
  its own Service);
- deleting the older route (kubectl delete) hands the parent to the newer one: its backend answers every query.

- port scope: on a Service with two UDP ports, the route on the port the mesh carries carries every query, the
  (older) route on the other port none, and is told NoMatchingParent.

Both UDP data paths (`aether.e2e.dataplane`): on Envoy the sync check is node-a's udp_proxy matcher for the VIP;
on the in-kernel path it is the client's table `ip aether_udp` rewriting the VIP to the arm's backend, and the
queries are counted there, never by Envoy.

The time from the delete to the first answer of the newer route's backend is printed (`pytest -s`)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from aether.e2e.dataplane import UDP_DATAPLANES, PathCounters, on_kernel, wait_kernel_backends
from aether.e2e.harness import BACKEND_PORT, Mesh, MeshPod
from aether.e2e.kube import udp_arms
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.operator.routestatus import CONTROLLER_NAME
from aether.testing.udp_clients import WHO_NAME, dig, dnsmasq_argv
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

NS = "e2e"
ANSWERS = {"front-dns": "192.0.2.40", "older-dns": "192.0.2.41", "newer-dns": "192.0.2.42"}
QUERIES = 20


def _dnsmasq_app(ip: str, port: int, answer: str, workdir: Path) -> list[str]:
    return dnsmasq_argv(ip, port, answer, workdir)


@pytest.fixture(scope="module", params=UDP_DATAPLANES)
def mesh(request: pytest.FixtureRequest) -> Iterator[Mesh]:
    m = Mesh(namespace=NS, channel="standard", udp_dataplane=request.param)  # upstream's CRDs, UDPRoute v1
    try:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        m.start_node_proxies()
        m.add_pod(a, "client")
        assert m.workdir is not None
        for node, name in ((a, "front-dns"), (b, "older-dns"), (a, "newer-dns")):
            m.add_backend(node, name, partial(_dnsmasq_app, answer=ANSWERS[name], workdir=m.workdir))
        m.add_service("front", ["front-dns"])  # the parent, with a backend of its own
        for name in ("older-dns", "newer-dns"):
            m.add_service(name, [name])
        m.wait_arms(a, {vip: f"udp:{NS}/{svc}" for svc, vip in m.services.items()})
        m.wait_listeners(a, 1)
        yield m
    finally:
        m.close()


def _who(client: MeshPod, vip: str) -> str | None:
    """The address a dig for who.test through `vip`:18082 gets (None: no answer)."""
    answers = dig(client.net.netns, vip, L4_OUTBOUND_PORT, WHO_NAME).answers
    return answers[0].split()[-1] if answers else None


def _answers(m: Mesh, parent: str = "front") -> Counter[str | None]:
    """QUERIES digs through the parent's VIP, each answer's address counted; the path that carried them is checked
    (the kernel path's counters or Envoy's sessions, `PathCounters.check`)."""
    client = m.pods["client"]
    counted = PathCounters(client, [m.services[parent]])
    got = Counter(_who(client, m.services[parent]) for _ in range(QUERIES))
    counted.check(m, want_datagrams=QUERIES)
    return got


def _accepted(m: Mesh, route: str, parent: str = "front") -> dict[str, Any] | None:
    """Our Accepted condition on `route` for `parent`, as stored (None until there is one)."""
    parents = m.kube.udproute_as(NS, route, "v1").get("status", {}).get("parents") or []
    ours = [p for p in parents if p["controllerName"] == CONTROLLER_NAME and p["parentRef"]["name"] == parent]
    conds = [c for p in ours for c in p["conditions"] if c["type"] == "Accepted"]
    return conds[0] if conds else None


def _clusters_for(node: Any, vip: str) -> set[str]:
    """The clusters node's Envoy matches `vip` to (the udp_proxy matchers of every active pod listener on the node;
    a listener version being replaced stays in the dump as draining_state, with its old arm, until it drains)."""
    found: set[str] = set()

    def walk(x: Any, under: bool) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k in ("draining_state", "warming_state"):
                    continue
                if under and k == "cluster" and isinstance(v, str):
                    found.add(v)
                walk(v, under or k == vip)
        elif isinstance(x, list):
            for v in x:
                walk(v, under)

    walk(json.loads(node.running_envoy().admin("/config_dump")), False)
    return found


def _envoy_follows_the_arm(m: Mesh, parent: str = "front") -> str:
    """Until node-a's data path holds what the operator computed for the parent's VIP (the cluster of its arm in
    the MeshNode state): on Envoy its udp_proxy matcher names that cluster; on the kernel path the client's table
    rewrites the VIP to that cluster's backend only. That cluster."""
    vip = m.services[parent]
    if on_kernel(m):
        return _kernel_follows_the_arm(m, vip)

    def synced() -> str | None:
        arm = udp_arms(m.kube.meshnode("node-a") or {}).get(vip) or {}
        cluster = arm.get("cluster")
        return cluster if cluster and _clusters_for(m.nodes["node-a"], vip) == {cluster} else None

    cluster: str = wait_for(
        synced,
        timeout=60,
        what=f"node-a's Envoy on {parent}'s arm",
        ignore=(KeyError, TypeError),
        diagnose=lambda: (
            f"arm {udp_arms(m.kube.meshnode('node-a') or {}).get(vip)}, Envoy {_clusters_for(m.nodes['node-a'], vip)}"
        ),
    )
    return cluster


def _kernel_follows_the_arm(m: Mesh, vip: str) -> str:
    cluster: str = wait_for(
        lambda: (udp_arms(m.kube.meshnode("node-a") or {}).get(vip) or {}).get("cluster"),
        timeout=60,
        what=f"node-a's arm for {vip}",
        ignore=(KeyError, TypeError),
    )
    backend = cluster.removeprefix(f"udp:{NS}/")  # each Service here has one backend pod of its own name
    wait_kernel_backends(m, m.pods["client"], vip, [f"{m.pods[backend].ip}:{BACKEND_PORT}"])
    return cluster


def _past_the_second_of(m: Mesh, route: str) -> None:
    """creationTimestamp has second precision: wait until the clock has passed the second `route` was created in,
    so that a route created next is strictly newer."""
    created = m.kube.udproute_as(NS, route, "v1")["metadata"]["creationTimestamp"]
    stamp = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    wait_for(lambda: datetime.now(UTC) >= stamp + timedelta(seconds=1), what="the next second")


def _wait_only(m: Mesh, backend: str, what: str, parent: str = "front") -> float:
    """Until a dig through the parent answers `backend`'s address; then every one of QUERIES answers it. The
    seconds waited."""
    start = time.monotonic()
    wait_for(lambda: _who(m.pods["client"], m.services[parent]) == ANSWERS[backend], timeout=60, what=what)
    took = time.monotonic() - start
    got = _answers(m, parent)
    assert got == Counter({ANSWERS[backend]: QUERIES}), (what, got)
    return took


def test_only_the_oldest_route_carries_traffic_and_deleting_it_hands_over(mesh: Mesh) -> None:
    m = mesh
    _wait_only(m, "front-dns", "front's own backend before any route")
    m.weighted_route("older", "front", {"older-dns": 1}, "v1")
    older = wait_for(lambda: _accepted(m, "older"), timeout=30, what="older: Accepted")
    assert (older["status"], older["reason"]) == ("True", "Accepted"), older
    _wait_only(m, "older-dns", "the older route's backend through front")
    _past_the_second_of(m, "older")
    m.weighted_route("newer", "front", {"newer-dns": 1}, "v1")

    def newer_told() -> dict[str, Any] | None:
        c = _accepted(m, "newer")
        return c if c and "older UDPRoute e2e/older" in c["message"] else None

    wait_for(lambda: (_accepted(m, "newer") or {}).get("status") == "True", timeout=30, what="newer: Accepted")
    _envoy_follows_the_arm(m)  # the operator's pass with both routes is on the data path
    got = _answers(m)
    assert got == Counter({ANSWERS["older-dns"]: QUERIES}), got  # the newer route's backend answers none
    newer = wait_for(newer_told, timeout=30, what="newer: Accepted, carrying no traffic")
    assert (newer["status"], newer["reason"]) == ("True", "Accepted"), newer
    assert (_accepted(m, "older") or {}).get("status") == "True"
    assert _who(m.pods["client"], m.services["newer-dns"]) == ANSWERS["newer-dns"]  # it is alive
    deleted = time.monotonic()
    assert m.kubectl("delete", "udproute", "older") is not None
    took = _wait_only(m, "newer-dns", "the newer route's backend after the older route is deleted")

    def newer_routes() -> dict[str, Any] | None:
        c = _accepted(m, "newer")
        return c if c and "older" not in c["message"] else None

    newer = wait_for(newer_routes, timeout=30, what="newer: Accepted, routing")
    assert newer["status"] == "True" and f"udp:{NS}/newer-dns" in newer["message"], newer
    print(
        f"\ndelete of the older route -> first answer of the newer route's backend: {took:.2f} s "
        f"({time.monotonic() - deleted:.2f} s to {QUERIES} more answers from it)"
    )


def _route_on_port(m: Mesh, name: str, parent: str, section: str, backend: str) -> None:
    """kubectl apply of a UDPRoute v1 whose parentRef names one port of `parent` (sectionName)."""
    body = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "UDPRoute",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": parent, "sectionName": section}],
            "rules": [{"backendRefs": [{"name": backend, "port": L4_OUTBOUND_PORT}]}],
        },
    }
    path = m.dir / f"route-{name}.json"
    path.write_text(json.dumps(body))
    assert m.kubectl("apply", "-f", str(path)) is not None


def test_a_route_on_the_carried_port_carries_traffic_and_one_on_another_port_none(mesh: Mesh) -> None:
    """Port-scoped attachment (GEP-1294: a parentRef with a port is associated only with that port) on a Service
    with two UDP ports: the mesh carries `aa` (the first by name; pods dial every Service on 18082). A route on
    port `udp`, the older, is not attached (NoMatchingParent naming aa); the newer route on `aa` carries every
    query. On whole-Service attachment the older route took the Service and its backend answered."""
    m = mesh
    m.add_service("multi", ["front-dns"])
    _wait_only(m, "front-dns", "multi's own backend", "multi")
    # a second UDP port (its EndpointSlice keeps only `udp`: the routes' backends are what answers)
    patch = [{"op": "add", "path": "/spec/ports/-", "value": {"name": "aa", "port": 5300, "protocol": "UDP"}}]
    assert m.kubectl("patch", "service", "multi", "--type=json", "-p", json.dumps(patch)) is not None
    _route_on_port(m, "on-udp", "multi", "udp", "older-dns")
    on_udp = wait_for(lambda: _accepted(m, "on-udp", "multi"), timeout=30, what="on-udp: a verdict")
    assert (on_udp["status"], on_udp["reason"]) == ("False", "NoMatchingParent"), on_udp
    assert "aa (5300/UDP)" in on_udp["message"] and "18082" in on_udp["message"], on_udp
    _past_the_second_of(m, "on-udp")
    _route_on_port(m, "on-aa", "multi", "aa", "newer-dns")
    on_aa = wait_for(lambda: _accepted(m, "on-aa", "multi"), timeout=30, what="on-aa: a verdict")
    assert (on_aa["status"], on_aa["reason"]) == ("True", "Accepted"), on_aa
    assert _envoy_follows_the_arm(m, "multi") == f"udp:{NS}/newer-dns"
    assert _answers(m, "multi") == Counter({ANSWERS["newer-dns"]: QUERIES})
    assert (_accepted(m, "on-udp", "multi") or {}).get("reason") == "NoMatchingParent"
