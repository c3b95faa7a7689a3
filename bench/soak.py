"""A soak under churn with the design record's gates: every traffic class paced and continuous from several pods and
ServiceAccounts, churn on a seeded schedule, every failure classified, and the zero-count invariants counted.

    .venv/bin/python -m bench.soak --minutes M --json OUT [--seed S] [--interval 0.25] [--churn-every 15]
        [--restart-every-rounds 1] [--restarts-until-min M]

The mesh (aether.e2e.harness.Mesh: the real control plane, the operator, per node a sidecar and a real Envoy, pods
captured by the real aether-cni), two nodes:

    node-a: client-a1 (SA alpha), client-a2 (SA beta); dns-2, w1-0, web-1, the new ServiceAccounts' pods
    node-b: client-b1 (SA gamma), client-b2 (SA delta); echo-0, dns-1, w2-0, web-0, floor-0, new SAs' pods

node-a's sidecar sends east-west over HTTP/3 twins (class `h3`); node-b's runs `--east-west-quic off`, so its pods
call `web` over the h2 clusters (class `h2`). Both inbounds serve both. client-b2 runs the h2 class only.

Services: `echo` (UDP echo, rolled), `dns` (dnsmasq on dns-1 and dns-2), `split` (UDPRoute: w1 and w2 by weight),
`web` (HTTP east-west, SA web, a MeshAuthorizationPolicy naming its callers), `floor` (raw TCP 18082).
Traffic classes: bench.soak_traffic; churn events: bench.soak_churn; process watch: bench.soak_watch; h3 and h2
CPU per request: bench.soak_cpu; the report (JSON fields, documented windows, slopes): bench.soak_report. Needs
root (netns, nftables).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from aether.api.naming import mesh_host
from aether.e2e.harness import Mesh
from aether.e2e.lifecycle import add_tcp_floor_service, restart_operator, restart_sidecar
from aether.e2e.node_proxy import MeshNodeProxy
from aether.testing.controlplane.cluster import free_port
from aether.testing.udp_clients import dnsmasq_argv
from bench.soak_churn import POLICY, PROCESS_RESTARTS, Churn
from bench.soak_cpu import CpuProbe, Source, paced, summary
from bench.soak_growth import leak_gate, second_half, verdicts
from bench.soak_growth import table_lines as growth_table
from bench.soak_growth import worst as worst_growth
from bench.soak_report import (
    DOCUMENTED,
    Sample,
    classes,
    event_records,
    failure_record,
    per_minute,
    slopes,
    table,
)
from bench.soak_traffic import PROBES, Prober, Recorder
from bench.soak_watch import Watcher

NS = "soak"
CLIENTS = {
    "client-a1": ("node-a", "alpha"),
    "client-a2": ("node-a", "beta"),
    "client-b1": ("node-b", "gamma"),
    "client-b2": ("node-b", "delta"),
}
H2_NODE = "node-b"  # its sidecar runs --east-west-quic off
ONLY_HTTP = {"client-b2"}  # runs its node's HTTP class only
DNS = {"dns-1": ("node-b", "192.0.2.1"), "dns-2": ("node-a", "192.0.2.2")}


def _progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@contextmanager
def soak_mesh(workdir: Path | None) -> Iterator[tuple[Mesh, dict[str, int]]]:
    """The two-node mesh above, every Service answering; (the mesh, node -> its sidecar's metrics port)."""
    mesh = Mesh(workdir=workdir, namespace=NS, areas="udp,tcp-floor,eastwest", shared_ca=True, progress=_progress)
    try:
        a, b = mesh.add_node("node-a"), mesh.add_node("node-b")
        mesh.start_node_proxies()
        ports = {n: free_port() for n in mesh.nodes}
        for node in (a, b):  # each sidecar with its own metrics endpoint (both run in the harness's netns)
            mesh.sidecar_args = sidecar_args(node.name, ports)
            restart_sidecar(mesh, node)
        ports[""] = free_port()  # the operator's (its node name in the samples is "")
        mesh.operator_args = ("--metrics", f"127.0.0.1:{ports['']}")
        restart_operator(mesh)
        for pod, (where, sa) in CLIENTS.items():
            mesh.add_pod(mesh.nodes[where], pod, sa=sa)
        _backends(mesh, a, b)
        yield mesh, ports
    finally:
        mesh.close()


def sidecar_args(node: str, ports: dict[str, int]) -> tuple[str, ...]:
    """A node's sidecar flags in the soak (every restart keeps them): its metrics port; QUIC off on H2_NODE."""
    quic = ("--east-west-quic", "off") if node == H2_NODE else ()
    return ("--metrics", f"127.0.0.1:{ports[node]}", *quic)


def http_class(node: str) -> str:
    return "h2" if node == H2_NODE else "h3"


def kinds_of(pod: str, node: str) -> tuple[str, ...]:
    """The classes a fixed client runs: every UDP/TCP class and its node's HTTP class (ONLY_HTTP: that one)."""
    if pod in ONLY_HTTP:
        return (http_class(node),)
    return tuple(k for k in PROBES if k not in ("h3", "h2") or k == http_class(node))


def _backends(mesh: Mesh, a: MeshNodeProxy, b: MeshNodeProxy) -> None:
    for name, (node, answer) in DNS.items():
        mesh.add_backend(mesh.nodes[node], name, partial(_dnsmasq, answer=answer, workdir=mesh.dir))
    mesh.add_backend(b, "echo-0")
    mesh.add_backend(a, "w1-0")
    mesh.add_backend(b, "w2-0")
    floor = [sys.executable, "-m", "aether.testing.http_echo", "floor-0"]
    mesh.add_backend(b, "floor-0", lambda ip, port: [*floor, str(port)])
    mesh.add_http_backend(b, "web-0", sa="web")
    mesh.add_http_backend(a, "web-1", sa="web")
    mesh.add_service("echo", ["echo-0"])
    mesh.add_service("dns", list(DNS))
    mesh.add_service("w1", ["w1-0"])
    mesh.add_service("w2", ["w2-0"])
    mesh.add_service("split", ["w1-0"])
    mesh.weighted_route("split", "split", {"w1": 50, "w2": 50})
    add_tcp_floor_service(mesh, "floor", ["floor-0"])
    mesh.add_http_service("web", ["web-0", "web-1"])
    mesh.programmed(a)
    mesh.programmed(b)


def _dnsmasq(ip: str, port: int, answer: str, workdir: Path) -> list[str]:
    return dnsmasq_argv(ip, port, answer, workdir)


def _recorder(mesh: Mesh, ports: dict[str, int]) -> Recorder:
    rec = Recorder(mesh, metrics_ports=ports)
    rec.allow("echo", "echo-0")
    rec.allow("dns", *(ip for _, ip in DNS.values()))
    rec.allow("split", "w1-0", "w2-0")
    rec.allow("web", "web-0", "web-1")
    rec.allow("floor", "floor-0")
    return rec


# glibc's per-thread cache (tcache) off in every process the mesh starts: glibc's heap-in-use figure (mallinfo2,
# what the leak gate reads for the sidecars and the operator) counts the chunks a thread freed into its own cache
# as in use, up to about 180 KiB a thread that has done mixed-size work (tests/test_metrics_heap.py), and a thread
# fills its cache the first time it does such work (after an API outage, several idle threads at once), so the
# figure can step up and stay with nothing more live. Off, freed chunks go back to the arena and the figure is what
# is allocated (the sidecars' 0.7-1.1 MiB steps in the soak remained with it off: docs/performance.md). It changes
# where freed memory waits, not what is live; Envoy uses tcmalloc.
MALLOC_ENV = {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}


def measured_malloc_env(environ: dict[str, str]) -> dict[str, str]:
    """`environ` with MALLOC_ENV's tunable added to any it already sets."""
    have = [
        t
        for t in (environ.get("GLIBC_TUNABLES") or "").split(":")
        if t and not t.startswith("glibc.malloc.tcache_count=")
    ]
    return {**environ, "GLIBC_TUNABLES": ":".join([*have, MALLOC_ENV["GLIBC_TUNABLES"]])}


def run(args: argparse.Namespace) -> dict[str, Any]:
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    os.environ.update(measured_malloc_env(dict(os.environ)))  # before the mesh: every process inherits it
    rng = random.Random(seed)
    load = {"before": os.getloadavg()}
    workdir = Path(args.workdir) if args.workdir else None
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    with soak_mesh(workdir) as (mesh, ports):
        rec = _recorder(mesh, ports)
        swap = threading.Lock()
        probers: list[Prober] = []

        def start(node: str, pod: str, sa: str, kinds: tuple[str, ...] = ()) -> list[Prober]:
            kinds = kinds or (http_class(node),)  # a new ServiceAccount's pod calls web over its node's transport
            started = [Prober(rec, k, mesh.pods[pod], sa, args.interval, rng.randrange(1 << 30)) for k in kinds]
            for p in started:
                p.start()
            probers.extend(started)
            return started

        def metrics_args(node: MeshNodeProxy) -> tuple[str, ...]:
            return sidecar_args(node.name, ports)

        callers = [sa for _, sa in CLIENTS.values()]
        churn = Churn(mesh, rec, rng, start, metrics_args, swap, callers, restart_every=args.restart_every_rounds)
        if args.restarts_until_min is not None:
            churn.restarts_until = time.monotonic() + args.restarts_until_min * 60
        churn._policy()
        for sa in callers:
            churn._rbac_has(f"spiffe://cluster.local/ns/{NS}/sa/{sa}")
        watcher = Watcher(mesh, rec, swap, metrics_args, lambda: {p.sa for p in probers if p.is_alive()}, ports)
        watcher.sample_every = args.sample_every
        for pod, (node, sa) in CLIENTS.items():
            start(node, pod, sa, kinds_of(pod, node))
        cpu = _cpu_probe(mesh, rec, churn, args.cpu_every)
        t0 = time.monotonic()
        watcher.start()
        _progress(f"soak: {args.minutes} min, seed {seed}, {len(probers)} probers, an event every {args.churn_every}s")
        with cpu.running() if cpu is not None else nullcontext():
            _churn(churn, t0 + args.minutes * 60, args.churn_every)
        for p in probers:
            p.stop.set()
        for p in probers:
            p.join(timeout=10)
        watcher.finish()
        load["after"] = os.getloadavg()
        report = _report(args, seed, t0, rec, churn, watcher, load)
        cycles = cpu.cycles if cpu else []
        out = report | summary(cycles, t0, mesh_host(NS, "web"))
        out["cpu_probe"]["paced_latency"] = paced(rec.outcomes, cycles)
        out["h2_node_twin_requests"] = _twin_requests(mesh.nodes[H2_NODE])
        return out


def _twin_requests(node: MeshNodeProxy) -> int | None:
    """Requests H2_NODE's Envoy sent on QUIC twins (since it last started): 0 unless its h2 class went HTTP/3."""
    try:
        return node.running_envoy().stat_sum(r"^cluster\.quic_.*\.upstream_rq_total$")
    except (OSError, RuntimeError):
        return None


def _cpu_probe(mesh: Mesh, rec: Recorder, churn: Churn, every: float) -> CpuProbe | None:
    """The h3 burst from client-a1 (QUIC twins), the h2 one from client-b1 (H2_NODE); None when --cpu-every 0."""
    if every <= 0:
        return None
    sources = [Source(http_class(CLIENTS[p][0]), mesh.pods[p], CLIENTS[p][1]) for p in ("client-a1", "client-b1")]
    return CpuProbe(mesh, sources, lambda: set(rec.valid["web"]), lambda: list(churn.events), every=every)


def _churn(churn: Churn, deadline: float, every: float) -> None:
    while time.monotonic() < deadline:
        for kind in churn.schedule():
            began = time.monotonic()
            if began >= deadline:
                return
            e = churn.run(kind)
            _progress(f"event {e.kind} {e.target} took {e.end - e.start if e.end else 0:.1f}s {e.detail}")
            time.sleep(max(0.0, min(every - (time.monotonic() - began), deadline - time.monotonic())))


def _row(x: Sample, t0: float) -> list[Any]:
    """One sample as the JSON's `samples` row (bench.soak_growth.verdicts reads these columns)."""
    allocated = x.heap_kib[0] if x.heap_kib else None
    return [
        *(round(x.t - t0, 1), x.role, x.node, x.pid, x.rss_kib, x.fds, x.clusters, x.pairs, allocated, x.draining),
        *(x.listeners, x.malloc_kib, x.py_blocks, x.rss_anon_kib, x.rss_file_kib),
    ]


def _report(
    args: argparse.Namespace, seed: int, t0: float, rec: Recorder, churn: Churn, w: Watcher, load: dict[str, Any]
) -> dict[str, Any]:
    t_end = time.monotonic()
    per_process = slopes(w.samples, t0 + (t_end - t0) / 2)
    rows = [_row(x, t0) for x in w.samples]
    judged = verdicts(rows, second_half(args.minutes))
    failures = [o for o in rec.outcomes if o.kind != "ok"]
    return {
        "command": " ".join([sys.executable, "-m", "bench.soak", *sys.argv[1:]]),
        "seed": seed,
        "minutes": args.minutes,
        "interval_s": args.interval,
        "churn_every_s": args.churn_every,
        "restart_every_rounds": args.restart_every_rounds,
        "restarts_until_min": args.restarts_until_min,
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "wall_s": round(t_end - t0, 1),
        "load_average": load,
        "classes": classes(rec.outcomes, churn.events),
        "nc503_after_first_use": rec.nc503_after_first_use,
        "inuse_twins_pruned": sum(1 for p in w.prunes if p.in_use),
        "prunes": [asdict(p) | {"t": round(p.t - t0, 1)} for p in w.prunes],
        "crashes": len(w.crashes),
        "crash_list": [c | {"t": round(c["t"] - t0, 1)} for c in w.crashes],
        "restarts_requested": {k: sum(1 for e in churn.events if e.kind == k) for k in PROCESS_RESTARTS},
        "rss_slope_kib_per_min": worst_growth(judged, "rss_kib"),
        "rss_anon_slope_kib_per_min": worst_growth(judged, "rss_anon_kib"),
        "fd_slope_per_min": worst_growth(judged, "fds"),
        "growth": judged,
        "leak_gate": leak_gate(judged),
        "slopes": per_process,
        "samples": rows,
        "documented_windows": DOCUMENTED,
        "events": event_records(churn.events, t0),
        "events_failed": [f"{e.kind}:{e.target}: {e.detail}" for e in churn.events if "FAILED" in e.detail],
        "failures_listed": [failure_record(o, churn.events, t0) for o in failures[:200]],
        "failures_per_minute": per_minute(failures, churn.events, t0),
        "policy": POLICY,
    }


def _terminated(signum: int, _frame: object) -> None:
    """SIGTERM: leave through the mesh's `finally` (its netns, nftables and processes go), as a KeyboardInterrupt
    would; by default the interpreter died at once and left them all behind."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, required=True)
    p.add_argument("--json", required=True, help="where the report goes")
    p.add_argument("--seed", type=int, help="the churn schedule's seed (default: from the clock, printed)")
    p.add_argument("--interval", type=float, default=0.25, help="seconds between one prober's requests")
    p.add_argument("--churn-every", type=float, default=15.0, help="seconds from one event's start to the next's")
    p.add_argument(
        "--restart-every-rounds",
        type=int,
        default=1,
        help="the sidecar, Envoy and operator restarts in every n-th round of events only (1: every round)",
    )
    p.add_argument(
        "--restarts-until-min",
        type=float,
        help="the sidecar, Envoy and operator restarts only in rounds that begin in the run's first M minutes, so"
        " that the processes of the second half, where growth is judged, are past their start-up (default: all run)",
    )
    p.add_argument("--sample-every", type=float, default=10.0, help="seconds between RSS/fd samples")
    p.add_argument(
        "--cpu-every", type=float, default=60.0, help="seconds between h3/h2 CPU probe cycles (0: none; bench.soak_cpu)"
    )
    p.add_argument("--workdir", help="keep the mesh's logs here (default: a temporary directory, removed)")
    args = p.parse_args(argv)
    if args.restart_every_rounds < 1:
        p.error("--restart-every-rounds must be at least 1")
    signal.signal(signal.SIGTERM, _terminated)
    report = run(args)
    Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(table(report, growth_table(report)))
    print(f"report: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
