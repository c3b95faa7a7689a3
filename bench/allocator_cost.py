"""What the Python processes' allocator settings cost in CPU and peak memory: the sidecar's translate benchmark and
the operator's reconcile benchmark run whole, each in a fresh interpreter, under every setting in turn (interleaved
rounds, so a noisy neighbour lands on all settings alike), and the CPU time and peak RSS the kernel accounts to each
run are compared with CPython's default allocator.

    .venv/bin/python -m bench.allocator_cost [--rounds 7]

The settings: CPython's default (its own allocator, pymalloc, for objects up to 512 bytes: what the images run),
every object from C malloc (`PYTHONMALLOC=malloc`, which lets `malloc_trim` reach all free memory: the soak's
allocator-fragmentation lead), and that with glibc held to two arenas. docs/performance.md records a run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKLOADS: dict[str, list[str]] = {
    "xds_translate --quick": ["-m", "bench.xds_translate", "--quick"],
    "operator_reconcile 200x200": [
        "-m",
        "bench.operator_reconcile",
        "--namespaces",
        "200",
        "--nodes",
        "200",
        "--rounds",
        "3",
    ],
}

SETTINGS: dict[str, dict[str, str]] = {
    "pymalloc (CPython default)": {},
    "PYTHONMALLOC=malloc": {"PYTHONMALLOC": "malloc"},
    "PYTHONMALLOC=malloc, glibc.malloc.arena_max=2": {
        "PYTHONMALLOC": "malloc",
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2",
    },
}


@dataclass(frozen=True)
class Sample:
    cpu_s: float
    maxrss_kib: int


def run_once(argv: list[str], extra: dict[str, str]) -> Sample:
    """One whole run of `argv` under python with `extra` over a clean allocator environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONMALLOC", "GLIBC_TUNABLES")}
    env.update(extra)
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: a child's long stderr cannot block it before wait4
        proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"{argv} under {extra} exited {proc.returncode}: {tail}")
    return Sample(cpu_s=usage.ru_utime + usage.ru_stime, maxrss_kib=usage.ru_maxrss)


def measure(rounds: int) -> dict[str, dict[str, list[Sample]]]:
    out: dict[str, dict[str, list[Sample]]] = {w: {s: [] for s in SETTINGS} for w in WORKLOADS}
    for _ in range(rounds):
        for w, argv in WORKLOADS.items():
            for s, extra in SETTINGS.items():
                out[w][s].append(run_once(argv, extra))
    return out


def table(results: dict[str, dict[str, list[Sample]]]) -> str:
    lines = [
        "| workload | setting | CPU s (median) | CPU vs default | peak RSS MiB (median) | RSS vs default |",
        "|---|---|---|---|---|---|",
    ]
    default = next(iter(SETTINGS))
    for w, by in results.items():
        base_cpu = statistics.median(x.cpu_s for x in by[default])
        base_rss = statistics.median(x.maxrss_kib for x in by[default])
        for s, xs in by.items():
            cpu = statistics.median(x.cpu_s for x in xs)
            rss = statistics.median(x.maxrss_kib for x in xs)
            lines.append(f"| {w} | {s} | {cpu:.3f} | {cpu / base_cpu:.3f} | {rss / 1024:.1f} | {rss / base_rss:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.allocator_cost")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds of every workload and setting")
    args = ap.parse_args(argv)
    print(f"{args.rounds} interleaved rounds, load average before {os.getloadavg()[0]:.2f}")
    print(table(measure(args.rounds)))
    print(f"load average after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
