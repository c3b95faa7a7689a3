"""Proxy CPU per request, east-west HTTP/3 (QUIC twins) vs HTTP/2 (the h2 cluster), both proxies, same run.

Harness: two node netns, each with its own real Envoy 1.40 (`--concurrency N`, default 1) served over delta ADS by
`aether.xds.server`; pod client-0 on node A, pod web-0 on node B running a tiny HTTP/1.1 echo app; the capture
in client-0. The client (Python `http.client`, one keep-alive connection per client process) sends `--requests`
GETs to `http://web.default.<mesh-domain>:18080/` through node A's outbound listener; node A sends them on the
QUIC twin (h3) or, with QUIC off, the h2 cluster; node B's inbound terminates and forwards to the app.
CPU = utime + stime from /proc/<pid>/stat of both Envoy processes, before and after each batch.
Rounds alternate h2 and h3 (paired); the figure is the median of the per-round h3/h2 ratios.

    .venv/bin/python -m bench.quic_cpu [--requests 5000] [--rounds 5] [--concurrency 1] [--clients 1]
                                       [--no-gro] [--access-log] [--runtime KEY=VALUE] [--twin-h3 JSON]

Needs root (netns). Prints one line per batch and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aether.e2e.netlab import Lab
from aether.netns.contract import CaptureMode
from aether.netns.install import install_capture
from aether.xds.certs_ca import BuiltinCA
from aether.xds.eastwest import EastWestOptions, build
from aether.xds.eastwest_lab import (
    AdsHarness,
    EnvoyNode,
    client_result,
    http_in_netns,
    start_client,
    start_echo,
    start_envoy,
    wait_until,
)
from aether.xds.eastwest_outbound import HTTP_OPTIONS
from aether.xds.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.xds.identity_sds import secrets
from aether.xds.resources import CLUSTER, TranslateOptions

TD, MD = "cluster.local", "mesh.example"
VIP = "10.96.0.20"
HOST = f"web.default.{MD}"
CLIENT_ID = f"spiffe://{TD}/ns/default/sa/client"
WEB_ID = f"spiffe://{TD}/ns/default/sa/web-sa"


def _cpu(nodes: list[EnvoyNode]) -> float:
    return sum(n.cpu_seconds() for n in nodes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.quic_cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=1, help="Envoy --concurrency (worker threads)")
    ap.add_argument("--clients", type=int, default=1, help="parallel keep-alive client connections")
    ap.add_argument("--no-gro", action="store_true", help="prefer_gro: false on the inbound QUIC listener")
    ap.add_argument("--access-log", action="store_true", help="file access logs on (off by default)")
    ap.add_argument(
        "--runtime", action="append", default=[], help="KEY=VALUE in both Envoys' static runtime layer (from start)"
    )
    ap.add_argument("--twin-h3", default="", help="JSON merged into the twins' http3ProtocolOptions")
    args = ap.parse_args(argv)
    twin_h3 = json.loads(args.twin_h3) if args.twin_h3 else {}

    opts = TranslateOptions(mesh_domain=MD, trust_domain=TD)
    with tempfile.TemporaryDirectory(prefix="quic-cpu-") as tmp, Lab() as lab:
        work = Path(tmp)
        ads = AdsHarness(work)
        try:
            na, nb = lab.add_node("ca"), lab.add_node("cb")
            client = lab.add_pod(na, "client-0", "10.200.1.2")
            web = lab.add_pod(nb, "web-0", "10.200.2.7")
            lab.link_nodes(na, nb, "10.199.0.1", "10.199.0.2")
            install_capture(client.path, CaptureMode.TPROXY)
            start_echo(lab, web, (8080,), work / "hits.log")
            ca = BuiltinCA(TD, MD)
            runtime: dict[str, object] = {}
            for kv in args.runtime:
                key, _, value = kv.partition("=")
                runtime[key] = {"true": True, "false": False}.get(value, value)
            a = start_envoy(lab, na.netns, "node-a", work, ads, concurrency=args.concurrency, runtime=runtime)
            b = start_envoy(lab, nb.netns, "node-b", work, ads, concurrency=args.concurrency, runtime=runtime)
            node_a, rec_a = sample_node(
                "node-a",
                [SamplePod("u-client", "client-0", client.ip, "client", client.path)],
                [SampleDestination("default/web", "web-sa", (8080,), (web.ip,), vip=VIP)],
            )
            node_b, rec_b = sample_node("node-b", [SamplePod("u-web", "web-0", web.ip, "web-sa", web.path)], [])

            def ew(quic: bool, node: str) -> EastWestOptions:
                log = str(work / f"access-{node}.log") if args.access_log else None
                return EastWestOptions(quic=quic, prefer_gro=not args.no_gro, access_log_path=log)

            ads.set("node-b", build(node_b, rec_b, opts, ew(True, "b")), secrets(ca, [WEB_ID]))

            def use(quic: bool) -> None:
                res = build(node_a, rec_a, opts, ew(quic, "a"))
                for name, cluster in res[CLUSTER].items():
                    if name.startswith("quic:") and twin_h3:
                        http = cluster["typedExtensionProtocolOptions"][HTTP_OPTIONS]["explicitHttpConfig"]
                        http["http3ProtocolOptions"].update(twin_h3)
                ads.set("node-a", res, secrets(ca, [CLIENT_ID]))
                # h2 answers carry `By=` in XFCC (the destination's URI on TCP); HTTP/3 ones do not
                want_by = not quic

                def ready() -> bool:
                    out = http_in_netns(client.netns, HOST, ip=VIP)
                    return out[0][0] == 200 and ("By=" in out[0][1]) == want_by

                wait_until(ready, 60, f"{'h3' if quic else 'h2'} in effect", interval=0.3)

            a.wait_ready()
            b.wait_ready()
            per_client = args.requests // args.clients

            side: dict[bool, list[tuple[float, float]]] = {False: [], True: []}

            def batch(quic: bool) -> float:
                use(quic)
                http_in_netns(client.netns, HOST, n=200, ip=VIP)  # warm the pools
                before = _cpu([a, b])
                a0 = a.cpu_seconds()
                t0 = time.monotonic()
                procs = [start_client(lab, client.netns, HOST, n=per_client, ip=VIP) for _ in range(args.clients)]
                results = [r for p in procs for r in client_result(p, timeout=600)]
                wall = time.monotonic() - t0
                cpu = _cpu([a, b]) - before
                cpu_a = a.cpu_seconds() - a0
                ok = sum(1 for s, _ in results if s == 200)
                if ok != len(results):
                    raise RuntimeError(f"{len(results) - ok} of {len(results)} requests failed")
                ms = cpu / len(results) * 1000
                ms_a = cpu_a / len(results) * 1000
                side[quic].append((ms_a, ms - ms_a))
                print(
                    f"{'h3' if quic else 'h2'}: {len(results)} requests, {wall:.2f}s wall, "
                    f"{cpu:.2f}s CPU both proxies, {ms:.3f} ms/request (source {ms_a:.3f}, destination {ms - ms_a:.3f})",
                    flush=True,
                )
                return ms

            ratios, h2s, h3s = [], [], []
            for i in range(args.rounds):
                order = (False, True) if i % 2 == 0 else (True, False)
                got = {q: batch(q) for q in order}
                h2s.append(got[False])
                h3s.append(got[True])
                ratios.append(got[True] / got[False])
                print(f"round {i + 1}: h3/h2 = {ratios[-1]:.2f}", flush=True)
            summary = {
                "requests_per_batch": per_client * args.clients,
                "rounds": args.rounds,
                "concurrency": args.concurrency,
                "clients": args.clients,
                "prefer_gro": not args.no_gro,
                "access_log": args.access_log,
                "runtime": args.runtime,
                "twin_h3": twin_h3,
                "h2_ms_per_request_median": round(statistics.median(h2s), 4),
                "h3_ms_per_request_median": round(statistics.median(h3s), 4),
                "h3_over_h2_median": round(statistics.median(ratios), 3),
                "source_proxy_ms_median": {
                    "h2": round(statistics.median(x for x, _ in side[False]), 4),
                    "h3": round(statistics.median(x for x, _ in side[True]), 4),
                },
                "destination_proxy_ms_median": {
                    "h2": round(statistics.median(y for _, y in side[False]), 4),
                    "h3": round(statistics.median(y for _, y in side[True]), 4),
                },
                "h3_over_h2_range": [round(min(ratios), 3), round(max(ratios), 3)],
            }
            print(json.dumps(summary))
        finally:
            ads.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
