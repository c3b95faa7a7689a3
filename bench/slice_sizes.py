"""How big a MeshServiceSlice gets for a target size: the measurement behind slicing.TARGET_SERVICES.

One namespace of N Services (one UDP and one TCP port, 5 endpoints each, as in bench/operator_reconcile) split at
several targets: how many slices, the fullest slice (Services and KiB of stored JSON), and what one endpoint change
costs: the JSON patch the operator sends (independent of the target) and the watch traffic to the nodes (every node
watching slices receives the whole changed slice: its size times the nodes).
Run: .venv/bin/python -m bench.slice_sizes [--services N] [--nodes N]
"""

from __future__ import annotations

import argparse
import json
from unittest import mock

from aether.operator.reconcile import slicing
from aether.operator.reconcile.model import ClusterModel
from aether.testing.apitestbed import objects as o

PORTS = [("dns", 53, "UDP"), ("http", 8080, "TCP")]
SLICE_PORTS = [("dns", 5353, "UDP"), ("http", 8080, "TCP")]


def build(n: int) -> ClusterModel:
    m = ClusterModel()
    m.apply_raw("namespace", o.namespace("big"))
    for k in range(n):
        m.apply_raw("service", o.service("big", f"s{k}", f"10.96.{k // 250}.{k % 250 + 1}", PORTS))
        eps = [(f"10.{k // 250}.{k % 250}.{e + 1}", True, None) for e in range(5)]
        m.apply_raw("slice", o.endpoint_slice("big", f"s{k}", SLICE_PORTS, eps))
    return m


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.slice_sizes")
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=1000)
    args = ap.parse_args(argv)
    m = build(args.services)
    m.reconcile()
    print(f"one namespace of {args.services} Services; {args.nodes} nodes watch the slices")
    print(f"{'target':>6} {'slices':>6} {'fullest':>8} {'largest KiB':>11} {'mean KiB':>8} {'watch MiB/change':>16}")
    for target in (16, 32, 64, 128, 256):
        with mock.patch.object(slicing, "TARGET_SERVICES", target):
            specs = slicing.plan("big", m.results["big"].contributions)
        sizes = [len(json.dumps(s, separators=(",", ":"))) for s in specs.values()]
        fullest = max(s["services"] for s in specs.values())
        mean = sum(sizes) / len(sizes)
        print(
            f"{target:>6} {len(specs):>6} {fullest:>8} {max(sizes) / 1024:>11.1f} {mean / 1024:>8.1f} "
            f"{mean * args.nodes / 2**20:>16.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
