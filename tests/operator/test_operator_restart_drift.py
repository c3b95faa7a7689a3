"""After an operator restart and one pass, a UDPRoute's status.parents wiped by someone else (through the status
subresource, as `kubectl patch --subresource=status` does) is written back within the resync bound
(docs/operator.md, "Convergence"), as it is before a restart. Two nodes and two routes: the world the drift was
seen in (a one-node world did not show it)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from aether.operator.routestatus import CONTROLLER_NAME, comparable
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.faults import Faults
from aether.testing.apitestbed.harness import MERGE, READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.wait import wait_for

ROUTE = ("gateway.networking.k8s.io/v1", "UDPRoute")
RESYNC_BOUND = 5.0  # docs/operator.md, "Convergence"
UDP = [("dns", 53, "UDP")]


@pytest.fixture(scope="module")
def k(api: tuple[str, Faults | None]) -> Cluster:
    return Cluster(api[0], api[1])


@pytest.fixture
def first(api: tuple[str, Faults | None]) -> Iterator[InProcessOperator]:
    op = InProcessOperator(api[0])
    op.start()
    try:
        yield op
    finally:
        if op.alive():
            op.stop()


def ours(k: Cluster, ns: str, route: str) -> list[dict[str, Any]]:
    parents = (((k.route(ns, route, "v1") or {}).get("status")) or {}).get("parents") or []
    return [p for p in parents if p.get("controllerName") == CONTROLLER_NAME]


def accepted(k: Cluster, ns: str, route: str) -> list[dict[str, Any]] | None:
    entries = ours(k, ns, route)
    conds = [c for p in entries for c in p.get("conditions") or [] if c.get("type") == "Accepted"]
    return entries if conds and all(c["status"] == "True" for c in conds) else None


def test_a_wiped_route_status_is_written_back_after_a_restart(
    api: tuple[str, Faults | None], k: Cluster, first: InProcessOperator
) -> None:
    ns = unique("rs")
    nodes = [unique("rs-node"), unique("rs-node")]
    k.apply(o.namespace(ns))
    for i, node in enumerate(nodes):
        k.apply(o.node(node))
        k.apply(o.pod(ns, f"client-{i}", node, "client"), status=o.pod_status(f"10.71.{i}.2"))
    for i, name in enumerate(["front", "back", "side"]):
        k.apply(o.service(ns, name, None, UDP))
        k.apply(o.endpoint_slice(ns, name, [("dns", 5353, "UDP")], [(f"10.71.9.{i + 1}", True, None)]))
    k.apply(o.udproute(ns, "r1", "front", [o.backend("back", 53)], version="v1"))
    k.apply(o.udproute(ns, "r2", "side", [o.backend("back", 53)], version="v1"))
    want: dict[str, list[dict[str, Any]]] = {}
    for r in ("r1", "r2"):
        want[r] = wait_for(partial(accepted, k, ns, r), what=f"{r} Accepted", ignore=READ_ERRORS)

    first.stop()
    second = InProcessOperator(api[0])
    second.start()
    try:
        rec = wait_for(lambda: second.config.reconciler[0] if second.config.reconciler else None, what="reconciler")
        wait_for(lambda: rec.cycles >= 1 and rec.idle.is_set(), timeout=30, what="the first pass after the restart")
        status = k.res(*ROUTE).subresources["status"]
        status.patch(body={"status": {"parents": []}}, name="r1", namespace=ns, content_type=MERGE)
        assert ours(k, ns, "r1") == []

        def back() -> bool:
            return comparable(ours(k, ns, "r1")) == comparable(want["r1"])

        wait_for(back, timeout=RESYNC_BOUND, what="r1's wiped status.parents written back", ignore=READ_ERRORS)
        assert comparable(ours(k, ns, "r2")) == comparable(want["r2"])
        assert second.alive()
    finally:
        second.stop()
