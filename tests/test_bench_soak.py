"""bench/soak_report's pure parts: which failures a documented window covers, the per-class counts, and the
slope test that says whether an RSS or fd series drifts beyond its noise."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from aether.testing.benchload import ROOT, load_bench

report = load_bench("soak_report")  # bench/ by its path (aether.testing.benchload says why)
Event, Outcome, Sample = report.Event, report.Outcome, report.Sample


def _fail(cls: str, node: str, t: float, dest: str | None = None) -> object:
    return Outcome(cls, "client", node, t, t + 0.5, "timeout", dest_node=dest)


def test_an_envoy_restart_covers_its_nodes_sources_and_east_west_destinations_only() -> None:
    events = [Event("envoy_restart", "node-b", 10.0, 14.0), Event("sidecar_restart", "node-a", 20.0, 25.0)]
    assert report.in_window(_fail("udp_echo", "node-b", 12.0), events) == "envoy_restart"
    assert report.in_window(_fail("h3", "node-a", 12.0, dest="node-b"), events) == "envoy_restart"
    assert report.in_window(_fail("h3", "node-a", 12.0, dest=None), events) == "envoy_restart"  # either node
    assert report.in_window(_fail("h3", "node-a", 12.0, dest="node-a"), events) is None
    assert report.in_window(_fail("h2", "node-a", 12.0, dest="node-b"), events) == "envoy_restart"  # h2 alike
    assert report.in_window(_fail("udp_echo", "node-a", 12.0), events) is None  # UDP skips the far Envoy
    assert report.in_window(_fail("udp_echo", "node-b", 15.0), events) is None  # after the window
    assert report.in_window(_fail("udp_dns", "node-a", 22.0), events) is None  # a sidecar restart is no window


def test_a_capture_listener_swap_covers_udp_timeouts_of_its_nodes_pods_only() -> None:
    """docs/limits.md: a route edit that replaces a node's UDP capture listeners can lose a reply in flight."""
    events = [Event(report.UDP_SWAP, "node-a", 10.0, 10.8)]
    in_flight = Outcome("udp_dns", "client", "node-a", 9.0, 11.0, "timeout")  # sent before, its 2 s wait spans it
    assert report.in_window(in_flight, events) == report.UDP_SWAP
    assert report.in_window(_fail("udp_weighted", "node-a", 10.5), events) == report.UDP_SWAP
    assert report.in_window(_fail("udp_dns", "node-b", 10.0), events) is None  # the other node's listeners stayed
    assert report.in_window(_fail("udp_dns", "node-a", 11.0), events) is None  # sent after the swap
    assert report.in_window(_fail("h3", "node-a", 10.0, dest="node-a"), events) is None  # not a UDP class
    wrong = Outcome("udp_dns", "client", "node-a", 10.0, 10.1, "wrong backend")
    assert report.in_window(wrong, events) is None  # only a lost reply is what the docs describe
    assert report.UDP_SWAP in report.DOCUMENTED


def test_an_endpoint_flap_covers_lost_replies_of_its_services_class_only() -> None:
    """docs/limits.md: a backend of Service dns that stops being ready leaves at once and Envoy's udp_proxy closes
    its sessions to it, so a DNS reply on its way is lost (seen once in 15,836 queries, seed 82)."""
    events = [Event(report.ENDPOINT_FLAP, "dns-2", 10.0, 10.5)]
    assert report.in_window(Outcome("udp_dns", "client", "node-a", 9.9, 11.9, "timeout"), events) == "endpoint_flap"
    assert report.in_window(_fail("udp_dns", "node-b", 10.2), events) == "endpoint_flap"  # either node's client
    assert report.in_window(_fail("udp_echo", "node-a", 10.2), events) is None  # echo's backends did not move
    assert report.in_window(_fail("udp_weighted", "node-a", 10.2), events) is None
    assert report.in_window(_fail("udp_dns", "node-a", 11.0), events) is None  # sent after the endpoint was back
    wrong = Outcome("udp_dns", "client", "node-a", 10.1, 10.2, "wrong backend")
    assert report.in_window(wrong, events) is None  # only a lost reply is what the docs describe
    assert report.ENDPOINT_FLAP in report.DOCUMENTED


def test_classes_count_windows_apart() -> None:
    events = [Event("envoy_restart", "node-b", 10.0, 14.0)]
    outcomes = [Outcome("udp_dns", "c", "node-b", float(t), t + 0.1, "ok") for t in range(100)]
    outcomes += [_fail("udp_dns", "node-b", 11.0), _fail("udp_dns", "node-b", 50.0)]
    got = report.classes(outcomes, events)["udp_dns"]
    assert (got["sent"], got["ok"], got["failed_in_windows"], got["failed_outside_windows"]) == (102, 100, 1, 1)
    assert got["success_outside_windows"] == round(100 / 101, 6)
    assert got["by_response"] == {"timeout": 2}


def test_a_leak_is_outside_noise_and_noise_is_not() -> None:
    rng = random.Random(7)
    flat = [(m / 6, 50_000 + rng.gauss(0, 300)) for m in range(90)]  # 15 min of samples every 10 s
    leak = [(x, y + 80 * x) for x, y in flat]  # 80 KiB/min on top of the same noise: 1.2 MiB in 15 min
    assert report.slope(flat)["within_noise"] is True
    got = report.slope(leak)
    assert got["within_noise"] is False and 70 < got["per_min"] < 90


def test_slopes_take_the_longest_lived_process_of_the_second_half() -> None:
    samples = [Sample(float(t), "envoy", "node-a", 1, 1000 + t, 10) for t in range(0, 600, 10)]
    samples += [Sample(float(t), "envoy", "node-a", 2, 5000, 12) for t in range(600, 660, 10)]  # a restart
    got = report.slopes(samples, 300.0)["envoy/node-a"]
    assert got["pid"] == 1 and got["processes_in_half"] == 2
    assert got["rss_kib"]["per_min"] == 60.0  # 1 KiB per second


def test_envoy_live_clusters_get_a_slope_beside_rss() -> None:
    """Envoy's cluster_manager.active_clusters sampled beside its RSS gets its own fit and first/last, so RSS growth
    can be read against the live state (twins, Services) it grows with; a process without the count has none."""
    samples = [Sample(float(t), "envoy", "node-a", 1, 60_000 + t, 30, None, 40 + t // 60) for t in range(0, 600, 10)]
    samples.append(Sample(600.0, "sidecar", "node-a", 2, 90_000, 14))
    got = report.slopes(samples, 0.0)
    live = got["envoy/node-a"]["active_clusters"]
    assert live["first_last"] == [40, 49] and abs(live["slope"]["per_min"] - 1.0) < 0.05
    assert "active_clusters" not in got["sidecar/node-a"]


def test_envoy_draining_listeners_get_a_slope_beside_rss() -> None:
    """Listeners removed or replaced stay draining for --drain-time-s (600 s by default), stats and all: Envoy's heap
    grows with them for its first ten minutes under listener churn, so the report shows their count beside RSS."""
    samples = [
        Sample(float(t), "envoy", "node-a", 1, 60_000 + t, 30, None, 20, None, t // 30) for t in range(0, 600, 10)
    ]
    got = report.slopes(samples, 0.0)["envoy/node-a"]["draining_listeners"]
    assert got["first_last"] == [0, 19] and abs(got["slope"]["per_min"] - 2.0) < 0.1


def test_envoy_heap_figures_get_their_own_slopes_beside_rss() -> None:
    """Allocated flat while the heap and RSS step up (tcmalloc keeping freed pages): the report tells them apart."""
    samples = [
        Sample(float(t), "envoy", "node-a", 1, 60_000 + t, 30, (30_000, 40_000 + t, 50_000 + t))
        for t in range(0, 600, 10)
    ]
    samples.append(Sample(600.0, "sidecar", "node-a", 2, 90_000, 14))  # no heap figures: none reported
    got = report.slopes(samples, 300.0)
    heap = got["envoy/node-a"]["heap_kib"]
    assert heap["allocated_kib"]["slope"]["per_min"] == 0.0 and heap["allocated_kib"]["slope"]["within_noise"]
    assert heap["heap_size_kib"]["slope"]["per_min"] == 60.0 and heap["physical_kib"]["first_last"] == [50_300, 50_590]
    assert "heap_kib" not in got["sidecar/node-a"]
    assert "allocated_kib  0.0 +- 0.0 KiB/min" in report.table(
        {
            "classes": {},
            "nc503_after_first_use": 0,
            "inuse_twins_pruned": 0,
            "prunes": [],
            "crashes": 0,
            "rss_slope_kib_per_min": {},
            "fd_slope_per_min": {},
            "slopes": got,
        }
    )


def test_failures_per_minute_split_by_window() -> None:
    events = [Event("envoy_restart", "node-b", 10.0, 14.0)]
    failures = [_fail("udp_dns", "node-b", 11.0), _fail("udp_dns", "node-a", 12.0), _fail("h3", "node-a", 70.0)]
    assert report.per_minute(failures, events, 0.0) == {"udp_dns": {0: [1, 1]}, "h3": {1: [0, 1]}}


def _run_from_root(script: str) -> None:
    """`script` in a fresh interpreter from the repository root (bench.soak_churn imports the e2e harness and bench
    itself); its assertions fail the test."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    got = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr


def test_restarts_can_be_thinned_to_every_nth_round() -> None:
    """`--restart-every-rounds 3`: the process restarts appear in rounds 3, 6, ... only, every other kind in every
    round; `--restarts-until-min`: none in a round that begins after it."""
    script = (
        "import random; from bench.soak_churn import Churn, KINDS, PROCESS_RESTARTS\n"
        "c = Churn(None, None, random.Random(1), None, None, None, [], restart_every=3)\n"
        "rounds = [c.schedule() for _ in range(6)]\n"
        "assert [bool(set(r) & set(PROCESS_RESTARTS)) for r in rounds] == [False, False, True] * 2, rounds\n"
        "assert all(set(r) | set(PROCESS_RESTARTS) == set(KINDS) for r in rounds), rounds\n"
        "assert sorted(Churn(None, None, random.Random(1), None, None, None, []).schedule()) == sorted(KINDS)\n"
        "import time\n"
        "late = Churn(None, None, random.Random(1), None, None, None, [], restarts_until=time.monotonic() - 1)\n"
        "assert not set(late.schedule()) & set(PROCESS_RESTARTS), 'no restart after --restarts-until-min'\n"
        "early = Churn(None, None, random.Random(1), None, None, None, [], restarts_until=time.monotonic() + 60)\n"
        "assert set(PROCESS_RESTARTS) <= set(early.schedule())\n"
    )
    _run_from_root(script)


def test_a_new_serviceaccounts_pod_goes_to_the_node_holding_fewest_such_pods() -> None:
    """`new_sa` spreads its pods over the nodes (the drawn node on a tie) and `sa_leaves` takes the oldest from the
    node holding most, so each node's live state holds level through a run and its heap can be judged against time
    (bench.soak_growth)."""
    script = (
        "import random, types; from bench.soak_churn import Churn\n"
        "a, b = types.SimpleNamespace(name='node-a'), types.SimpleNamespace(name='node-b')\n"
        "c = Churn(types.SimpleNamespace(nodes={'node-a': a, 'node-b': b}), None, random.Random(1), None, None, None, [])\n"
        "assert c._spread(a) is a and c._spread(b) is b\n"
        "c.extra_nodes = {'caller-1': 'node-a'}\n"
        "assert c._spread(a) is b and c._spread(b) is b\n"
        "c.extra_nodes['caller-2'] = 'node-b'\n"
        "assert c._spread(a) is a and c._spread(b) is b\n"
        "c.extra = [(p, []) for p in ('caller-1', 'caller-2', 'caller-3', 'caller-4')]\n"
        "c.extra_nodes.update({'caller-3': 'node-b', 'caller-4': 'node-a'})\n"
        "assert c._leaving() == 0, 'the oldest on either node: a tie'\n"
        "c.extra_nodes['caller-4'] = 'node-b'\n"
        "assert c._leaving() == 1, 'node-b holds 3: its oldest leaves'\n"
    )
    _run_from_root(script)


def test_a_serviceaccount_that_left_leaves_the_policy() -> None:
    """`sa_leaves` takes the ServiceAccount out of the policy's callers (re-applied): the policy, and every RBAC
    made from it, holds the ServiceAccounts that have pods, not every one the run made (a policy that only grew
    grew every role's heap with time)."""
    script = (
        "import random, types; import bench.soak_churn as sc\n"
        "a = types.SimpleNamespace(name='node-a')\n"
        "applied = []\n"
        "kube = types.SimpleNamespace(authorization_policy=lambda ns, name, target, sources: applied.append(sources))\n"
        "mesh = types.SimpleNamespace(nodes={'node-a': a}, namespace='ns', kube=kube)\n"
        "sc.delete_pod = lambda mesh, pod: None\n"
        "c = sc.Churn(mesh, None, random.Random(1), None, None, None, ['alpha', 'sa-7', 'sa-9'])\n"
        "c.extra, c.extra_nodes = [('caller-7', []), ('caller-9', [])], {'caller-7': 'node-a', 'caller-9': 'node-a'}\n"
        "c.sa_leaves(sc.Event('sa_leaves', 'node-a', 0.0), a)\n"
        "assert c.callers == ['alpha', 'sa-9'], c.callers\n"
        "assert [s.rsplit('/', 1)[1] for s in applied[-1]] == ['alpha', 'sa-9', 'ghost-0'], applied\n"
    )
    _run_from_root(script)


def test_a_processes_rss_is_sampled_with_its_anonymous_and_file_backed_parts() -> None:
    """RSS = RssAnon + RssFile + RssShmem (the kernel's own account, one read of /proc/PID/status): the soak samples
    the two parts beside the sum, as most of an Envoy's RSS is its executable's pages, shared and evictable.
    bench.soak_watch imports bench.* by package, so it runs from the repository root in a child interpreter."""
    code = (
        "import json, os; from bench.soak_watch import proc_sample;"
        "print(json.dumps([proc_sample(os.getpid()), proc_sample(2**22 + 1), open('/proc/self/status').read()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    got, gone, status = json.loads(out.stdout)
    rss, fds, anon, file = got
    shmem = int(next(line.split()[1] for line in status.splitlines() if line.startswith("RssShmem:")))
    assert anon and file and fds > 0
    assert abs(rss - (anon + file + shmem)) <= 64, (rss, anon, file, shmem)  # two reads of a living process
    assert gone is None  # above pid_max: never a process
