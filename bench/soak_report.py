"""The soak's bookkeeping and report (pure): every request's outcome, the churn events and the windows the docs
describe, the processes' RSS and fd samples, and what they add up to (the JSON `bench.soak` writes and its table).

A failure is *in a documented window* only when a window the docs already describe covers it. There are two.
(1) A node's capture listeners replaced (docs/limits.md: a change to a node's UDP Services replaces each pod's
capture listener, and a reply on its way at that instant is lost): recorded by the churn when a route edit moved a
node's `listener_manager.listener_modified`, from the edit until the count held still; it covers UDP timeouts of
pods on that node only. (2) A node's Envoy restarted (docs/operations.md, upgrades step 3: "while a node's pod restarts, Envoy is down: diverted
traffic on that node has no listener"), from the moment the old Envoy is stopped until the soak sees the new one
connected with as many active listeners as before. It covers requests whose source pod is on that node, and
east-west requests whose destination pod is (its inbound listener is in that Envoy); an east-west failure that names
no backend could have been bound for either node's pod of the Service, so either node's restart covers it. Every
other failure is outside.

RSS and fd slopes: per process, over the second half of the run, the least-squares slope of its samples (one every
`sample_every` seconds) against time, for the longest-lived process of that role and node in that half (a restart
the churn asked for starts a new process). "Within noise": the slope's 95 % interval (2 standard errors) contains 0,
or the drift it makes over the half (slope x minutes) is at most twice the spread of the samples around the fitted
line (their standard deviation): a steady leak drifts far beyond its own scatter, noise does not.

Envoy's own heap figures (admin /stats: `server.memory_allocated`, `server.memory_heap_size`,
`server.memory_physical_size`, sampled with its RSS) get the same slopes: RSS stays the gate, they tell a leak
(allocated grows) from the allocator keeping pages (tcmalloc: allocated flat while heap size and RSS step up).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

OK = "ok"
EAST_WEST = ("h3", "h2")  # classes whose destination side runs through the destination node's Envoy
ENVOY_RESTART = "envoy_restart"
UDP_SWAP = "udp_listener_swap"  # recorded by the churn when a route edit replaced capture listeners
ENDPOINT_FLAP = "endpoint_flap"  # one of Service dns's backends not ready, then ready again (bench.soak_churn)
FLAPPED_CLASS = "udp_dns"  # the class that asks Service dns
DOCUMENTED = {
    ENVOY_RESTART: "docs/operations.md (Upgrade, step 3): a node's Envoy down, its traffic has no listener",
    UDP_SWAP: "docs/limits.md: a change to a node's UDP Services replaces each pod's capture listener; a reply on its"
    " way at the swap is lost (Envoy path)",
    ENDPOINT_FLAP: "docs/limits.md: an endpoint that stops being ready leaves its Service at once, and Envoy closes"
    " its sessions to it; a reply on its way from it is lost (Envoy path)",
}
MAX_LISTED = 200  # failures kept in the JSON with their detail (all are counted)


@dataclass
class Outcome:
    cls: str
    source: str  # pod
    node: str  # the source pod's node
    start: float  # monotonic
    end: float
    kind: str  # ok, timeout, wrong backend, wrong identity, 503 NC, 503, 403, error
    detail: str = ""
    dest_node: str | None = None  # the pod that answered (or was meant to), east-west only
    counters: dict[str, int] = field(default_factory=dict)


@dataclass
class Event:
    kind: str
    target: str  # a node, a pod, a route...
    start: float
    end: float | None = None
    detail: str = ""

    def overlaps(self, start: float, end: float, slack: float = 0.0) -> bool:
        return self.start <= end and (self.end is None or self.end + slack >= start)


@dataclass(frozen=True)
class Sample:
    t: float
    role: str  # sidecar, envoy, operator
    node: str  # "" for the operator
    pid: int
    rss_kib: int
    fds: int
    heap_kib: tuple[int, int, int] | None = None  # Envoy: (memory_allocated, memory_heap_size, memory_physical_size)
    clusters: int | None = None  # Envoy: cluster_manager.active_clusters (live state beside RSS)
    pairs: int | None = None  # sidecar: its QUIC pairs, live and dormant (aether_quic_pairs + dormant_pairs)
    draining: int | None = None  # Envoy: listener_manager.total_listeners_draining (removed listeners kept a while)
    listeners: int | None = None  # Envoy: listener_manager.total_listeners_active (a meshed pod's come and go with it)
    malloc_kib: int | None = None  # sidecar, operator: C malloc's KiB in use (aether_process_malloc_in_use_bytes)
    py_blocks: int | None = None  # sidecar, operator: CPython's allocated blocks (aether_process_python_...)
    rss_anon_kib: int | None = None  # RssAnon: the anonymous part of RSS (heaps, arenas, stacks)
    rss_file_kib: int | None = None  # RssFile: the file-backed part (executable and libraries, shared, evictable)


HEAP_FIGURES = ("allocated_kib", "heap_size_kib", "physical_kib")
# (JSON key in the per-process slopes, Sample attribute, table label) of each live-state count sampled beside RSS
LIVE_COUNTS = (
    ("active_clusters", "clusters", "active_clusters"),  # Envoy: every Service cluster and QUIC twin it holds
    ("draining_listeners", "draining", "draining listeners"),  # Envoy: listeners removed, held for --drain-time-s
    ("active_listeners", "listeners", "active listeners"),  # Envoy: the node's and its meshed pods' listeners
    ("pairs", "pairs", "pairs"),  # sidecar: the QUIC pairs it keeps
)


@dataclass(frozen=True)
class Prune:
    t: float
    node: str
    cause: str
    twin: str
    in_use: bool
    line: str


def in_window(o: Outcome, events: Sequence[Event]) -> str | None:
    """The documented window covering failure `o` (its name), or None."""
    for e in events:
        if not e.overlaps(o.start, o.end):
            continue
        if e.kind == UDP_SWAP and o.cls.startswith("udp_") and e.target == o.node and o.kind == "timeout":
            return UDP_SWAP
        if e.kind == ENDPOINT_FLAP and o.cls == FLAPPED_CLASS and o.kind == "timeout":
            return ENDPOINT_FLAP
        if e.kind != ENVOY_RESTART:
            continue
        if e.target == o.node or (o.cls in EAST_WEST and o.dest_node in (e.target, None)):
            return ENVOY_RESTART
    return None


def failure_record(o: Outcome, events: Sequence[Event], t0: float) -> dict[str, Any]:
    """One failure as the JSON lists it: times relative to the run's start, the events in effect."""
    return {
        "class": o.cls,
        "source": o.source,
        "node": o.node,
        "t": round(o.start - t0, 3),
        "took": round(o.end - o.start, 3),
        "response": o.kind,
        "detail": o.detail[:300],
        "dest_node": o.dest_node,
        "events_in_effect": [f"{e.kind}:{e.target}" for e in events if e.overlaps(o.start, o.end)],
        "events_just_before": [f"{e.kind}:{e.target}" for e in events if e.overlaps(o.start - 5.0, o.start)],
        "documented_window": in_window(o, events),
        "counters": o.counters,
    }


def classes(outcomes: Iterable[Outcome], events: Sequence[Event]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        c = out.setdefault(o.cls, {"sent": 0, "ok": 0, "failed_in_windows": 0, "failed_outside_windows": 0})
        c.setdefault("by_response", Counter())
        c["sent"] += 1
        if o.kind == OK:
            c["ok"] += 1
            continue
        c["by_response"][o.kind] += 1
        c["failed_in_windows" if in_window(o, events) else "failed_outside_windows"] += 1
    for c in out.values():
        counted = c["sent"] - c["failed_in_windows"]
        c["success_outside_windows"] = round((counted - c["failed_outside_windows"]) / counted, 6) if counted else None
        c["by_response"] = dict(c["by_response"])
    return out


def slope(samples: Sequence[tuple[float, float]]) -> dict[str, float] | None:
    """Least squares of (minutes, value): slope per minute, its standard error, the residuals' spread."""
    if len(samples) < 4:
        return None
    xs, ys = [s[0] for s in samples], [s[1] for s in samples]
    if max(xs) - min(xs) <= 0:
        return None
    fit = statistics.linear_regression(xs, ys)
    resid = [y - (fit.slope * x + fit.intercept) for x, y in samples]
    sd = statistics.pstdev(resid)
    n = len(samples)
    sxx = sum((x - statistics.fmean(xs)) ** 2 for x in xs)
    se = math.sqrt(sum(r * r for r in resid) / (n - 2) / sxx) if n > 2 else math.inf
    return {
        "per_min": round(fit.slope, 3),
        "stderr": round(se, 3),
        "resid_sd": round(sd, 3),
        "minutes": round(max(xs) - min(xs), 2),
        "samples": n,
        "drift": round(fit.slope * (max(xs) - min(xs)), 1),
        "within_noise": bool(abs(fit.slope) <= 2 * se or abs(fit.slope) * (max(xs) - min(xs)) <= 2 * sd),
    }


def slopes(samples: Sequence[Sample], t_mid: float) -> dict[str, dict[str, Any]]:
    """(role, node) -> the RSS (KiB/min) and fd (per min) slope of its longest-lived process in the second half."""
    groups: dict[tuple[str, str], dict[int, list[Sample]]] = {}
    for s in samples:
        if s.t >= t_mid:
            groups.setdefault((s.role, s.node), {}).setdefault(s.pid, []).append(s)
    out: dict[str, dict[str, Any]] = {}
    for (role, node), by_pid in sorted(groups.items()):
        pid, run = max(by_pid.items(), key=lambda kv: (kv[1][-1].t - kv[1][0].t, len(kv[1])))
        out[f"{role}/{node}" if node else role] = {
            "pid": pid,
            "processes_in_half": len(by_pid),
            "rss_kib": slope([((s.t - t_mid) / 60, s.rss_kib) for s in run]),
            "fds": slope([((s.t - t_mid) / 60, s.fds) for s in run]),
            "rss_kib_first_last": [run[0].rss_kib, run[-1].rss_kib],
            "fds_first_last": [run[0].fds, run[-1].fds],
        }
        heap = [s for s in run if s.heap_kib is not None]
        if heap:
            out[f"{role}/{node}" if node else role]["heap_kib"] = {
                name: {
                    "slope": slope([((s.t - t_mid) / 60, (s.heap_kib or (0, 0, 0))[i]) for s in heap]),
                    "first_last": [(heap[0].heap_kib or (0, 0, 0))[i], (heap[-1].heap_kib or (0, 0, 0))[i]],
                }
                for i, name in enumerate(HEAP_FIGURES)
            }
        for key, attr, _label in LIVE_COUNTS:  # live state beside RSS: RSS growing with it flat is not growth with it
            counted = [s for s in run if getattr(s, attr) is not None]
            if counted:
                out[f"{role}/{node}" if node else role][key] = {
                    "slope": slope([((s.t - t_mid) / 60, getattr(s, attr) or 0) for s in counted]),
                    "first_last": [getattr(counted[0], attr), getattr(counted[-1], attr)],
                }
    return out


def table(report: dict[str, Any], growth_lines: Sequence[str] = ()) -> str:
    """The report as text: one line per class, then the invariants and slopes."""
    lines = [f"{'class':<14}{'sent':>8}{'ok':>8}{'in windows':>12}{'outside':>9}{'success outside':>17}  failures"]
    for name, c in sorted(report["classes"].items()):
        ratio = c["success_outside_windows"]
        shown = f"{100 * ratio:.3f} %" if ratio is not None else "-"
        lines.append(
            f"{name:<14}{c['sent']:>8}{c['ok']:>8}{c['failed_in_windows']:>12}{c['failed_outside_windows']:>9}"
            f"{shown:>17}  {c['by_response'] or ''}"
        )
    lines.append(
        f"503 NC after first use: {report['nc503_after_first_use']}; in-use twins pruned: "
        f"{report['inuse_twins_pruned']} (prunes {len(report['prunes'])}); unrequested crashes: {report['crashes']}"
    )
    lines.append(f"RSS slope KiB/min: {report['rss_slope_kib_per_min']}; fd slope /min: {report['fd_slope_per_min']}")
    if "rss_anon_slope_kib_per_min" in report:
        lines.append(f"of which anonymous (RssAnon) KiB/min: {report['rss_anon_slope_kib_per_min']}")
    if "cpu_per_request_us" in report:
        lines.append(
            f"CPU per request (us, both Envoys): {report['cpu_per_request_us']}; h3/h2 {report['h3_over_h2_cpu']}"
        )
    lines += growth_lines  # bench.soak_growth's verdicts, rendered by the caller (this module imports none of bench)
    if growth_lines:
        lines.append("per process, the longest-lived of the second half:")
    for key, v in report["slopes"].items():
        rss, fds = v["rss_kib"] or {}, v["fds"] or {}
        lines.append(
            f"  {key:<16} rss {rss.get('per_min')} +- {rss.get('stderr')} KiB/min (noise: {rss.get('within_noise')}),"
            f" fds {fds.get('per_min')} +- {fds.get('stderr')} /min (noise: {fds.get('within_noise')})"
        )
        for name, got in (v.get("heap_kib") or {}).items():
            fit = got["slope"] or {}
            lines.append(
                f"    {name:<14} {fit.get('per_min')} +- {fit.get('stderr')} KiB/min (noise: {fit.get('within_noise')}),"
                f" {got['first_last'][0]} -> {got['first_last'][1]} KiB"
            )
        for key, _attr, label in LIVE_COUNTS:
            if live := v.get(key):
                fit = live["slope"] or {}
                first, last = live["first_last"]
                lines.append(f"    {label} {fit.get('per_min')} +- {fit.get('stderr')} /min, {first} -> {last}")
    return "\n".join(lines)


def event_records(events: Sequence[Event], t0: float) -> list[dict[str, Any]]:
    out = []
    for e in events:
        d = asdict(e)
        d["start"] = round(e.start - t0, 3)
        d["end"] = None if e.end is None else round(e.end - t0, 3)
        out.append(d)
    return out


def per_minute(failures: Iterable[Outcome], events: Sequence[Event], t0: float) -> dict[str, dict[int, list[int]]]:
    """class -> minute of the run -> [failures in documented windows, failures outside]."""
    out: dict[str, dict[int, list[int]]] = {}
    for o in failures:
        cell = out.setdefault(o.cls, {}).setdefault(int((o.start - t0) // 60), [0, 0])
        cell[0 if in_window(o, events) else 1] += 1
    return out
