"""Two UDPRoutes on one parent Service on the real data path (the real control plane or the API test bed, the
operator, sidecars, real Envoy per node, pods captured by the real aether-cni), as upstream Gateway API v1.6.1's
UDPRouteMultipleRoutesAttachment conformance test has them on one listener: both routes Accepted=True, only the
oldest carries traffic. dnsmasq backends answer `who.test` with an address of their own; the client asks with dig
(a fresh socket, a new session, per query) through `front`'s VIP on 18082:

- before any route, front's own backend answers; with the older route, the older route's backend answers every
  query; a newer route on the same parent is Accepted too and its backend answers none (though it answers through
  its own Service);
- deleting the older route (kubectl delete) hands the parent to the newer one: its backend answers every query.

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

from aether.e2e.harness import Mesh, MeshPod
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


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    m = Mesh(namespace=NS, channel="standard")  # upstream's CRDs, UDPRoute v1
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


def _answers(m: Mesh, n: int = QUERIES) -> Counter[str | None]:
    client = m.pods["client"]
    return Counter(_who(client, m.services["front"]) for _ in range(n))


def _accepted(m: Mesh, route: str) -> dict[str, Any] | None:
    """Our Accepted condition on `route` for front, as stored (None until there is one)."""
    parents = m.kube.udproute_as(NS, route, "v1").get("status", {}).get("parents") or []
    ours = [p for p in parents if p["controllerName"] == CONTROLLER_NAME and p["parentRef"]["name"] == "front"]
    conds = [c for p in ours for c in p["conditions"] if c["type"] == "Accepted"]
    return conds[0] if conds else None


def _clusters_for(node: Any, vip: str) -> set[str]:
    """The clusters node's Envoy matches `vip` to (the udp_proxy matchers of every pod listener on the node)."""
    found: set[str] = set()

    def walk(x: Any, under: bool) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if under and k == "cluster" and isinstance(v, str):
                    found.add(v)
                walk(v, under or k == vip)
        elif isinstance(x, list):
            for v in x:
                walk(v, under)

    walk(json.loads(node.running_envoy().admin("/config_dump")), False)
    return found


def _envoy_follows_the_arm(m: Mesh) -> str:
    """Until node-a's Envoy matches front's VIP to the cluster of front's arm in the MeshNode state: the data path
    holds what the operator computed. That cluster."""
    vip = m.services["front"]

    def synced() -> str | None:
        arm = udp_arms(m.kube.meshnode("node-a") or {}).get(vip) or {}
        cluster = arm.get("cluster")
        return cluster if cluster and _clusters_for(m.nodes["node-a"], vip) == {cluster} else None

    cluster: str = wait_for(synced, timeout=30, what="node-a's Envoy on front's arm", ignore=(KeyError, TypeError))
    return cluster


def _wait_only(m: Mesh, backend: str, what: str) -> float:
    """Until a dig through front answers `backend`'s address; then every one of QUERIES answers it. The seconds
    waited."""
    start = time.monotonic()
    wait_for(lambda: _who(m.pods["client"], m.services["front"]) == ANSWERS[backend], timeout=60, what=what)
    took = time.monotonic() - start
    got = _answers(m)
    assert got == Counter({ANSWERS[backend]: QUERIES}), (what, got)
    return took


def test_only_the_oldest_route_carries_traffic_and_deleting_it_hands_over(mesh: Mesh) -> None:
    m = mesh
    _wait_only(m, "front-dns", "front's own backend before any route")
    m.weighted_route("older", "front", {"older-dns": 1}, "v1")
    older = wait_for(lambda: _accepted(m, "older"), timeout=30, what="older: Accepted")
    assert (older["status"], older["reason"]) == ("True", "Accepted"), older
    _wait_only(m, "older-dns", "the older route's backend through front")
    # creationTimestamp has second precision: the newer route is created in a later second than the older one
    created = m.kube.udproute_as(NS, "older", "v1")["metadata"]["creationTimestamp"]
    stamp = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    wait_for(lambda: datetime.now(UTC) >= stamp + timedelta(seconds=1), what="the next second")
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
