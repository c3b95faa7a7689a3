"""The soak's churn without its traffic, repeated fast: does one churn event leave memory behind once what it
changed is undone? `python -m bench.soak_cycles --kinds new_sa,sa_leaves --cycles 80 --batch 10 --json OUT` (root)
builds the soak's two-node mesh (bench.soak.soak_mesh: the real control plane, the operator, a sidecar and a real
Envoy per node, the soak's pods and Services), starts no prober, and runs the listed churn kinds (bench.soak_churn)
one after another, `--cycles` times. After every `--batch` cycles it waits until no Envoy holds a draining listener
(a replaced listener is kept, stats and all, for the node Envoy's --drain-time-s) and reads each Envoy's heap in use
(`server.memory_allocated`) with its stats count and live listeners and clusters, and each sidecar's and the
operator's heap at the end of their last full collection (glibc's bytes in use, CPython's blocks: their /metrics,
at most aether.heap.FULL_GC_EVERY_S old). A kind whose cycle returns the mesh to where it was (a ServiceAccount
arriving and leaving, a pod rolled, a policy or route edited, an endpoint flapped) must leave each figure where it
was: the report fits each figure against the cycle count over the batches after the first (least squares, per
cycle, with its standard error: bench.soak_report.slope) and says whether that slope is within its noise.

What it separates: the soak (bench.soak) sees its processes' memory grow under churn and traffic together; a
figure that grows here grows with config churn alone, one that stays flat here grows with traffic (or with the two
together: a twin is built on a pair's first request, and no request is sent here).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from aether.e2e.harness import Mesh
from aether.testing.wait import wait_for
from bench.soak import CLIENTS, _progress, _recorder, measured_malloc_env, sidecar_args, soak_mesh
from bench.soak_churn import KINDS, Churn
from bench.soak_report import slope
from bench.soak_watch import Watcher

ENVOY_STATS = (
    r"^(server\.memory_allocated|listener_manager\.total_listeners_(draining|active)|cluster_manager\.active_clusters)$"
)
DRAINED_WITHIN_S = 300.0  # far beyond the node Envoy's --drain-time-s: a listener draining longer is itself a finding


def figures(mesh: Mesh, watcher: Watcher) -> dict[str, dict[str, int | None]]:
    """process ("envoy/node-a", "sidecar/node-b", "operator") -> its heap figures and live counts now."""
    out: dict[str, dict[str, int | None]] = {}
    for name, node in mesh.nodes.items():
        envoy = node.running_envoy()
        stats = envoy.stats(ENVOY_STATS)
        out[f"envoy/{name}"] = {
            "allocated_kib": stats.get("server.memory_allocated", 0) // 1024,
            "stats": len(envoy.admin("/stats").splitlines()),
            "listeners": stats.get("listener_manager.total_listeners_active"),
            "clusters": stats.get("cluster_manager.active_clusters"),
        }
        pairs, malloc, blocks = watcher.python_figures("sidecar", name)
        out[f"sidecar/{name}"] = {"malloc_kib": malloc, "py_blocks": blocks, "pairs": pairs}
    _, malloc, blocks = watcher.python_figures("operator", "")
    out["operator"] = {"malloc_kib": malloc, "py_blocks": blocks}
    return out


def drained(mesh: Mesh) -> None:
    """Until no Envoy holds a draining listener."""
    wait_for(
        lambda: all(n.stat("listener_manager.total_listeners_draining") == 0 for n in mesh.nodes.values()),
        DRAINED_WITHIN_S,
        "no draining listener",
    )


def per_cycle(batches: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """process -> figure -> its least-squares slope per cycle over the batches after the first (the first batch's
    cycles warm the processes up: a first pod's listener, first connections), with its standard error and whether
    it is within noise; the figure's first and last value beside it."""
    judged = batches[1:]
    out: dict[str, dict[str, Any]] = {}
    for proc in sorted(judged[0]["figures"]) if judged else []:
        for fig in judged[0]["figures"][proc]:
            points = [(b["cycle"], b["figures"][proc][fig]) for b in judged if b["figures"][proc].get(fig) is not None]
            fit = slope(points)
            if fit is None:
                continue
            out.setdefault(proc, {})[fig] = {
                "per_cycle": fit["per_min"],
                "stderr": fit["stderr"],
                "within_noise": fit["within_noise"],
                "first": points[0][1],
                "last": points[-1][1],
            }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.update(measured_malloc_env(dict(os.environ)))
    kinds = args.kinds.split(",")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise SystemExit(f"unknown churn kinds {unknown}; known: {', '.join(KINDS)}")
    workdir = Path(args.workdir) if args.workdir else None
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    with soak_mesh(workdir) as (mesh, ports):
        rec = _recorder(mesh, ports)
        swap = threading.Lock()
        callers = [sa for _, sa in CLIENTS.values()]

        def metrics_args(node: Any) -> tuple[str, ...]:
            return sidecar_args(node.name, ports)

        churn = Churn(mesh, rec, random.Random(args.seed), lambda *_: [], metrics_args, swap, callers)
        churn._policy()
        watcher = Watcher(mesh, rec, swap, metrics_args, set, ports)
        drained(mesh)
        batches = [{"cycle": 0, "t": 0.0, "figures": figures(mesh, watcher)}]
        t0 = time.monotonic()
        failed: list[str] = []
        for cycle in range(1, args.cycles + 1):
            for kind in kinds:
                event = churn.run(kind)
                if "FAILED" in event.detail:
                    failed.append(f"cycle {cycle} {kind}: {event.detail}")
            if cycle % args.batch == 0:
                drained(mesh)
                batches.append(
                    {"cycle": cycle, "t": round(time.monotonic() - t0, 1), "figures": figures(mesh, watcher)}
                )
                _progress(f"cycle {cycle}: {json.dumps(batches[-1]['figures'])}")
    return {
        "kinds": kinds,
        "cycles": args.cycles,
        "batch": args.batch,
        "seed": args.seed,
        "failed": failed,
        "batches": batches,
        "per_cycle": per_cycle(batches),
    }


def table(report: dict[str, Any]) -> str:
    lines = [f"kinds {','.join(report['kinds'])}: {report['cycles']} cycles, {len(report['failed'])} events failed"]
    for proc, figs in report["per_cycle"].items():
        for fig, f in figs.items():
            lines.append(
                f"  {proc:<15} {fig:<14} {f['first']:>9} -> {f['last']:>9}  {f['per_cycle']:+.3f} +- {f['stderr']:.3f}"
                f" per cycle (within noise: {f['within_noise']})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--kinds", required=True, help=f"comma-separated churn kinds, one cycle runs each ({', '.join(KINDS)})"
    )
    p.add_argument("--cycles", type=int, default=50)
    p.add_argument("--batch", type=int, default=10, help="cycles between two readings")
    p.add_argument("--seed", type=int, default=1, help="picks each event's node and target")
    p.add_argument("--json", required=True, help="where the report goes")
    p.add_argument("--workdir", help="keep the mesh's logs here (default: a temporary directory, removed)")
    args = p.parse_args(argv)
    report = run(args)
    Path(args.json).write_text(json.dumps(report, indent=1))
    print(table(report))
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
