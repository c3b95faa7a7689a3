"""Operator reconcile at scale: a synthetic cluster of 10,000 Services, 1,000 nodes and 50,000 pods.

Two cases: `--egress default` (no egress annotation: every node depends on every mesh namespace, what a new user's
cluster does) and `--egress scoped` (each namespace's egress names one other namespace; the case this benchmark
had before the slices). For the initial state and for each one-change case it reports what the operator writes to
the API: objects (MeshServiceSlices and MeshNodes), bytes (the request bodies: a new slice whole, a changed slice
as its JSON patch, a MeshNode as its status merge patch), the largest object stored, and the time of everything
the operator does but the HTTP round trip (apply + incremental reconcile + write decisions + building and encoding
the bodies). Peak memory is ru_maxrss. Targets (docs/performance.md): every object <= 512 KiB; one endpoint change
<= 1 object and <= 64 KiB; one change <= 50 ms; peak RSS <= 1 GB.
Run: .venv/bin/python -m bench.operator_reconcile [--egress default|scoped] [--namespaces N] [--nodes N]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

from aether.operator.kubeapi import slice_labels
from aether.operator.nodestatus import applied_status, owned_wire
from aether.operator.reconcile.model import ClusterModel, Output
from aether.operator.slicewire import slice_ops
from aether.testing.apitestbed import objects as o
from aether.testing.synthetic_cluster import build, pod_node


def _size(body: Any) -> int:
    return len(json.dumps(body, separators=(",", ":")))


class Api:
    """What the API would hold after the operator's writes (slice specs; MeshNode digests), and what each
    reconcile's writes cost: the decisions the reconciler makes, with the request bodies built and encoded."""

    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}  # name -> the stored object (metadata + spec)
        self.nodes: dict[str, str] = {}  # MeshNode -> digest of the status stored
        self.status: dict[str, dict[str, Any]] = {}  # MeshNode -> the status stored (the patches' base)
        self.rv = 0

    def write(self, out: Output) -> dict[str, Any]:
        """The writes of one reconcile: decided, built and encoded (the operator's CPU), and stored."""
        objects = nodes = body_bytes = 0
        touched: list[Any] = []
        for name, spec in out.slices.items():
            if spec is None:
                objects += self.slices.pop(name, None) is not None
                continue
            labels = slice_labels(spec)
            self.rv += 1
            stored = {"metadata": {"name": name, "resourceVersion": str(self.rv), "labels": labels}, "spec": spec}
            old = self.slices.get(name)
            if old is not None and old["spec"] == spec:
                continue
            body = stored if old is None else slice_ops(old, spec, labels)
            objects += 1
            body_bytes += _size(body)
            touched.append(stored)
            self.slices[name] = stored
        for name, desired in out.desired.items():
            if self.nodes.get(name) == desired.digest:
                continue
            self.nodes[name] = desired.digest
            current = self.status.get(name)
            body = {"status": applied_status(desired.owned, current, "2026-01-01T00:00:00Z")}  # the apply's body
            self.status[name] = {**(current or {}), **body["status"]}
            objects += 1
            nodes += 1
            body_bytes += _size(body)
            touched.append(self.status[name])
        return {"objects": objects, "meshnodes": nodes, "bytes": body_bytes, "touched": touched}


def largest(touched: list[Any]) -> int:
    """The largest object written, as stored (measured outside the timed part: the API's work, not ours)."""
    return max((_size(t) for t in touched), default=0)


def affected(m: ClusterModel, ns: str) -> set[str]:
    return set(m.dependents.get(ns, set()))


def one_change(m: ClusterModel, api: Api, label: str, change: Callable[[], None], expect: set[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    change()
    out = m.reconcile()
    before = dict(api.nodes)
    wrote = api.write(out)
    dt = time.perf_counter() - t0
    patched = {n for n, d in api.nodes.items() if before.get(n) != d}
    assert patched <= expect, f"{label}: patched nodes outside the affected set: {sorted(patched - expect)[:5]}"
    wrote["largest"] = largest(wrote.pop("touched"))
    return {"label": label, "ms": dt * 1000, "affected": len(expect), **wrote}


def _kib(n: float) -> str:
    return f"{n / 1024:.1f} KiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.operator_reconcile")
    ap.add_argument("--egress", choices=("default", "scoped"), default="default", help="the dependency sets")
    ap.add_argument("--namespaces", type=int, default=1000, help="10 Services and 50 pods each (default 1000)")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5, help="repetitions of each one-change case")
    args = ap.parse_args(argv)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    m, t_feed = build(args.namespaces, args.nodes, scoped=args.egress == "scoped")
    api = Api()
    t0 = time.perf_counter()
    out = m.reconcile()
    t_rec = time.perf_counter() - t0
    t0 = time.perf_counter()
    initial = api.write(out)
    t_dec = time.perf_counter() - t0
    initial["largest"] = largest(initial.pop("touched"))
    one = next(iter(out.desired.values()))
    old_layout = _size(owned_wire(one.status()))  # one MeshNode status holding every arm inline, as before the slices
    print(
        f"cluster ({args.egress} egress): {sum(len(v) for v in m.services.values())} Services, {len(m.nodes)} nodes, "
        f"{len(m.pods)} pods, {sum(len(v) for v in m.routes.values())} UDPRoutes; {len(api.slices)} MeshServiceSlices; "
        f"one MeshNode depends on {len(one.results)} namespaces ({sum(len(r.tables.udp_arms) for r in one.results)} UDP arms); "
        f"the old layout's MeshNode status: {_kib(old_layout)}"
    )
    print(
        f"initial: feed {t_feed:.2f} s, reconcile {t_rec:.2f} s, writes built {t_dec:.2f} s; "
        f"{initial['objects']} objects ({len(api.slices)} slices, {initial['meshnodes']} MeshNodes), "
        f"{initial['bytes'] / 2**20:.1f} MiB, largest {_kib(initial['largest'])}"
    )

    results: list[dict[str, Any]] = []
    for r in range(args.rounds):
        i = (r * 37 + 5) % args.namespaces
        ns = f"ns{i:04d}"

        def endpoint(ns: str = ns, i: int = i) -> None:  # one endpoint of s3 turns unready
            eps = [(f"10.{i // 200}.{i % 200}.{16 + e}", e != 0, f"p{15 + e}") for e in range(5)]
            m.apply_raw("slice", o.endpoint_slice(ns, "s3", [("dns", 5353, "UDP"), ("http", 8080, "TCP")], eps))

        results.append(one_change(m, api, "endpoint readiness flips", endpoint, set()))

        def new_pod(ns: str = ns, i: int = i, r: int = r) -> None:
            body = o.pod(ns, f"extra{r}", f"node{pod_node(i, 0, args.nodes):04d}", "sa-new")
            body["metadata"]["uid"] = f"{ns}-extra{r}"
            body.update(o.pod_status(f"10.200.{i % 200}.{r + 1}"))
            m.apply_raw("pod", body)

        node = f"node{pod_node(i, 0, args.nodes):04d}"
        results.append(one_change(m, api, "pod added (new identity)", new_pod, {node}))

        def weight(ns: str = ns, r: int = r) -> None:
            route = o.udproute(ns, "r", "s0", [o.backend("s1", 53, 1 + r % 2), o.backend("s2", 53, 2 - r % 2)])
            route["metadata"].update({"generation": 2 + r, "creationTimestamp": "2026-01-01T00:00:00Z"})
            m.apply_raw("route", route)

        results.append(one_change(m, api, "route re-pointed (weights)", weight, set()))

        def service(ns: str = ns, i: int = i, r: int = r) -> None:
            vip = f"10.97.{i // 25}.{(i % 25) * 10 + r}"
            m.apply_raw("service", o.service(ns, f"new{r}", vip, [("dns", 53, "UDP"), ("http", 8080, "TCP")]))

        results.append(one_change(m, api, "Service added", service, affected(m, ns)))

    print("one change (apply + incremental reconcile + writes built and encoded), median over rounds:")
    for label in dict.fromkeys(r["label"] for r in results):
        rows = [r for r in results if r["label"] == label]

        def med(key: str, rows: list[dict[str, Any]] = rows) -> float:
            return float(statistics.median(r[key] for r in rows))

        print(
            f"  {label:<28} {med('ms'):7.2f} ms (max {max(r['ms'] for r in rows):.2f}); objects {med('objects'):.0f} "
            f"(MeshNodes {med('meshnodes'):.0f} of {len(m.nodes)}), {_kib(med('bytes'))}, "
            f"largest {_kib(max(r['largest'] for r in rows))}"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"peak RSS: {peak / 1024:.0f} MiB (interpreter + imports before building: {rss0 / 1024:.0f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
