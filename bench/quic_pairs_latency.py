"""First request of a new QUIC pair (the twin fetched on demand) vs a warm request, through the whole mesh: the e2e
harness (API test bed, operator, two cluster-mode sidecars, real Envoys in netns), `--sources` client pods on
node-a, each with its own ServiceAccount, calling Service web on node-b.

    .venv/bin/python -m bench.quic_pairs_latency [--sources 12] [--warm 20]

Each pod makes its first request (its pair's first use: Envoy pauses it, fetches the twin, resumes it over
HTTP/3), then `--warm` more. Every request is timed inside the pod's netns (connect to the outbound listener,
GET, read the whole answer; one connection per request). Printed: p50 of first requests, p50 of warm ones, the
difference (the target: <= 5 ms added), and node-a's sidecar's own part (`aether_quic_pair_fetch_seconds`).
"""

from __future__ import annotations

import argparse
import http.client
import re
import statistics
import time
import urllib.request
from pathlib import Path

from aether.api.naming import mesh_host, spiffe_id
from aether.e2e.harness import Mesh
from aether.e2e.lifecycle import restart_sidecar
from aether.netns.contract import HTTP_OUTBOUND_PORT
from aether.netns.nsthread import run_in_netns

NS = "bench"
METRICS_PORT = 19392


def timed_get(netns: str, host: str) -> tuple[float, int, str]:
    def get() -> tuple[float, int, str]:
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", HTTP_OUTBOUND_PORT, timeout=10)
        try:
            conn.request("GET", "/", headers={"Host": host})
            resp = conn.getresponse()
            body = resp.read().decode(errors="replace")
            return (time.perf_counter() - t0) * 1000, resp.status, body
        finally:
            conn.close()

    return run_in_netns(netns, get)


def sidecar_fetch_ms() -> tuple[float, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5).read().decode()
    s = re.search(r"^aether_quic_pair_fetch_seconds_sum (\S+)$", text, re.M)
    c = re.search(r"^aether_quic_pair_fetch_seconds_count (\S+)$", text, re.M)
    return (float(s.group(1)) * 1000 if s else 0.0), (float(c.group(1)) if c else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.quic_pairs_latency", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", type=int, default=12)
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--workdir", type=Path, help="keep the mesh's logs here (default: a temporary directory)")
    ap.add_argument("--envoy-debug", action="store_true", help="node-a's Envoy logs at debug level (a timeline)")
    args = ap.parse_args()
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with Mesh(workdir=args.workdir, namespace=NS, areas="udp,tcp-floor,eastwest", shared_ca=True) as m:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        m.start_node_proxies()
        pods = {f"client-{i}": f"sa-{i}" for i in range(args.sources)}
        for pod, sa in pods.items():
            m.add_pod(a, pod, sa=sa)
        m.add_http_backend(b, "web-0", sa="web")
        m.add_http_service("web", ["web-0"])
        m.kube.wait_meshnode("node-a", lambda o: bool((o.get("status") or {}).get("quic", {}).get("destinations")))
        m.sidecar_args = ("--metrics", f"127.0.0.1:{METRICS_PORT}")
        restart_sidecar(m, a)
        m.programmed(a)
        m.programmed(b)
        host = mesh_host(NS, "web")
        first: list[float] = []
        warm: list[float] = []
        mem_before = a.stat("server.memory_allocated")
        if args.envoy_debug:
            a.running_envoy().admin("/logging?level=debug", "POST")
        for pod, sa in pods.items():
            netns = m.pods[pod].netns_path
            ms, status, body = timed_get(netns, host)
            if status != 200 or spiffe_id(NS, sa) not in body:
                raise SystemExit(f"{pod}: first request {status}: {body[:200]}")
            first.append(ms)
            for _ in range(args.warm):
                ms, status, body = timed_get(netns, host)
                if status != 200:
                    raise SystemExit(f"{pod}: warm request {status}")
                warm.append(ms)
        mem_after = a.stat("server.memory_allocated")
        total, count = sidecar_fetch_ms()
        connect = a.admin("/stats?usedonly&filter=^cluster\\.quic_.*upstream_cx_connect_ms$")
    p50f, p50w = statistics.median(first), statistics.median(warm)
    print(f"{args.sources} new pairs, {len(warm)} warm requests (one connection each), node-a --concurrency 1")
    print(f"  first request p50 {p50f:.2f} ms (min {min(first):.2f}, max {max(first):.2f})")
    print(f"  warm request  p50 {p50w:.2f} ms (min {min(warm):.2f}, max {max(warm):.2f})")
    print(f"  added by the first use: {p50f - p50w:.2f} ms p50 (ratio {p50f / p50w:.2f})")
    if count:
        print(f"  of which in node-a's sidecar (fetch hook, mean of {count:.0f}): {total / count:.2f} ms")
    per_pair = (mem_after - mem_before) / args.sources / 1024
    print(
        f"  node-a Envoy memory: {mem_before / 1e6:.1f} -> {mem_after / 1e6:.1f} MB (server.memory_allocated): "
        f"{per_pair:.0f} KiB per live pair (its twin, load assignment, QUIC connection, stats)"
    )
    p50s = [float(x) for x in re.findall(r"P50\(([\d.]+),", connect)]
    if p50s:
        print(
            f"  each twin's QUIC connection set-up (Envoy upstream_cx_connect_ms, median over twins): {statistics.median(p50s):.1f} ms"
        )


if __name__ == "__main__":
    main()
