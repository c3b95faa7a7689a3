"""The soak's growth verdict (pure): does a role's memory (or fd count) grow with time beyond its noise, once each
process has warmed up, and beyond what the live state it holds explains?

Why not one process's slope: the churn restarts every role every few minutes (a sidecar or Envoy of a node lives
2.5-10 minutes, the operator about as long), so the longest-lived process of a role in the run's second half is a
few minutes old, and its slope is mostly its start-up (a process grows most in its first 1-2 minutes: imports,
first snapshot, connection buffers). A leak is growth that goes on after that, in every process, as it keeps
working. So:

1. every process of the role and node in the run (a restart starts a new one; its samples share a pid), its
   first `warmup_min` minutes left out (age counted from its first sample): 3 for the sidecar and the
   operator, 15 for Envoy, whose live heap approaches its level with traffic alone over about that long
   (WARMUP_MIN_BY_ROLE);
2. the processes with at least `min_span_min` minutes left;
3. one least-squares fit over all of them at once, each process with its own intercept (its RSS level: a process
   that started when more was live starts higher) and one common slope in time: the "within" estimator of a
   panel fit, i.e. every series centred on its own means, then stacked;
4. with live-state counts sampled beside it (Envoy: `cluster_manager.active_clusters`,
   `listener_manager.total_listeners_draining`, as a replaced listener is held, stats and all, for --drain-time-s,
   and `listener_manager.total_listeners_active`, as each meshed pod brings its own listeners; the sidecar: its QUIC pairs, live and dormant), a second fit adds each count that moved inside some process as a
   regressor, so growth that goes with what is live (a new ServiceAccount's twin, a listener swapped a moment ago)
   is told from growth with time alone. Both fits are reported. The live counts only excuse: the verdict reads
   time alone when it shows no growth beyond noise (nothing to excuse: a heap that stays flat while the counts
   fall is not called a leak because a fit crediting the fallen counts with memory then finds a time slope), else
   the second fit, unless the counts move in step with time. "In step": the second fit's slope is known more than
   COLLINEAR times less precisely than the first's (a count that only ever rises explains a leak as well as live
   state does, and the wide interval would pass anything), or the counts and time are linearly dependent.

A leak is growth, so the gate is one-sided: `grows_beyond_noise` (a positive slope not within noise); a count
that falls beyond its noise (Envoy's fds as UDP sessions time out after a busy start) is reported, not a leak.
"Within noise" is the rule the per-process slopes use, with the run as the horizon: the slope's 95 % interval (2
standard errors) contains 0, or the drift it would make over the whole run (slope x the run's minutes, as if one
process had lived through it) is at most twice the residuals' standard deviation. The horizon is the run, not a
process's span: over a 3-minute span a leak of 80 KiB/min hides in a few hundred KiB of scatter, over 30 it does not.

The sidecar's and the operator's heap figures (`malloc_kib`, `py_blocks`) are taken at the end of a full garbage
collection, once a minute, and the soak reads them every 10 s: each figure comes back six times. Judged as six
points it would count as six independent observations and shrink the standard error by about the square root of
six, so a drift of a few KiB a minute inside the figure's own minute-to-minute swing read as growth beyond noise
(the run of seed 62). So those figures are judged one point per collection: a sample that repeats the previous
sample of the same process exactly is the same collection's figure read again and is left out (`PER_COLLECTION`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WARMUP_MIN = 3.0  # from the fourth 30-minute run (seed 36): every sidecar was at its plateau by 2.5 minutes
# Envoy's live heap approaches its level with traffic alone over about a quarter hour (seed 63, no churn: node-a
# 15.9 MiB at minute 1, 17.2 at 5, 18.1 at 10, 18.5 at 15, 18.6 at 17-19), so its warm-up is judged out for longer
WARMUP_MIN_BY_ROLE = {"envoy": 15.0}
MIN_SPAN_MIN = 3.0
COLLINEAR = 3.0


@dataclass(frozen=True)
class Point:
    pid: int
    minute: float  # of the run
    value: float  # RSS KiB, or fds
    live: tuple[float, ...] = ()  # the live-state counts sampled with it (the same ones, in order, at every point)


Row = tuple[float, float, tuple[float, ...]]  # (t, y, live counts), centred


def _centred(series: dict[int, list[Point]], lives: int) -> list[Row]:
    """(t, y, live counts) of every point, each centred on its own process's means."""
    out: list[Row] = []
    for points in series.values():
        mt = statistics.fmean(p.minute for p in points)
        my = statistics.fmean(p.value for p in points)
        ml = [statistics.fmean(p.live[k] for p in points) for k in range(lives)]
        out += [(p.minute - mt, p.value - my, tuple(p.live[k] - ml[k] for k in range(lives))) for p in points]
    return out


def _inverse(m: list[list[float]]) -> list[list[float]] | None:
    """The inverse of a small symmetric positive matrix (Gauss-Jordan); None when it is (near) singular: a
    regressor that is a combination of the others (a count moving only in step with time)."""
    n = len(m)
    a = [[*row, *(1.0 if i == j else 0.0 for j in range(n))] for i, row in enumerate(m)]
    for c in range(n):
        pivot = max(range(c, n), key=lambda r: abs(a[r][c]))
        if abs(a[pivot][c]) <= 1e-9 * max(m[c][c], 1e-300):
            return None
        a[c], a[pivot] = a[pivot], a[c]
        a[c] = [v / a[c][c] for v in a[c]]
        for r in range(n):
            if r != c and a[r][c]:
                f = a[r][c]
                a[r] = [v - f * w for v, w in zip(a[r], a[c], strict=True)]
    return [row[n:] for row in a]


def _fit(rows: list[Row], groups: int) -> dict[str, Any] | None:
    """The within fit of y on t and the rows' live counts: the time slope per minute, its standard error, the
    residuals' spread, and KiB per unit of each live count."""
    xs = [(t, *v) for t, _, v in rows]
    k = len(xs[0])
    xtx = [[sum(x[i] * x[j] for x in xs) for j in range(k)] for i in range(k)]
    if any(xtx[i][i] <= 0 for i in range(k)):
        return None  # time, or a count, never moved inside a process
    inv = _inverse(xtx)
    if inv is None:
        return None
    xty = [sum(x[i] * y for x, (_, y, _) in zip(xs, rows, strict=True)) for i in range(k)]
    coef = [sum(inv[i][j] * xty[j] for j in range(k)) for i in range(k)]
    resid = [y - sum(c * xi for c, xi in zip(coef, x, strict=True)) for x, (_, y, _) in zip(xs, rows, strict=True)]
    dof = len(rows) - groups - k
    if dof <= 0:
        return None
    s2 = sum(r * r for r in resid) / dof
    out: dict[str, Any] = {
        "per_min": round(coef[0], 3),
        "stderr": round(math.sqrt(s2 * inv[0][0]), 3),
        "resid_sd": round(math.sqrt(s2), 3),
    }
    if k > 1:
        out["per_live_unit"] = [round(c, 3) for c in coef[1:]]
    return out


def growth(
    points: Sequence[Point],
    warmup_min: float = WARMUP_MIN,
    min_span_min: float = MIN_SPAN_MIN,
    live_names: Sequence[str] = (),
    from_min: float = 0.0,
) -> dict[str, Any]:
    """The verdict on one role and node: see the module's docstring. `within_noise` None: too little to judge.
    `live_names` name the points' live counts in the verdict (`live_regressors`; by index where unnamed); only
    points from minute `from_min` of the run are judged (a process's warm-up still counts from its first point)."""
    by_pid: dict[int, list[Point]] = {}
    for p in sorted(points, key=lambda p: p.minute):
        by_pid.setdefault(p.pid, []).append(p)
    kept: dict[int, list[Point]] = {}
    for pid, series in by_pid.items():
        warm = [p for p in series if p.minute - series[0].minute >= warmup_min and p.minute >= from_min]
        if warm and warm[-1].minute - warm[0].minute >= min_span_min:
            kept[pid] = warm
    out: dict[str, Any] = {
        "processes": len(by_pid),
        "judged": len(kept),
        "warmup_min": warmup_min,
        "from_min": from_min,
        "spans_min": sorted(round(s[-1].minute - s[0].minute, 1) for s in kept.values()),
        "samples": sum(len(s) for s in kept.values()),
        "time_only": None,
        "with_live": None,
        "within_noise": None,
    }
    if not kept:
        return out
    horizon = max(p.minute for p in points) - min(p.minute for p in points)
    out["horizon_min"] = round(horizon, 1)
    centred = _centred(kept, min(len(p.live) for s in kept.values() for p in s))
    moving = [k for k in range(len(centred[0][2])) if any(v[k] for _, _, v in centred)]  # inside some process
    out["live_regressors"] = [live_names[k] if k < len(live_names) else k for k in moving]
    for key, counts in (("time_only", []), ("with_live", moving)):
        if key == "with_live" and not counts:
            continue
        fit = _fit([(t, y, tuple(v[k] for k in counts)) for t, y, v in centred], len(kept))
        if fit is not None:
            fit["drift"] = round(fit["per_min"] * horizon, 1)
            fit["within_noise"] = bool(
                abs(fit["per_min"]) <= 2 * fit["stderr"] or abs(fit["drift"]) <= 2 * fit["resid_sd"]
            )
        out[key] = fit
    alone, live = out["time_only"], out["with_live"]
    usable = live is not None and (alone is None or live["stderr"] <= COLLINEAR * max(alone["stderr"], 1e-9))
    # the live counts only excuse: with no growth in time alone there is nothing to excuse, and a fit that finds a
    # time slope only once counts that fell are credited with memory is not evidence of a leak by itself
    reads = "with_live" if usable and (alone is None or _grows(alone)) else "time_only"
    verdict = out[reads]
    out["reads"] = reads
    out["within_noise"] = None if verdict is None else verdict["within_noise"]
    out["grows_beyond_noise"] = _grows(verdict)
    return out


def _grows(fit: dict[str, Any] | None) -> bool | None:
    return None if fit is None else bool(fit["per_min"] > 0 and not fit["within_noise"])


# the samples row's columns of the role's live-state counts: Envoy's active clusters, draining listeners (a
# replaced listener is held, stats and all, for --drain-time-s) and active listeners; the sidecar's QUIC pairs
LIVE_COLUMNS = {
    "envoy": {"active_clusters": 6, "draining_listeners": 9, "active_listeners": 10},
    "sidecar": {"pairs": 7},
}
# allocated_kib: Envoy's server.memory_allocated; malloc_kib, py_blocks: a sidecar's or the operator's heap in use
# rss_anon_kib, rss_file_kib: RSS's anonymous and file-backed parts (RssAnon, RssFile; rss_kib is their sum)
METRICS = {
    "rss_kib": 4,
    "fds": 5,
    "allocated_kib": 8,
    "malloc_kib": 11,
    "py_blocks": 12,
    "rss_anon_kib": 13,
    "rss_file_kib": 14,
}
LIVE_JUDGED = (
    "rss_kib",
    "allocated_kib",
    "malloc_kib",
    "py_blocks",
    "rss_anon_kib",
    "rss_file_kib",
)  # judged with the live counts beside time
PER_COLLECTION = ("malloc_kib", "py_blocks")  # figures of the last full collection: one point per collection


def verdicts(rows: Sequence[Sequence[Any]], from_s: float = 0.0) -> dict[str, dict[str, Any]]:
    """role/node -> {metric: growth(...)} from the report's `samples` rows ([t_s, role, node, pid, rss_kib, fds,
    active_clusters, pairs, allocated_kib, draining_listeners, active_listeners, malloc_kib, py_blocks, rss_anon_kib,
    rss_file_kib]; rows of
    older reports lack the last columns, and a metric a role never has, allocated_kib outside Envoy, is left out), judged from second
    `from_s` of the run (bench.soak passes `second_half`)."""
    groups: dict[str, list[Sequence[Any]]] = {}
    for row in rows:
        groups.setdefault(f"{row[1]}/{row[2]}" if row[2] else row[1], []).append(row)
    out: dict[str, dict[str, Any]] = {}
    for key, got in sorted(groups.items()):
        cols = LIVE_COLUMNS.get(key.split("/")[0], {})
        out[key] = {}
        for metric, at in METRICS.items():
            points = [
                Point(
                    int(r[3]), r[0] / 60, float(r[at]), _live(r, list(cols.values())) if metric in LIVE_JUDGED else ()
                )
                for r in got
                if len(r) > at and r[at] is not None
            ]
            if metric in PER_COLLECTION:
                points = one_per_collection(points)
            if points:
                warm = WARMUP_MIN_BY_ROLE.get(key.split("/")[0], WARMUP_MIN)
                out[key][metric] = growth(points, warm, live_names=list(cols), from_min=from_s / 60)
    return out


def one_per_collection(points: Sequence[Point]) -> list[Point]:
    """The points of a figure read more often than it changes (the heap at the end of the last full collection),
    each collection's once: a point equal to the previous point of its process is that figure read again."""
    last: dict[int, float] = {}
    out = []
    for p in sorted(points, key=lambda p: p.minute):
        if last.get(p.pid) != p.value:
            out.append(p)
        last[p.pid] = p.value
    return out


def _live(row: Sequence[Any], cols: Sequence[int]) -> tuple[float, ...]:
    """The row's live counts, up to the first it lacks (an older report's row, or a count not sampled then)."""
    out: list[float] = []
    for col in cols:
        if len(row) <= col or row[col] is None:
            break
        out.append(float(row[col]))
    return tuple(out)


def second_half(minutes: float) -> float:
    """The second of the run the growth verdict starts at: its second half, as the issue that asked for the soak
    defines the slope (a process's first minutes are start-up, and a run's first half has the most of them)."""
    return minutes * 60 / 2


# What each role's leak gate reads: the heap in use (a leak shows there first and plainly), RSS and open fds (what
# the issue that asked for the soak names). Each process hands its free pages back (Envoy's tcmalloc at 1 MiB/s,
# its bootstrap's memory_allocator_manager; the sidecar's and the operator's glibc malloc after each periodic full
# collection, aether.heap.release_free_pages), so RSS no longer keeps every freed page; what fragmentation still
# keeps is read as growth (docs/performance.md, the seventeenth run). Until then the gate read the heaps alone
GATE = {
    "envoy": ("allocated_kib", "rss_kib", "fds"),
    "sidecar": ("malloc_kib", "py_blocks", "rss_kib", "fds"),
    "operator": ("malloc_kib", "py_blocks", "rss_kib", "fds"),
}


def leak_gate(per_key: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """role -> the gate's reading: its metrics (GATE), per node whether any grows beyond noise, and `leak`: any node
    does, None when no node had a process long enough to judge."""
    out: dict[str, dict[str, Any]] = {}
    for key, v in per_key.items():
        role = key.split("/")[0]
        gate = out.setdefault(role, {"metrics": list(GATE.get(role, ("rss_kib", "fds"))), "nodes": {}, "leak": None})
        got = [v[m].get("grows_beyond_noise") for m in gate["metrics"] if m in v]
        grows = None if not got or all(g is None for g in got) else any(bool(g) for g in got)
        gate["nodes"][key] = grows
        if grows is not None:
            gate["leak"] = bool(gate["leak"]) or grows
    return out


def worst(per_key: dict[str, dict[str, Any]], metric: str) -> dict[str, float | None]:
    """role -> the slope its verdict reads for the worse of its nodes (largest |slope|); None: nothing to judge."""
    out: dict[str, float | None] = {"sidecar": None, "operator": None, "envoy": None}
    for key, v in per_key.items():
        role, got = key.split("/")[0], v[metric]
        fit = got.get(got.get("reads") or "", None)
        if fit is not None and (out[role] is None or abs(fit["per_min"]) > abs(out[role] or 0.0)):
            out[role] = fit["per_min"]
    return out


def lines(per_key: dict[str, dict[str, Any]]) -> list[str]:
    """The verdicts as table lines."""
    out = []
    for key, v in per_key.items():
        for metric, got in v.items():
            fit = got.get(got.get("reads") or "") or {}
            extra = f", {fit['per_live_unit']} per unit of {got['live_regressors']}" if "per_live_unit" in fit else ""
            out.append(
                f"  {key:<16} {metric:<7} {fit.get('per_min')} +- {fit.get('stderr')} /min ({got.get('reads')},"
                f" {got['judged']} of {got['processes']} processes, spans {got['spans_min']} min{extra}):"
                f" within noise {got['within_noise']}, grows beyond it {got.get('grows_beyond_noise')}"
            )
    return out


def table_lines(report: dict[str, Any]) -> list[str]:
    """The report's growth verdicts and leak gate as the lines bench.soak_report.table prints."""
    if "growth" not in report:
        return []
    out = ["growth after warm-up, pooled over each role's processes (bench.soak_growth):", *lines(report["growth"])]
    for role, gate in sorted(report.get("leak_gate", {}).items()):
        out.append(f"  leak gate {role:<9} reads {'+'.join(gate['metrics']):<20} leak: {gate['leak']}  {gate['nodes']}")
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.soak_growth REPORT.json`: the verdicts of a saved soak report's samples, as JSON."""
    p = argparse.ArgumentParser(prog="python -m bench.soak_growth", description=main.__doc__)
    p.add_argument("report")
    p.add_argument("--from-min", type=float, help="judge from this minute of the run (default: its second half)")
    p.add_argument(
        "--to-min",
        type=float,
        help="leave out the samples after this minute, as if the run had ended there (a long run's windows: does "
        "a slope fall with the processes' age?)",
    )
    args = p.parse_args(argv)
    report = json.loads(Path(args.report).read_text())
    rows = [r for r in report["samples"] if args.to_min is None or r[0] / 60 <= args.to_min]
    minutes = report["minutes"] if args.to_min is None else min(report["minutes"], args.to_min)
    got = verdicts(rows, second_half(minutes) if args.from_min is None else args.from_min * 60)
    print("\n".join(lines(got)))
    summary = {"rss_slope_kib_per_min": worst(got, "rss_kib"), "fd_slope_per_min": worst(got, "fds")}
    print(json.dumps(summary | {"leak_gate": leak_gate(got)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
