"""bench/soak_growth's verdict: growth after warm-up, pooled over a role's restarted processes, with and without the
live state as a regressor. The cases are the shapes the 30-minute soaks showed (processes of 3-10 minutes that grow
most in their first 1-2) and the ones the verdict must not be fooled by (a leak in every process; a live count that
only rises, which would excuse any leak)."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from aether.testing.benchload import load_bench

growth_mod = load_bench("soak_growth")  # bench/ by its path (aether.testing.benchload says why)
Point, growth = growth_mod.Point, growth_mod.growth

LIVES = [(0.0, 7.0), (7.1, 14.0), (14.1, 22.0), (22.1, 30.0)]  # a role restarted 3 times in 30 min


def _run(
    leak_per_min: float = 0.0,
    per_live: float = 0.0,
    live: object = None,
    seed: int = 1,
    noise: float = 250.0,
    also: tuple[float, Any] | None = None,
) -> list[Any]:
    """Samples every 10 s: each process warms up (+6 MiB over its first 1.5 min), then leaks at the given rate and
    follows `live(minute)` at `per_live` KiB per unit (and `also`: a second count, (KiB per unit, count(minute))),
    with Gaussian noise."""
    rng = random.Random(seed)
    out = []
    for pid, (start, end) in enumerate(LIVES, start=100):
        m = start
        while m <= end:
            age = m - start
            warm = 6_000 * min(age / 1.5, 1.0)
            counts: tuple[float, ...] = (live(m),) if callable(live) else ()
            value = 90_000 + warm + leak_per_min * age + per_live * sum(counts) + rng.gauss(0, noise)
            if also is not None:
                counts += (also[1](m),)
                value += also[0] * counts[-1]
            out.append(Point(pid, m, value, counts))
            m += 1 / 6
    return out


def _seesaw(m: float) -> float:
    """A live count that goes up and down (new ServiceAccounts arriving, others' pairs pruned)."""
    return 10 + (int(m / 1.25) % 4)


def _climbing(m: float) -> float:
    """The seesaw on a slow rise (one unit every 6 minutes): live state that grows through the run as well as moving
    up and down inside each process, so time alone sees growth the count explains."""
    return _seesaw(m) + m / 6


def test_start_up_is_not_a_leak_and_a_leak_in_every_process_is() -> None:
    flat = growth(_run())
    assert flat["judged"] == 4 and flat["within_noise"] is True and flat["grows_beyond_noise"] is False, flat
    leaky = growth(_run(leak_per_min=80.0))  # 80 KiB/min: 0.4 MiB in a 4.9-minute post-warm-up span, 2.4 in the run
    assert leaky["grows_beyond_noise"] is True and 70 < leaky["time_only"]["per_min"] < 90, leaky
    shrinking = growth(_run(leak_per_min=-80.0))  # a count falling beyond its noise is reported, not a leak
    assert shrinking["within_noise"] is False and shrinking["grows_beyond_noise"] is False, shrinking


def test_growth_with_live_state_is_told_from_growth_with_time() -> None:
    got = growth(_run(per_live=400.0, live=_climbing))
    assert got["time_only"]["within_noise"] is False, got  # time alone sees growth: the count must excuse it
    assert got["reads"] == "with_live" and got["within_noise"] is True and got["grows_beyond_noise"] is False, got
    assert 350 < got["with_live"]["per_live_unit"][0] < 450
    leaky = growth(_run(leak_per_min=80.0, per_live=400.0, live=_climbing))
    assert leaky["reads"] == "with_live" and leaky["grows_beyond_noise"] is True, leaky


def test_nothing_grows_with_time_alone_so_nothing_needs_excusing() -> None:
    """A count that goes up and down with no trend: time alone shows no growth, the verdict reads it."""
    got = growth(_run(per_live=400.0, live=_seesaw))
    assert got["reads"] == "time_only" and got["grows_beyond_noise"] is False, got
    assert 350 < got["with_live"]["per_live_unit"][0] < 450


def test_counts_that_fall_under_a_flat_heap_do_not_make_a_leak() -> None:
    """The eighth soak's Envoy node-b: its heap flat through the half while its clusters and listeners fell. The fit
    with the counts credits each with memory and finds a time slope to match (the negative control: that fit
    alone reads growth); the live counts only excuse, so time alone, flat, is the verdict."""
    falling = growth(_run(leak_per_min=120.0, per_live=400.0, live=lambda m: _seesaw(m) - 0.3 * m))
    assert falling["with_live"]["per_min"] > 100 and falling["with_live"]["within_noise"] is False, falling
    assert falling["time_only"]["within_noise"] is True, falling
    assert falling["reads"] == "time_only" and falling["grows_beyond_noise"] is False, falling


def test_a_live_count_that_only_rises_excuses_nothing() -> None:
    """A count rising with time explains a leak as well as live state does: the verdict falls back to time alone."""
    got = growth(_run(leak_per_min=80.0, live=lambda m: 10 + m / 3 + random.Random(int(m * 6)).random() * 0.2))
    assert got["reads"] == "time_only" and got["within_noise"] is False, got


def _swaps(m: float) -> float:
    """Draining listeners: each swap (every 50 s) held for 45 s, so 0 or 1 at a time, and more after a burst."""
    return float(m % (50 / 60) < 0.75) + float(int(m) % 7 == 3)


def test_two_live_counts_each_explain_their_part() -> None:
    """Envoy's heap follows its clusters and its draining listeners (~250 KiB each, held for --drain-time-s):
    both are regressors, each gets its own KiB per unit, and a leak on top is still seen."""
    got = growth(_run(per_live=400.0, live=_climbing, also=(250.0, _swaps)))
    assert got["reads"] == "with_live" and got["live_regressors"] == [0, 1] and got["within_noise"] is True, got
    per_cluster, per_draining = got["with_live"]["per_live_unit"]
    assert 350 < per_cluster < 450 and 200 < per_draining < 300, got
    leaky = growth(_run(leak_per_min=80.0, per_live=400.0, live=_climbing, also=(250.0, _swaps)))
    assert leaky["reads"] == "with_live" and leaky["grows_beyond_noise"] is True, leaky


def test_a_count_that_never_moves_inside_a_process_is_left_out() -> None:
    got = growth(_run(per_live=400.0, live=_climbing, also=(0.0, lambda m: 4.0)))
    assert got["live_regressors"] == [0] and got["reads"] == "with_live" and got["within_noise"] is True, got


def test_too_short_to_judge() -> None:
    short = [p for p in _run() if p.minute - next(s for s, e in LIVES if s <= p.minute <= e) < 4.0]
    got = growth(short)
    assert got["judged"] == 0 and got["within_noise"] is None, got


def test_the_old_rule_reads_start_up_as_a_leak() -> None:
    """The negative control for the change of rule: one process's slope from its start sees the warm-up."""
    first = [p for p in _run() if p.pid == 100]
    got = growth(first, warmup_min=0.0, min_span_min=1.0)
    assert got["within_noise"] is False, got


def test_verdicts_read_a_reports_sample_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's rows ([t_s, role, node, pid, rss, fds, clusters, pairs, allocated, draining, listeners, malloc,
    py_blocks]; older reports lack the last ones): Envoy's RSS and heap are judged with its cluster and
    draining-listener counts, the sidecar's RSS and heap in use with its pairs, the operator's with time alone; the
    leak gate reads the heaps in use, RSS and fds (here the operator's RSS steps up late in each process while its
    heap in use stays flat: the gate names it)."""
    # these processes live 7-8 minutes: Envoy judged with the common warm-up here (its own has its own test)
    monkeypatch.setattr(growth_mod, "WARMUP_MIN_BY_ROLE", {})
    rows: list[list[Any]] = []
    for p in _run(per_live=400.0, live=_climbing, also=(250.0, _swaps)):
        t = round(p.minute * 60, 1)
        clusters, draining = p.live
        rows.append([t, "envoy", "node-a", p.pid, p.value, 30, clusters, None, p.value / 2, draining, 25])
        heap = [20_000 + 400 * clusters, 150_000 + 10 * clusters]
        rows.append([t, "sidecar", "node-a", p.pid + 10, p.value - 250 * draining, 15, None, clusters, *[None] * 3])
        rows[-1] += heap
        step = 2_000 * (p.minute % 7.5 > 4.5)  # RSS: a high-water step late in each process
        wobble = int(p.minute) % 3  # the heap figures change at each full collection, once a minute
        rows.append([t, "operator", "", p.pid + 20, p.value + step, 9, *[None] * 5, 30_000 + wobble, 150_000 + wobble])
    got = growth_mod.verdicts(rows)
    assert set(got) == {"envoy/node-a", "sidecar/node-a", "operator"}
    assert got["envoy/node-a"]["rss_kib"]["reads"] == "with_live"
    assert got["envoy/node-a"]["rss_kib"]["live_regressors"] == ["active_clusters", "draining_listeners"]
    assert got["sidecar/node-a"]["rss_kib"]["reads"] == "with_live"
    assert got["operator"]["rss_kib"]["reads"] == "time_only"
    assert got["envoy/node-a"]["allocated_kib"]["reads"] == "with_live" and "allocated_kib" not in got["operator"]
    assert got["envoy/node-a"]["fds"]["within_noise"] is True
    worst = growth_mod.worst(got, "rss_kib")
    assert set(worst) == {"sidecar", "operator", "envoy"} and abs(worst["envoy"]) < 80, worst
    assert any(
        "envoy/node-a" in line and "per unit of ['active_clusters', 'draining_listeners']" in line
        for line in growth_mod.lines(got)
    )
    assert got["sidecar/node-a"]["malloc_kib"]["reads"] == "with_live"
    assert got["operator"]["rss_kib"]["grows_beyond_noise"] is True, got["operator"]["rss_kib"]
    gate = growth_mod.leak_gate(got)
    assert gate["envoy"]["metrics"] == ["allocated_kib", "rss_kib", "fds"]
    assert gate["sidecar"]["metrics"] == gate["operator"]["metrics"] == ["malloc_kib", "py_blocks", "rss_kib", "fds"]
    assert gate["envoy"]["leak"] is False and gate["sidecar"]["leak"] is False, gate
    assert gate["operator"] == {"metrics": gate["operator"]["metrics"], "nodes": {"operator": True}, "leak": True}


def test_rss_that_grows_under_a_flat_heap_fails_the_gate() -> None:
    """RSS is what the issue that asked for the soak names, and every process hands its free pages back now, so
    RSS rising 80 KiB/min in every process fails the gate though the heap in use stays flat (the gate that read
    the heaps alone passed it); the same run with flat RSS passes."""
    flat = [None, None, None, 20_000, 150_000]

    def rows(leak: float) -> list[list[Any]]:
        return [[round(p.minute * 60, 1), "sidecar", "node-a", p.pid, p.value, 15, None, 3, *flat] for p in _run(leak)]

    gate = growth_mod.leak_gate(growth_mod.verdicts(rows(80.0)))
    assert gate["sidecar"]["nodes"] == {"sidecar/node-a": True} and gate["sidecar"]["leak"] is True, gate
    assert growth_mod.leak_gate(growth_mod.verdicts(rows(0.0)))["sidecar"]["leak"] is False


def test_the_leak_gate_names_the_node_that_leaks_and_none_when_nothing_was_judged() -> None:
    flat = [None, None, None, 20_000, 150_000]
    leaky = [[round(p.minute * 60, 1), "sidecar", "node-b", p.pid, 0, 15, None, 3, *flat] for p in _run(80.0)]
    for row, p in zip(leaky, _run(80.0), strict=True):
        row[11] = p.value  # the heap in use grows 80 KiB/min in every process
    short = [[1.0 * t, "operator", "", 7, 90_000.0, 9, None, None, *flat] for t in range(0, 120, 10)]
    gate = growth_mod.leak_gate(growth_mod.verdicts(leaky + short))
    want = {"metrics": ["malloc_kib", "py_blocks", "rss_kib", "fds"], "nodes": {"sidecar/node-b": True}, "leak": True}
    assert gate["sidecar"] == want, gate
    assert gate["operator"]["leak"] is None, gate


def test_only_the_second_half_is_judged_and_a_leak_there_is_still_seen() -> None:
    """One process through a 30-minute run that grows for its first 12 minutes (allocator pages filling after each
    API outage, as the operator did) and is flat after: the whole run reads it as growth, its second half does not;
    a leak of 80 KiB/min goes on into the second half and is seen there."""
    rng = random.Random(3)
    minutes = [m / 6 for m in range(0, 181)]
    slow = [Point(1, m, 95_000 + 350 * min(m, 12.0) + rng.gauss(0, 150)) for m in minutes]
    assert growth(slow)["grows_beyond_noise"] is True
    half = growth(slow, from_min=growth_mod.second_half(30) / 60)
    assert half["from_min"] == 15.0 and half["grows_beyond_noise"] is False, half
    leaky = [Point(1, p.minute, p.value + 80 * p.minute) for p in slow]
    assert growth(leaky, from_min=15.0)["grows_beyond_noise"] is True


def test_a_figure_read_six_times_per_change_is_judged_once_per_change() -> None:
    """The heap after a full collection changes once a minute and the soak reads it every 10 s. Counted six times,
    a drift of 12 KiB/min inside a figure that swings +-150 KiB from one collection to the next read as growth
    beyond noise (the standard error shrunk by about the square root of six); judged once per collection it is
    noise. A leak of 80 KiB/min is still seen either way."""
    rng = random.Random(62)

    def rows(per_min: float) -> list[list[Any]]:
        out: list[list[Any]] = []
        for minute in range(31):
            heap = 19_300 + per_min * minute + rng.gauss(0, 150)
            for tick in range(6):  # every 10 s, the same collection's figure
                t = minute * 60 + tick * 10
                out.append([t, "sidecar", "node-a", 7, 95_000, 15, None, 0, None, None, None, round(heap), 333_000])
        return out

    drift = rows(12.0)
    judged = growth_mod.verdicts(drift, growth_mod.second_half(30))["sidecar/node-a"]["malloc_kib"]
    assert judged["samples"] == 16 and judged["grows_beyond_noise"] is False, judged
    every_read = growth([Point(7, r[0] / 60, float(r[11])) for r in drift], from_min=15.0)
    assert every_read["grows_beyond_noise"] is True, every_read  # the old reading: a leak
    # the repeats shrank the standard error by about sqrt(6) = 2.45 and added nothing
    assert judged["time_only"]["stderr"] > 2 * every_read["time_only"]["stderr"], (judged, every_read)
    leak = growth_mod.verdicts(rows(80.0), growth_mod.second_half(30))["sidecar/node-a"]["malloc_kib"]
    assert leak["grows_beyond_noise"] is True, leak


def test_envoys_quarter_hour_of_warm_up_is_not_judged_and_a_leak_after_it_is() -> None:
    """Envoy's live heap approaches its level with traffic over about 15 minutes (the soak's traffic-only run, seed
    63). An Envoy restarted at minute 8 of a 30-minute run is in that approach for most of the second half: read
    with the 3-minute warm-up of the Python processes it is growth; judged from its fifteenth minute it is not. A
    leak of 80 KiB/min on top of it is still seen in what is judged."""
    rng = random.Random(63)

    def rows(leak: float) -> list[list[Any]]:
        out: list[list[Any]] = []
        for pid, start in ((1, 0.0), (2, 8.0)):
            for tick in range(int((30 - start) * 6) + 1):
                age = tick / 6
                heap = 15_000 + 3_000 * (1 - math.exp(-age / 5)) + leak * age + rng.gauss(0, 250)
                out.append([round((start + age) * 60, 1), "envoy", "node-b", pid, 90_000, 500, 18, None, heap, 0, 35])
        return out

    warming = rows(0.0)
    got = growth_mod.verdicts(warming, growth_mod.second_half(30))["envoy/node-b"]["allocated_kib"]
    assert got["warmup_min"] == 15.0 and got["grows_beyond_noise"] is False, got
    points = [Point(r[3], r[0] / 60, r[8]) for r in warming]
    assert growth(points, 3.0, from_min=15.0)["grows_beyond_noise"] is True  # the Python processes' warm-up
    leak = growth_mod.verdicts(rows(80.0), growth_mod.second_half(30))["envoy/node-b"]["allocated_kib"]
    assert leak["grows_beyond_noise"] is True, leak


def test_a_long_runs_windows_are_judged_as_if_the_run_had_ended_there(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m bench.soak_growth REPORT --to-min M [--from-min F]`: a 60-minute run's sidecar whose RSS rises
    for its first 25 minutes, then stays: its second half (30-60) is flat; cut at minute 30, the window 15-30 is
    growth, judged against a 30-minute horizon."""
    rng = random.Random(5)
    flat = [None, None, None, None, None]
    rows = [
        [round(m * 60, 1), "sidecar", "node-a", 7, 95_000 + 40 * min(m, 25.0) + rng.gauss(0, 60), 15, None, 3, *flat]
        for m in (t / 6 for t in range(0, 361))
    ]
    report = tmp_path / "soak.json"
    report.write_text(json.dumps({"minutes": 60.0, "samples": rows}))

    def gate(*extra: str) -> dict[str, Any]:
        assert growth_mod.main([str(report), *extra]) == 0
        out: dict[str, Any] = json.loads(capsys.readouterr().out.splitlines()[-1])
        return out

    assert gate()["leak_gate"]["sidecar"]["leak"] is False
    cut = gate("--to-min", "30")
    assert cut["leak_gate"]["sidecar"]["leak"] is True, cut
    assert gate("--to-min", "30", "--from-min", "26")["leak_gate"]["sidecar"]["leak"] is False


def test_rss_is_also_judged_by_its_anonymous_and_file_backed_parts() -> None:
    """Rows with RssAnon and RssFile (columns 13, 14) get a verdict for each part beside the sum's, so a report says
    whether RSS grew in the process's own memory or in its executable's pages; older rows get none."""
    heap = [None, None, None, None, None, 20_000, 150_000]  # columns 6-12, the heap in use flat
    rows = [
        [round(p.minute * 60, 1), "sidecar", "node-a", p.pid, p.value + 36_000, 15, *heap, p.value, 36_000]
        for p in _run(80.0)
    ]
    got = growth_mod.verdicts(rows)["sidecar/node-a"]
    assert got["rss_anon_kib"]["grows_beyond_noise"] is True, got["rss_anon_kib"]
    assert got["rss_file_kib"]["grows_beyond_noise"] is False, got["rss_file_kib"]
    assert got["rss_kib"]["grows_beyond_noise"] is True
    older = growth_mod.verdicts([row[:13] for row in rows])["sidecar/node-a"]
    assert "rss_anon_kib" not in older and "rss_file_kib" not in older
