"""bench/soak_cycles' verdict: a figure's slope per churn cycle over the batches after the first. bench.soak_cycles
imports bench.* by package (the soak's mesh and churn), so it is imported in a child interpreter from the repository
root, as `python -m bench.soak_cycles` runs it."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _batches(per_cycle: float, noise: float, warmup: float = 0.0, n: int = 9, batch: int = 10) -> list[dict[str, Any]]:
    rng = random.Random(7)
    out = []
    for i in range(n):
        cycle = i * batch
        value = 10_000 + per_cycle * cycle + rng.gauss(0, noise) + (0 if i else -warmup)
        out.append({"cycle": cycle, "figures": {"envoy/node-a": {"allocated_kib": round(value), "stats": 3000}}})
    return out


def _judge(batches: list[dict[str, Any]]) -> dict[str, Any]:
    code = (
        "import json, sys\nfrom bench.soak_cycles import per_cycle\n"
        "print(json.dumps(per_cycle(json.loads(sys.stdin.read()))))"
    )
    got = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, input=json.dumps(batches), capture_output=True, text=True, timeout=120
    )
    assert got.returncode == 0, got.stderr
    verdicts: dict[str, Any] = json.loads(got.stdout)
    return verdicts


def test_a_figure_left_behind_by_every_cycle_is_seen_and_a_flat_one_is_not() -> None:
    leaks = _judge(_batches(per_cycle=20.0, noise=300.0))["envoy/node-a"]["allocated_kib"]
    assert not leaks["within_noise"] and 15 < leaks["per_cycle"] < 25, leaks
    flat = _judge(_batches(per_cycle=0.0, noise=300.0))["envoy/node-a"]["allocated_kib"]
    assert flat["within_noise"], flat


def test_the_first_batch_is_warm_up_and_a_count_that_never_moves_is_within_noise() -> None:
    got = _judge(_batches(per_cycle=0.0, noise=100.0, warmup=3000.0))["envoy/node-a"]
    assert got["allocated_kib"]["within_noise"] and got["allocated_kib"]["first"] > 9000, got
    assert got["stats"]["within_noise"] and got["stats"]["per_cycle"] == 0, got
