"""What a scrape of the sidecar's kernel UDP counters costs (issue 29; needs root: network namespaces, nftables).

    .venv/bin/python -m bench.kernel_udp_scrape [--netns N] [--services S] [--sweeps K]

N fresh network namespaces each get tables `ip|ip6 aether_udp` for S Services of two backends
(`bench.kernel_udp_program.arms`, `program_kernel_udp`), then the sidecar's collector
(`aether.xds.sidecar.kernel_metrics.KernelUdpCollector`) sweeps every netns's counters K times without its pauses
(what the reading itself costs). Prints p50 and p99 of one sweep (all N netns, summed) and of one netns's read,
what a sweep paced to the collector's duty takes, what a scrape then costs (it reads no netns) and how many series
it exports.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

from aether.netns.kernel_udp import KernelUdpCounter
from aether.netns.kernel_udp_install import program_kernel_udp, read_kernel_udp_counters
from aether.testing.netlab import Lab, is_root
from aether.xds.sidecar.kernel_metrics import DUTY, KernelUdpCollector
from aether.xds.sidecar.kernel_path import Applied, PodTarget, vip_key
from bench.kernel_udp_program import arms


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.kernel_udp_scrape")
    p.add_argument("--netns", type=int, default=100)
    p.add_argument("--services", type=int, default=1000)
    p.add_argument("--sweeps", type=int, default=3)
    args = p.parse_args(argv)
    if not is_root():
        print("bench.kernel_udp_scrape needs root (network namespaces, nftables)", file=sys.stderr)
        return 2
    with Lab() as lab:
        current = tuple(arms(args.services, 0))
        services = {vip_key(a.vip): f"bench/svc-{i}" for i, a in enumerate(current)}
        held = []
        for i in range(args.netns):
            path = lab.add_node(f"s{i}").path
            program_kernel_udp(path, current)
            held.append(Applied(PodTarget(f"bench/pod-{i}", path), current, services))
        reads: list[float] = []

        def timed_read(netns: str) -> list[KernelUdpCounter]:
            t0 = time.perf_counter()
            try:
                return read_kernel_udp_counters(netns)
            finally:
                reads.append(time.perf_counter() - t0)

        collector = KernelUdpCollector(lambda: held, timed_read)
        sweeps: list[float] = []
        for _ in range(args.sweeps):
            t0 = time.perf_counter()
            collector.sweep()  # unpaced: the reading's own cost
            sweeps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        series = sum(len(m.samples) for m in collector.collect())
        scrape = time.perf_counter() - t0
    sweep = statistics.median(sweeps)
    print(f"{args.netns} netns x {args.services} Services (2 backends each), {args.sweeps} sweeps, {series} series")
    print(f"one sweep (all netns, unpaced): p50 {sweep:.2f} s, p99 {pct(sweeps, 0.99):.2f} s")
    print(f"one netns read: p50 {statistics.median(reads) * 1000:.1f} ms, p99 {pct(reads, 0.99) * 1000:.1f} ms")
    print(f"paced at {DUTY:.0%} of a CPU a sweep takes about {sweep / DUTY:.0f} s; a scrape {scrape * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
