"""What a change costs the sidecar's kernel UDP worker, end to end (issue 29; needs root: netns, nftables).

    .venv/bin/python -m bench.kernel_udp_sidecar [--netns N] [--services S] [--changes C]

A MeshNode of S plaintext UDP Services (`aether.testing.samples.node_with`) and N meshed pods, each pod's record
pointing at a fresh network namespace; `KernelUdpPath("kernel")` (what `aether xds --udp-dataplane kernel` runs)
applies the plan: first every netns whole, then C changes, each moving one Service's endpoint, as the worker does
after a reconcile (`kernel_plan` over the node's arms, then `program_kernel_udp` with `previous` per pod). Prints
the plan's own time, p50 and p99 of one netns's program call, and one change over all N netns.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

from aether.netns.kernel_udp import KernelArm
from aether.netns.kernel_udp_install import program_kernel_udp
from aether.netns.records import PodRecord
from aether.testing.netlab import Lab, is_root
from aether.testing.samples import node_with
from aether.xds.sidecar.kernel_path import KernelUdpPath, kernel_plan
from bench.kernel_udp_scrape import pct


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.kernel_udp_sidecar")
    p.add_argument("--netns", type=int, default=100)
    p.add_argument("--services", type=int, default=1000)
    p.add_argument("--changes", type=int, default=3)
    args = p.parse_args(argv)
    if not is_root():
        print("bench.kernel_udp_sidecar needs root (network namespaces, nftables)", file=sys.stderr)
        return 2
    calls: list[float] = []

    def timed(
        netns_path: str,
        arms: Sequence[KernelArm],
        *,
        previous: Sequence[KernelArm] = (),
        default_idle_timeout_s: float | None = None,
    ) -> int:
        t0 = time.perf_counter()
        try:
            return program_kernel_udp(
                netns_path, arms, previous=previous, default_idle_timeout_s=default_idle_timeout_s
            )
        finally:
            calls.append(time.perf_counter() - t0)

    with Lab() as lab:
        node = node_with(args.services, args.netns)
        records = {
            pod.uid: PodRecord(uid=pod.uid, namespace=pod.namespace, name=pod.name, netns=lab.add_node(f"p{i}").path)
            for i, pod in enumerate(node.status.pods)
        }
        worker = KernelUdpPath("kernel", program=timed, idle_timeout_s=60.0)
        t0 = time.perf_counter()
        worker.apply(kernel_plan(node, records, "kernel"))
        first, first_calls = time.perf_counter() - t0, list(calls)
        plans: list[float] = []
        changes: list[float] = []
        calls.clear()
        for change in range(1, args.changes + 1):
            arm = node.status.udp.services[change % args.services]
            moved = arm.endpoints[0].model_copy(update={"ip": f"10.201.{change // 250}.{change % 250 + 1}"})
            node.status.udp.services[change % args.services] = arm.model_copy(update={"endpoints": [moved]})
            t0 = time.perf_counter()
            plan = kernel_plan(node, records, "kernel")
            plans.append(time.perf_counter() - t0)
            worker.apply(plan)
            changes.append(time.perf_counter() - t0)
        bad = dict(worker.failures)
    print(f"{args.netns} netns x {args.services} Services, {args.changes} changes; failures: {bad or 'none'}")
    print(f"first, whole: {first:.1f} s for all; one netns p50 {statistics.median(first_calls) * 1000:.0f} ms")
    print(f"kernel_plan: p50 {statistics.median(plans) * 1000:.1f} ms")
    print(f"a change, one netns: p50 {statistics.median(calls) * 1000:.1f} ms, p99 {pct(calls, 0.99) * 1000:.1f} ms")
    print(f"a change, all netns: p50 {statistics.median(changes):.2f} s, max {max(changes):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
