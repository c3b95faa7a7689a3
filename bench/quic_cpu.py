"""Proxy CPU per request, east-west HTTP/3 (QUIC twins) vs HTTP/2 (the h2 cluster), both proxies, same run.

Harness: two node netns, each with its own real Envoy 1.40 (`--concurrency N`, default 1) served over delta ADS by
`aether.xds.ads.server`; pod client-0 on node A, pod web-0 on node B running a tiny HTTP/1.1 echo app; the capture
in client-0. The client (Python `http.client`, one keep-alive connection per client process) sends `--requests`
GETs to `http://web.default.<mesh-domain>:18080/` through node A's outbound listener; node A sends them on the
QUIC twin (h3) or, with QUIC off, the h2 cluster; node B's inbound terminates and forwards to the app.
CPU = utime + stime from /proc/<pid>/stat of both Envoy processes, before and after each batch.
Rounds alternate h2 and h3 (paired); the figure is the median of the per-round h3/h2 ratios.

`--variant LABEL=JSON` (repeatable) adds one more h3 batch per round with that change, so a knob is compared with
the default h3 in the same rounds (order rotated per round). JSON keys: `quic` (merged into the twins'
`http3ProtocolOptions.quicProtocolOptions`, e.g. `{"connectionOptions": "AKDU"}`: the twin sends these to the
destination), `h3` (merged into `http3ProtocolOptions`), `runtime` (`{"key": [variant_value, baseline_value]}`, set
on both Envoys over admin `/runtime_modify` before each h3 batch), `dest_buffer` (`true`/`"lua"` or `"fs"`: a
response-buffering filter before the router on node B's inbound QUIC listener), `dest_udp` (deep-merged into node B's
inbound QUIC `udpListenerConfig`, e.g. a GSO writer or `quicOptions`), `src_direct` (`true`: node A's route names the
twin itself instead of picking it with the MatcherClusterSpecifier; measures that h3-only step). A node-B change waits
for the listener's exact version and a drain. Every h3 batch gets a fresh twin (its
`connect_timeout` is nudged by 1 ms), so each starts on a new QUIC connection. Also reported: UDP datagrams and
TCP segments per request in node A's netns (the twin's and the h2 cluster's upstream packets, both directions).

    .venv/bin/python -m bench.quic_cpu [--requests 5000] [--rounds 5] [--concurrency 1] [--clients 1]
                                       [--no-gro] [--access-log] [--runtime KEY=VALUE] [--twin-h3 JSON]
                                       [--variant LABEL=JSON ...] [--attach 'TOOL ... {pid} ...']

Needs root (netns). Prints one line per batch and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aether.netns.contract import CaptureMode
from aether.netns.install import install_capture
from aether.testing.eastwest_lab import AdsHarness, client_result, http_in_netns, start_client, start_echo, start_envoy
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.envoy import Envoy
from aether.testing.netlab import Lab
from aether.testing.wait import wait_for
from aether.xds.identity.ca import BuiltinCA
from aether.xds.identity.sds import secrets
from aether.xds.resources import CLUSTER, LISTENER, TranslateOptions
from aether.xds.translate.eastwest.build import EastWestOptions, build
from aether.xds.translate.eastwest.outbound import HTTP_OPTIONS
from bench.quic_cpu_variants import (
    Variant,
    buffer_quic_responses,
    parse_variant,
    patch_quic_listeners,
    route_twins_directly,
)

TD, MD = "cluster.local", "mesh.example"
VIP = "10.96.0.20"
HOST = f"web.default.{MD}"
CLIENT_ID = f"spiffe://{TD}/ns/default/sa/client"
WEB_ID = f"spiffe://{TD}/ns/default/sa/web-sa"


def _cpu(nodes: list[Envoy]) -> float:
    return sum(n.cpu_seconds() for n in nodes)


def _packets(netns: str) -> tuple[int, int, int]:
    """(UDP datagrams out, UDP datagrams in, TCP segments in+out) of one netns, from its /proc/net/snmp."""
    text = subprocess.run(
        ["ip", "netns", "exec", netns, "cat", "/proc/net/snmp"], capture_output=True, text=True, check=True
    ).stdout
    rows: dict[str, dict[str, int]] = {}
    lines = [ln.split() for ln in text.splitlines()]
    for head, vals in zip(lines[::2], lines[1::2], strict=False):
        rows[head[0]] = {k: int(v) for k, v in zip(head[1:], vals[1:], strict=False) if v.lstrip("-").isdigit()}
    udp, tcp = rows.get("Udp:", {}), rows.get("Tcp:", {})
    return udp.get("OutDatagrams", 0), udp.get("InDatagrams", 0), tcp.get("InSegs", 0) + tcp.get("OutSegs", 0)


def attach(template: str, nodes: list[Envoy], label: str, batch: int) -> list[subprocess.Popen[bytes]]:
    """`--attach`: one profiler process per Envoy (started 1 s before the batch, so attaching is not measured
    as part of it; the CPU figures of a profiled batch include the profiler's overhead in the Envoys)."""
    if not template:
        return []
    tools = [
        subprocess.Popen(
            shlex.split(template.format(pid=n.proc.pid, node=n.node_id, label=label, batch=batch)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for n in nodes
    ]
    time.sleep(1.0)  # no signal says a profiler has attached: a fixed head start, outside the measured batch
    return tools


def detach(tools: list[subprocess.Popen[bytes]]) -> None:
    for t in tools:
        t.send_signal(signal.SIGINT)
    for t in tools:
        t.wait(60)


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
    ap.add_argument(
        "--app-one-write",
        action="store_true",
        help="the echo app writes status line, headers and body in one send (default: headers, then body)",
    )
    ap.add_argument(
        "--variant", action="append", default=[], type=parse_variant, help="LABEL=JSON: an extra h3 batch per round"
    )
    ap.add_argument(
        "--attach",
        default="",
        help="a profiler per Envoy per batch, SIGINT after it: a template with {pid} {node} {label} {batch}, e.g. "
        "'strace -c -f -p {pid} -o /tmp/p/{batch}-{label}-{node}.txt' or 'perf record -g -p {pid} -o ...'",
    )
    args = ap.parse_args(argv)
    variants: list[Variant] = args.variant
    base = Variant("h3", {}, {}, {})
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
            start_echo(lab, web, (8080,), work / "hits.log", one_write=args.app_one_write)
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

            b_state = [("", "")]

            def set_b(buffer: str, udp: str = "") -> None:
                res_b = build(node_b, rec_b, opts, ew(True, "b"))
                res_b = buffer_quic_responses(res_b, buffer) if buffer else res_b
                res_b = patch_quic_listeners(res_b, udp) if udp else res_b
                ads.set("node-b", res_b, secrets(ca, [WEB_ID]))
                if (buffer, udp) != b_state[0]:
                    b_state[0] = (buffer, udp)
                    snap = ads.cache.get("node-b")
                    assert snap is not None
                    versions = {n: v for n, v in snap.versions[LISTENER].items() if n.startswith("inbound-h3:")}
                    wait_for(
                        lambda: all(
                            f'"version_info": "{v}"' in b.active_config("dynamic_listeners") for v in versions.values()
                        ),
                        60,
                        "node-b listener update",
                    )
                    b.wait_drained()  # the old listener drains (--drain-time-s 2) before the batch

            set_b("")

            runtime_keys = {k: v[1] for var in variants for k, v in var.runtime.items()}
            fresh = iter(range(1, 1_000_000))

            def use(quic: bool, var: Variant = base) -> None:
                set_b(var.dest_buffer, var.dest_udp)
                res = build(node_a, rec_a, opts, ew(quic, "a"))
                res = route_twins_directly(res) if var.src_direct else res
                nudge = next(fresh)
                for name, cluster in res[CLUSTER].items():
                    if name.startswith("quic:"):
                        http = cluster["typedExtensionProtocolOptions"][HTTP_OPTIONS]["explicitHttpConfig"]
                        http["http3ProtocolOptions"].update(twin_h3)
                        http["http3ProtocolOptions"].update(var.h3)
                        if var.quic:
                            http["http3ProtocolOptions"].setdefault("quicProtocolOptions", {}).update(var.quic)
                        # a new cluster (and so a new QUIC connection) for every h3 batch
                        cluster["connectTimeout"] = f"{ew(quic, 'a').connect_timeout_s + nudge / 1000:.3f}s"
                for key, baseline in runtime_keys.items():
                    value = var.runtime[key][0] if key in var.runtime else baseline
                    for node in (a, b):
                        node.admin(f"/runtime_modify?{key}={value}", method="POST")
                ads.set("node-a", res, secrets(ca, [CLIENT_ID]))
                if quic:
                    want_timeout = f"{ew(quic, 'a').connect_timeout_s + nudge / 1000:.3f}s"
                    wait_for(
                        lambda: want_timeout in a.active_config("dynamic_active_clusters"),
                        60,
                        f"twin for {var.label} active",
                        interval=0.1,
                    )
                # h2 answers carry `By=` in XFCC (the destination's URI on TCP); HTTP/3 ones do not
                want_by = not quic

                def ready() -> bool:
                    out = http_in_netns(client.netns, HOST, ip=VIP)
                    return out[0][0] == 200 and ("By=" in out[0][1]) == want_by

                wait_for(ready, 60, f"{'h3' if quic else 'h2'} in effect", interval=0.3)

            a.wait_live()
            b.wait_live()
            per_client = args.requests // args.clients

            side: dict[str, list[tuple[float, float]]] = {}
            pkts: dict[str, list[tuple[float, float, float]]] = {}

            def batch(quic: bool, var: Variant = base) -> float:
                label = var.label if quic else "h2"
                use(quic, var)
                http_in_netns(client.netns, HOST, n=200, ip=VIP)  # warm the pools
                p0 = _packets(na.netns)
                before = _cpu([a, b])
                a0 = a.cpu_seconds()
                t0 = time.monotonic()
                tools = attach(args.attach, [a, b], label, len(side.get(label, [])) + 1)
                procs = [start_client(lab, client.netns, HOST, n=per_client, ip=VIP) for _ in range(args.clients)]
                results = [r for p in procs for r in client_result(p, timeout=600)]
                detach(tools)
                wall = time.monotonic() - t0
                cpu = _cpu([a, b]) - before
                cpu_a = a.cpu_seconds() - a0
                p1 = _packets(na.netns)
                ok = sum(1 for s, _ in results if s == 200)
                if ok != len(results):
                    raise RuntimeError(f"{len(results) - ok} of {len(results)} requests failed")
                ms = cpu / len(results) * 1000
                ms_a = cpu_a / len(results) * 1000
                side.setdefault(label, []).append((ms_a, ms - ms_a))
                n = len(results)
                pkts.setdefault(label, []).append(tuple((x1 - x0) / n for x0, x1 in zip(p0, p1, strict=True)))  # type: ignore[arg-type]
                print(
                    f"{label}: {n} requests, {wall:.2f}s wall, "
                    f"{cpu:.2f}s CPU both proxies, {ms:.3f} ms/request (source {ms_a:.3f}, destination {ms - ms_a:.3f}),"
                    f" node-a UDP out {pkts[label][-1][0]:.2f} in {pkts[label][-1][1]:.2f}, TCP {pkts[label][-1][2]:.2f}"
                    " packets/request",
                    flush=True,
                )
                return ms

            ratios, h2s, h3s = [], [], []
            var_ratios: dict[str, list[float]] = {v.label: [] for v in variants}
            var_vs_h3: dict[str, list[float]] = {v.label: [] for v in variants}
            arms: list[tuple[bool, Variant]] = [(False, base), (True, base)] + [(True, v) for v in variants]
            for i in range(args.rounds):
                # rotate the order each round so no arm always runs first (or right after h2)
                order = arms[i % len(arms) :] + arms[: i % len(arms)]
                if len(arms) == 2 and i % 2:
                    order = arms[::-1]
                got = {(q, v.label if q else "h2"): batch(q, v) for q, v in order}
                h2 = got[(False, "h2")]
                h3 = got[(True, "h3")]
                h2s.append(h2)
                h3s.append(h3)
                ratios.append(h3 / h2)
                line = f"round {i + 1}: h3/h2 = {ratios[-1]:.2f}"
                for v in variants:
                    var_ratios[v.label].append(got[(True, v.label)] / h2)
                    var_vs_h3[v.label].append(got[(True, v.label)] / h3)
                    line += f", {v.label}/h2 = {var_ratios[v.label][-1]:.2f}"
                print(line, flush=True)
            summary: dict[str, Any] = {
                "requests_per_batch": per_client * args.clients,
                "rounds": args.rounds,
                "concurrency": args.concurrency,
                "clients": args.clients,
                "prefer_gro": not args.no_gro,
                "access_log": args.access_log,
                "runtime": args.runtime,
                "twin_h3": twin_h3,
                "app_one_write": args.app_one_write,
                "h2_ms_per_request_median": round(statistics.median(h2s), 4),
                "h3_ms_per_request_median": round(statistics.median(h3s), 4),
                "h3_over_h2_median": round(statistics.median(ratios), 3),
                "source_proxy_ms_median": {k: round(statistics.median(x for x, _ in v), 4) for k, v in side.items()},
                "destination_proxy_ms_median": {
                    k: round(statistics.median(y for _, y in v), 4) for k, v in side.items()
                },
                "h3_over_h2_range": [round(min(ratios), 3), round(max(ratios), 3)],
                "packets_per_request_median": {
                    k: {
                        "udp_out": round(statistics.median(x[0] for x in v), 2),
                        "udp_in": round(statistics.median(x[1] for x in v), 2),
                        "tcp": round(statistics.median(x[2] for x in v), 2),
                    }
                    for k, v in pkts.items()
                },
                "variants": {
                    v.label: {
                        "spec": {
                            "quic": v.quic,
                            "h3": v.h3,
                            "runtime": v.runtime,
                            "dest_buffer": v.dest_buffer,
                            "dest_udp": v.dest_udp,
                            "src_direct": v.src_direct,
                        },
                        "ms_per_request_median": round(statistics.median(x + y for x, y in side[v.label]), 4),
                        "over_h2_median": round(statistics.median(var_ratios[v.label]), 3),
                        "over_h2_range": [round(min(var_ratios[v.label]), 3), round(max(var_ratios[v.label]), 3)],
                        "over_default_h3_median": round(statistics.median(var_vs_h3[v.label]), 3),
                        "over_default_h3_range": [
                            round(min(var_vs_h3[v.label]), 3),
                            round(max(var_vs_h3[v.label]), 3),
                        ],
                    }
                    for v in variants
                },
            }
            print(json.dumps(summary))
        finally:
            ads.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
