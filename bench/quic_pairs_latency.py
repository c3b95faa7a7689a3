"""First request of a new QUIC pair (the twin fetched on demand) vs a warm request, through the whole mesh: the e2e
harness (API test bed, operator, two cluster-mode sidecars, real Envoys in netns), `--sources` client pods on
node-a, each with its own ServiceAccount, calling Service web on node-b.

    .venv/bin/python -m bench.quic_pairs_latency [--sources 24] [--block 4] [--warm 20] [--timeline]
        [--odcds-flag default|off] [--workdir DIR] [--envoy-debug [LOGGERS]]

Every request is curl's (`time_total`, one connection per request to the outbound listener), run in the pod's
netns as its own process: the API test bed lives in this process, and a client here would be timed with the
GIL the test bed holds while the sidecar writes the pair. Three arms, one run:

1. first use: each pod's first request (Envoy pauses it, fetches the twin over ODCDS, resumes it over HTTP/3),
   then `--warm` more (warm: the twin and its QUIC connection exist);
2. after node-a's Envoy restarts (a new process: the persisted pairs' twins come back with the snapshot, no
   connection yet): each pod's first request again, with no fetch (checked), so it pays only the new source
   identity's QUIC handshake; then `--warm` more.

Printed: p50 of each, the first use's addition over warm, split into the on-demand part (first use minus
handshake-only) and the handshake part (handshake-only minus warm); node-a's sidecar's own part
(`aether_quic_pair_fetch_seconds`) and Envoy's QUIC connect time per twin (`upstream_cx_connect_ms`).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
from pathlib import Path
from typing import Any

from aether.api.naming import mesh_host, spiffe_id
from aether.e2e.harness import Mesh
from aether.e2e.lifecycle import restart_envoy, restart_sidecar
from aether.e2e.node_proxy import MeshNodeProxy
from aether.netns.contract import HTTP_OUTBOUND_PORT
from aether.testing.promtext import scrape, value
from aether.testing.wait import wait_for

NS = "bench"
METRICS_PORT = 19392
ODCDS_FLAG = "envoy.reloadable_features.odcds_over_ads_fix"
URL = f"http://127.0.0.1:{HTTP_OUTBOUND_PORT}/"


def curl(netns: str, host: str) -> tuple[float, int, str]:
    """One GET by curl in the pod's netns: (curl's time_total in ms, status, body)."""
    out = subprocess.run(
        [
            "nsenter",
            f"--net={netns}",
            "curl",
            "-sS",
            "--max-time",
            "10",
            "-H",
            f"Host: {host}",
            "-w",
            "\n%{http_code} %{time_total}",
            URL,
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    body, _, tail = out.stdout.rpartition("\n")
    code, _, total = tail.partition(" ")
    if out.returncode != 0:
        raise SystemExit(f"curl failed ({out.returncode}): {out.stderr.strip()}")
    return float(total) * 1000, int(code), body


def sidecar_fetches() -> tuple[float, float]:
    samples = scrape(f"http://127.0.0.1:{METRICS_PORT}/metrics")
    return value(samples, "aether_quic_pair_fetch_seconds_sum") * 1000, value(
        samples, "aether_quic_pair_fetch_seconds_count"
    )


def debug(envoy: Any, loggers: str) -> None:
    if loggers == "all":
        envoy.admin("/logging?level=debug", "POST")
    else:
        envoy.admin("/logging?paths=" + ",".join(f"{n}:debug" for n in loggers.split(",")), "POST")


_STAMP = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6})\]"


def _t(stamp: str) -> float:
    _day, clock = stamp.split(" ")
    h, mi, sec = clock.split(":")
    return int(h) * 3600 + int(mi) * 60 + float(sec)


def timeline(log: str, twin: str) -> tuple[float, float, float] | None:
    """From node-a's Envoy log, one twin's first fetch: (request forwarded -> CDS answer received, answer received
    -> the twin starts warming (Envoy builds the cluster and its TLS contexts), warming start -> warm (the load
    assignment's wait)), in ms."""
    esc = re.escape(twin)
    fwd = re.search(_STAMP + rf".*forwarding the on-demand discovery request for cluster {esc} ", log, re.M)
    if not fwd:
        return None
    after = log[fwd.end() :]
    cds = re.search(
        _STAMP + r".*Received DeltaDiscoveryResponse for type.googleapis.com/envoy.config.cluster", after, re.M
    )
    start = re.search(_STAMP + rf".*add/update cluster {esc} starting warming", after, re.M)
    warm = re.search(_STAMP + rf".*warming cluster {esc} complete", after, re.M)
    if not (cds and start and warm):
        return None
    t0, t1, t2, t3 = (_t(x.group(1)) for x in (fwd, cds, start, warm))
    return (t1 - t0) * 1000, (t2 - t1) * 1000, (t3 - t2) * 1000


def print_timeline(log: str, settings: dict[str, str]) -> None:
    print("  node-a's Envoy, each first use (median ms): fetch answered | twin built | twin warm (load assignment)")
    for setting in ("on", "off"):
        rows = [r for t, s in settings.items() if s == setting and (r := timeline(log, t)) is not None]
        if rows:
            cols = [statistics.median(c) for c in zip(*rows, strict=True)]
            print(
                f"    announce {setting} ({len(rows)} twins): {cols[0]:.2f} | {cols[1]:.2f} | {cols[2]:.2f}  "
                f"(request forwarded -> warm: {sum(cols):.2f})"
            )


def restart_served(m: Mesh, node: MeshNodeProxy) -> None:
    """Restart the node's sidecar and wait until the new one's own first state is served and ACKed (the API's
    condition may still be the old one's): a fetch during its start-up translation would wait for it (up to ~0.2 s
    here), which is not what is measured."""
    log = node.workdir / "sidecar.log"

    def accepted() -> int:
        return log.read_text(errors="replace").count("Programmed=True") if log.exists() else 0

    before = accepted()
    restart_sidecar(m, node)
    wait_for(lambda: accepted() > before, 60, "the restarted sidecar's first state ACKed")


def p50(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.quic_pairs_latency", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", type=int, default=24)
    ap.add_argument("--block", type=int, default=4, help="sources per sidecar setting (announce on/off alternate)")
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--workdir", type=Path, help="keep the mesh's logs here (default: a temporary directory)")
    ap.add_argument(
        "--envoy-debug",
        nargs="?",
        const="all",
        metavar="LOGGERS",
        help="both Envoys log at debug level for a timeline: all loggers, or e.g. upstream,config (cheaper)",
    )
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="node-a's Envoy logs its upstream and config steps with microsecond times; print each first use's "
        "segments (fetch answered, twin built, twin warm) per announce setting (the logging slows Envoy a little)",
    )
    ap.add_argument(
        "--odcds-flag",
        choices=("default", "off"),
        default="default",
        help=f"off: both Envoys run with {ODCDS_FLAG}=false (the on-demand path before Envoy 1.38)",
    )
    args = ap.parse_args()
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with Mesh(workdir=args.workdir, namespace=NS, areas="udp,tcp-floor,eastwest", shared_ca=True) as m:
        if args.odcds_flag == "off":
            m.envoy_runtime = {ODCDS_FLAG: False}
        if args.timeline:
            m.envoy_args = ("--log-format", "[%Y-%m-%d %T.%f][%t][%l][%n] %v")
        a, b = m.add_node("node-a"), m.add_node("node-b")
        m.start_node_proxies()
        pods = {f"client-{i}": f"sa-{i}" for i in range(args.sources)}
        for pod, sa in pods.items():
            m.add_pod(a, pod, sa=sa)
        m.add_http_backend(b, "web-0", sa="web")
        m.add_http_service("web", ["web-0"])
        m.kube.wait_meshnode("node-a", lambda o: bool((o.get("status") or {}).get("quic", {}).get("destinations")))
        host = mesh_host(NS, "web")
        if args.odcds_flag == "off" and f'"{ODCDS_FLAG}"' not in a.admin("/runtime"):
            raise SystemExit(f"node-a's Envoy does not list {ODCDS_FLAG} in its runtime")

        def use(pod: str, label: str) -> tuple[float, list[float]]:
            netns, sa = m.pods[pod].netns_path, pods[pod]
            ms, status, body = curl(netns, host)
            if status != 200 or spiffe_id(NS, sa) not in body:
                raise SystemExit(f"{label}: {pod}: first request {status}: {body[:200]}")
            warm = []
            for _ in range(args.warm):
                wms, status, _ = curl(netns, host)
                if status != 200:
                    raise SystemExit(f"{label}: {pod}: warm request {status}")
                warm.append(wms)
            return ms, warm

        first: dict[str, list[float]] = {"on": [], "off": []}
        warm: list[float] = []
        fetch_ms: dict[str, list[float]] = {"on": [], "off": []}
        mem_before = mem_after = 0.0
        settings: dict[str, str] = {}  # twin -> the announce setting of its first use
        names = list(pods)
        for i in range(0, len(names), args.block):
            setting = "on" if (i // args.block) % 2 == 0 else "off"
            m.sidecar_args = ("--metrics", f"127.0.0.1:{METRICS_PORT}", "--announce", setting)
            restart_served(m, a)
            if args.envoy_debug:
                debug(a.running_envoy(), args.envoy_debug)
                debug(b.running_envoy(), args.envoy_debug)
            elif args.timeline:
                debug(a.running_envoy(), "upstream,config")
            if not mem_before:
                mem_before = a.stat("server.memory_allocated")
            for pod in names[i : i + args.block]:
                settings[f"quic:{NS}/web@{pods[pod]}"] = setting
                ms, ws = use(pod, f"first use, announce {setting}")
                first[setting].append(ms)
                warm += ws
            total, count = sidecar_fetches()
            if count:
                fetch_ms[setting].append(total / count)
        mem_after = a.stat("server.memory_allocated")
        log_text = a.running_envoy().log_path.read_text(errors="replace") if args.timeline else ""
        connect = a.admin("/stats?usedonly&filter=^cluster\\.quic_.*upstream_cx_connect_ms$")
        _, fetches = sidecar_fetches()
        restart_envoy(m, a)
        twins = [f"quic:{NS}/web@{sa}" for sa in pods.values()]

        def twins_back() -> bool:  # every twin in the new Envoy (persisted pairs) before its first request
            held = a.admin("/clusters")
            return all(f"{t}::" in held for t in twins)

        wait_for(twins_back, 30, "every twin in the new Envoy")
        hs_first: list[float] = []
        hs_warm: list[float] = []
        for pod in names:
            ms, ws = use(pod, "after the proxy restart")
            hs_first.append(ms)
            hs_warm += ws
        _, fetches_after = sidecar_fetches()
    if fetches_after != fetches:
        raise SystemExit(f"the proxy-restart arm fetched {fetches_after - fetches:.0f} twins: not handshake-only")
    on, w, h, w2 = p50(first["on"]), p50(warm), p50(hs_first), p50(hs_warm)
    off = p50(first["off"]) if first["off"] else float("nan")
    print(
        f"{args.sources} new pairs ({len(first['on'])} with the load assignment announced, {len(first['off'])} "
        f"without, alternating in blocks of {args.block}), {args.warm} warm requests each; curl in the pod netns; "
        f"{ODCDS_FLAG} {args.odcds_flag}"
    )
    print(f"  first use, announce on:        p50 {on:6.2f} ms (min {min(first['on']):.2f}, max {max(first['on']):.2f})")
    if first["off"]:
        print(
            f"  first use, announce off:       p50 {off:6.2f} ms (min {min(first['off']):.2f}, max {max(first['off']):.2f})"
        )
    print(f"  warm (twin and connection exist): p50 {w:6.2f} ms")
    print(
        f"  after node-a's Envoy restarted: first request p50 {h:6.2f} ms (twin present, new QUIC connection, no fetch), warm p50 {w2:6.2f} ms"
    )
    print(f"  added by the first use over warm: {on - w:.2f} ms p50 (announce on), {off - w:.2f} ms (off)")
    print(f"    the fetch (first use - first request after the restart): {on - h:.2f} ms (on), {off - h:.2f} ms (off)")
    print(f"    the new identity's QUIC connection (first request after the restart - warm after it): {h - w2:.2f} ms")
    for setting, xs in fetch_ms.items():
        if xs:
            print(
                f"  node-a's sidecar fetch hook, announce {setting}: mean {statistics.mean(xs):.2f} ms (per block: {', '.join(f'{x:.1f}' for x in xs)})"
            )
    p50s = [float(x) for x in re.findall(r"P50\(([\d.]+),", connect)]
    if p50s:
        print(
            f"  each twin's QUIC connect (Envoy upstream_cx_connect_ms P50, median over twins): {statistics.median(p50s):.1f} ms"
        )
    if args.timeline:
        print_timeline(log_text, settings)
    per_pair = (mem_after - mem_before) / args.sources / 1024
    print(
        f"  node-a Envoy memory: {mem_before / 1e6:.1f} -> {mem_after / 1e6:.1f} MB (server.memory_allocated): {per_pair:.0f} KiB per live pair"
    )


if __name__ == "__main__":
    main()
