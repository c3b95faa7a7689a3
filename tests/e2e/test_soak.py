"""The soak under churn in CI: `python -m bench.soak --minutes 3` as a user runs it (a subprocess from the
repository root), on the two-node mesh with the real control plane. It asserts the zero-count invariants only
(no 503 NC after a pair's first use, no in-use twin pruned, no process exiting unasked) and that the report has
the fields docs/performance.md reads (the h2 class and the h3/h2 CPU probe's too); success ratios, slopes and CPU
figures are printed, never asserted (no timing in CI).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MINUTES = 3
SEED = 2828


@pytest.mark.timeout(900)
def test_a_three_minute_soak_keeps_the_zero_count_invariants(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    argv = [sys.executable, "-m", "bench.soak", "--minutes", str(MINUTES), "--json", str(out), "--seed", str(SEED)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-6000:]}"
    print(proc.stdout)
    report = json.loads(out.read_text())
    for name in ("udp_echo", "udp_dns", "udp_weighted", "h3", "h2", "tcp_floor"):
        c = report["classes"][name]
        assert c["sent"] > 0 and {"ok", "failed_outside_windows"} <= set(c), c
    assert set(report["rss_slope_kib_per_min"]) == {"sidecar", "operator", "envoy"}
    # the growth verdicts (bench.soak_growth): every process judged, too short at 3 minutes to give a slope
    assert {"operator", "sidecar/node-a", "envoy/node-b"} <= set(report["growth"]), report["growth"]
    # [t, role, node, pid, rss, fds, clusters, pairs, allocated, draining listeners, active listeners, malloc_kib,
    # py_blocks, rss_anon, rss_file]
    rows = report["samples"]
    assert all(len(row) == 15 for row in rows) and any(row[7] is not None for row in rows)
    # RSS = RssAnon + RssFile + RssShmem (Envoy has shared memory: its hot-restart region). A process caught at its exec
    # or its exit may read 0 in either part (a CI run failed a nonzero check once, on a row it did not print), so
    # presence and the sum are asserted, and the rows that break them are printed
    odd = [row for row in rows if row[13] is None or row[14] is None or row[13] + row[14] > row[4]]
    assert not odd, odd[:5]
    envoy_rows = [r for r in rows if r[1] == "envoy"]
    assert all(row[9] is not None and row[10] for row in envoy_rows), envoy_rows[:3]
    python_rows = [r for r in rows if r[1] in ("sidecar", "operator")]  # their heap after the last full gc, /metrics
    assert {r[1] for r in python_rows} == {"sidecar", "operator"}
    assert sum(1 for r in python_rows if r[11] and r[12]) >= 0.9 * len(python_rows), python_rows[:3]
    envoys = {k: v for k, v in report["slopes"].items() if k.startswith("envoy/")}
    assert envoys and all(
        set(v["heap_kib"]) == {"allocated_kib", "heap_size_kib", "physical_kib"} for v in envoys.values()
    )
    assert set(report["cpu_per_request_us"]) == {"h3", "h2"} and "h3_over_h2_cpu" in report
    assert report["cpu_probe"]["cycles"] >= 1, report["cpu_probe"]
    assert report["h2_node_twin_requests"] == 0  # the h2 class's node sent nothing over HTTP/3
    assert report["nc503_after_first_use"] == 0, report["failures_listed"]
    assert report["inuse_twins_pruned"] == 0, report["prunes"]
    assert report["crashes"] == 0, report["crash_list"]
