"""Operator reconcile at scale: a synthetic cluster of 10,000 Services, 1,000 nodes and 50,000 pods.

Measures the initial reconcile, one change (apply + incremental reconcile + the per-node patch decision, i.e.
everything the operator does except the HTTP write), how many MeshNodes that change patches against how many
depend on it, and peak memory (ru_maxrss). Targets: one change <= 50 ms, only affected MeshNodes patched,
<= 1 GB. Run: .venv/bin/python -m bench.operator_reconcile [--namespaces N]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

from aether.operator.reconcile.model import ClusterModel, Output
from aether.testing.apitestbed import objects as o

SERVICES_PER_NS, PODS_PER_NS, NODES_PER_NS = 10, 50, 10


def pod_node(ns_i: int, j: int, nodes: int) -> int:
    return (ns_i + (j % NODES_PER_NS) * (nodes // NODES_PER_NS)) % nodes


def build(n_ns: int, nodes: int) -> tuple[ClusterModel, float]:
    m = ClusterModel()
    t0 = time.perf_counter()
    for n in range(nodes):
        m.apply_raw("node", {"metadata": {"name": f"node{n:04d}", "uid": f"u{n}"}})
    for i in range(n_ns):
        ns = f"ns{i:04d}"
        m.apply_raw("namespace", o.namespace(ns, egress=f"ns{(i + 1) % n_ns:04d}"))
        for j in range(PODS_PER_NS):
            body = o.pod(ns, f"p{j}", f"node{pod_node(i, j, nodes):04d}", f"sa{j // 5 % 2}")
            body["metadata"]["uid"] = f"{ns}-p{j}"
            body.update(o.pod_status(f"10.{i // 200}.{i % 200}.{j + 1}"))
            m.apply_raw("pod", body)
        for k in range(SERVICES_PER_NS):
            m.apply_raw(
                "service",
                o.service(
                    ns, f"s{k}", f"10.96.{i // 25}.{(i % 25) * 10 + k}", [("dns", 53, "UDP"), ("http", 8080, "TCP")]
                ),
            )
            eps = [(f"10.{i // 200}.{i % 200}.{k * 5 + e + 1}", True, f"p{k * 5 + e}") for e in range(5)]
            m.apply_raw("slice", o.endpoint_slice(ns, f"s{k}", [("dns", 5353, "UDP"), ("http", 8080, "TCP")], eps))
        route = o.udproute(ns, "r", "s0", [o.backend("s1", 53, 2), o.backend("s2", 53, 1)])
        route["metadata"].update({"generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"})
        m.apply_raw("route", route)
    return m, time.perf_counter() - t0


def decide(out: Output, digests: dict[str, str]) -> set[str]:
    """What the reconciler does before its HTTP writes: the cheap digest per changed node, and for the nodes
    whose digest moved, the status body it would patch (NodeDesired.owned; JSON encoding is the client's)."""
    patched = set()
    for name, desired in out.desired.items():
        if digests.get(name) != desired.digest:
            digests[name] = desired.digest
            assert desired.owned["summary"]["pods"] == len(desired.pods)  # builds the patch body
            patched.add(name)
    return patched


def affected(m: ClusterModel, ns: str) -> set[str]:
    return set(m.dependents.get(ns, set()))


def one_change(
    m: ClusterModel, digests: dict[str, str], label: str, change: Callable[[], None], expect: set[str]
) -> dict[str, Any]:
    t0 = time.perf_counter()
    change()
    out = m.reconcile()
    patched = decide(out, digests)
    dt = time.perf_counter() - t0
    assert patched <= expect, f"{label}: patched nodes outside the affected set: {sorted(patched - expect)[:5]}"
    return {"label": label, "ms": dt * 1000, "patched": len(patched), "affected": len(expect)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.operator_reconcile")
    ap.add_argument("--namespaces", type=int, default=1000, help="10 Services and 50 pods each (default 1000)")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5, help="repetitions of each one-change case")
    args = ap.parse_args(argv)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    m, t_feed = build(args.namespaces, args.nodes)
    t0 = time.perf_counter()
    out = m.reconcile()
    t_rec = time.perf_counter() - t0
    digests: dict[str, str] = {}
    t0 = time.perf_counter()
    initial = decide(out, digests)
    t_dec = time.perf_counter() - t0
    arms = sum(len(d.owned["udp"]["services"]) for d in out.desired.values())
    print(
        f"cluster: {sum(len(v) for v in m.services.values())} Services, {len(m.nodes)} nodes, {len(m.pods)} pods, "
        f"{sum(len(v) for v in m.routes.values())} UDPRoutes; {arms} UDP arms over all MeshNodes"
    )
    print(
        f"initial: feed {t_feed:.2f} s, reconcile {t_rec:.2f} s, patch decision {t_dec:.2f} s, {len(initial)} MeshNodes"
    )

    results: list[dict[str, Any]] = []
    for r in range(args.rounds):
        i = (r * 37 + 5) % args.namespaces
        ns = f"ns{i:04d}"
        ready = r % 2 == 1

        def endpoint(ns: str = ns, i: int = i, ready: bool = ready) -> None:
            eps = [(f"10.{i // 200}.{i % 200}.{16 + e}", e != 0 or ready, f"p{15 + e}") for e in range(5)]
            m.apply_raw("slice", o.endpoint_slice(ns, "s3", [("dns", 5353, "UDP"), ("http", 8080, "TCP")], eps))

        results.append(one_change(m, digests, "endpoint readiness flips", endpoint, affected(m, ns)))

        def new_pod(ns: str = ns, i: int = i, r: int = r) -> None:
            body = o.pod(ns, f"extra{r}", f"node{pod_node(i, 0, args.nodes):04d}", "sa-new")
            body["metadata"]["uid"] = f"{ns}-extra{r}"
            body.update(o.pod_status(f"10.200.{i % 200}.{r + 1}"))
            m.apply_raw("pod", body)

        results.append(
            one_change(m, digests, "pod added (new identity)", new_pod, {f"node{pod_node(i, 0, args.nodes):04d}"})
        )

        def weight(ns: str = ns, r: int = r) -> None:
            route = o.udproute(ns, "r", "s0", [o.backend("s1", 53, 1 + r % 2), o.backend("s2", 53, 2 - r % 2)])
            route["metadata"].update({"generation": 2 + r, "creationTimestamp": "2026-01-01T00:00:00Z"})
            m.apply_raw("route", route)

        results.append(one_change(m, digests, "route weights swapped", weight, affected(m, ns)))

    print("one change (apply + incremental reconcile + patch decision), median over rounds:")
    for label in dict.fromkeys(r["label"] for r in results):
        rows = [r for r in results if r["label"] == label]
        med = statistics.median(r["ms"] for r in rows)
        print(
            f"  {label:<28} {med:7.2f} ms (max {max(r['ms'] for r in rows):.2f}); MeshNodes patched "
            f"{statistics.median(r['patched'] for r in rows):.0f} of {len(m.nodes)} "
            f"(affected: {statistics.median(r['affected'] for r in rows):.0f})"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"peak RSS: {peak / 1024:.0f} MiB (interpreter + imports before building: {rss0 / 1024:.0f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
