"""What a change costs the in-kernel UDP path to program (issue 29; needs root: network namespaces, nftables).

    .venv/bin/python -m bench.kernel_udp_program [--netns N] [--services S] [--changes C]

N fresh network namespaces (a Lab's nodes, nothing else in them) each get tables `ip|ip6 aether_udp` for S
Services of two backends each (the first programming: both tables whole, read back); then C changes, each moving
one endpoint of one Service, are programmed into every netns in turn (`program_kernel_udp` with `previous`: the
tables read back and compared with what `previous` builds, then one nft transaction of only that Service's
difference, then the departed endpoint's conntrack entries deleted). Prints p50 and p99 of one netns's time for
the first programming and for a change, and the time one change takes over all N netns, one after another.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from aether.netns.kernel_udp import KernelArm, KernelBackend
from aether.netns.kernel_udp_install import program_kernel_udp
from aether.testing.netlab import Lab, is_root


def arms(services: int, moved: int) -> list[KernelArm]:
    """S Services of two backends (70/30); endpoint 2 of Service `moved % S` carries the change number."""
    out = []
    for i in range(services):
        second = f"10.30.{(moved // 250) % 250}.{moved % 250 + 1}" if i == moved % services else "10.31.0.2"
        out.append(
            KernelArm(
                f"10.96.{i // 250}.{i % 250 + 1}",
                (KernelBackend(f"10.30.{i // 250}.{i % 250 + 1}", 53, 70), KernelBackend(second, 53, 30)),
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.kernel_udp_program")
    p.add_argument("--netns", type=int, default=100)
    p.add_argument("--services", type=int, default=1000)
    p.add_argument("--changes", type=int, default=5)
    args = p.parse_args(argv)
    if not is_root():
        print("bench.kernel_udp_program needs root (network namespaces, nftables)", file=sys.stderr)
        return 2
    with Lab() as lab:
        paths = [lab.add_node(f"k{i}").path for i in range(args.netns)]
        current = arms(args.services, 0)
        first: list[float] = []
        for path in paths:
            t0 = time.perf_counter()
            program_kernel_udp(path, current)
            first.append(time.perf_counter() - t0)
        per_netns: list[float] = []
        per_change: list[float] = []
        for change in range(1, args.changes + 1):
            new = arms(args.services, change)
            start = time.perf_counter()
            for path in paths:
                t0 = time.perf_counter()
                program_kernel_udp(path, new, previous=current)
                per_netns.append(time.perf_counter() - t0)
            per_change.append(time.perf_counter() - start)
            current = new
        print("| netns | Services | what | samples | p50 per netns (ms) | p99 per netns (ms) | all netns (s) |")
        print("|---|---|---|---|---|---|---|")
        for what, samples, total in (("first, whole", first, [sum(first)]), ("a change", per_netns, per_change)):
            q = statistics.quantiles(samples, n=100) if len(samples) > 1 else samples * 99
            print(
                f"| {args.netns} | {args.services} | {what} | {len(samples)} | {statistics.median(samples) * 1e3:.1f} | "
                f"{q[98] * 1e3:.1f} | {statistics.median(total):.2f} (median; max {max(total):.2f}) |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
