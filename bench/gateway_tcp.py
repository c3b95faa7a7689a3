"""Request latency through the east-west gateway's TCP and QUIC passthroughs vs the same requests in-cluster, and
what the gateway costs the node that runs it, all in one run.

Harness: `aether.testing.quic_mesh` (two node netns, a real Envoy 1.40 each over delta ADS, client-0 on node A,
web-0 with the HTTP echo app on node B). Node B also plays the gateway (`aether.xds.translate.eastwest.gateway` on
10.199.0.2:18009, exporting default/web, TCP and UDP: the `aether_quic_sni` module built by cargo) in every arm, so
only node A's config changes. One Python keep-alive client
in client-0 sends `--requests` sequential GETs to `web.default.<mesh-domain>:18080` per batch (timed one by one with
perf_counter_ns, after `--warmup`). Arms, rotated per round:

- `h2-direct`: node A's h2 cluster to web-0's inbound 18008 (in-cluster, QUIC off);
- `h2-gateway`: the same cluster through the gateway (`EastWestOptions.remote_gateways`): node A -> 10.199.0.2:18009
  (tls_inspector + tcp_proxy) -> web-0:18008;
- `h3-direct`: client-0's QUIC twin to web-0 (in-cluster HTTP/3);
- `h3-gateway`: the same twin through the gateway's UDP 18009 (the module + udp_proxy) -> web-0's UDP 18008.

Per arm and round: p50 and p99 of the batch, node B's Envoy CPU per request (utime+stime over the batch: the gateway
and the destination's inbound share that Envoy, so the gateway's own cost is `h2-gateway` minus `h2-direct`, and
`h3-gateway` minus `h3-direct`). The summary gives medians over rounds.

    .venv/bin/python -m bench.gateway_tcp [--requests 2000] [--warmup 200] [--rounds 5]

Needs root (netns). Prints one line per batch and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.envoy_modules import build as build_modules
from aether.testing.quic_mesh import OPTS, WEB, Mesh, quic_mesh
from aether.testing.wait import wait_for
from aether.xds.identity.sds import secrets
from aether.xds.translate.eastwest import gateway
from bench.inbound_authz import timed

ARMS = ("h2-direct", "h2-gateway", "h3-direct", "h3-gateway")
GATEWAY_IP = "10.199.0.2"


def serve_b(mesh: Mesh) -> None:
    node, records = sample_node(
        "node-b",
        [SamplePod("u-web", "web-0", mesh.web.ip, "web-sa", mesh.web.path)],
        [SampleDestination("default/web", "web-sa", (8080,), (mesh.web.ip,))],
    )
    gw = gateway.area(node, records, replace(OPTS, east_west_gateway=GATEWAY_IP, east_west_gateway_quic=True))
    mesh.ads.set("node-b", mesh.resources_b(), gw, secrets(mesh.ca, [WEB]))


def hosts(mesh: Mesh, cluster: str) -> set[str]:
    return set(re.findall(rf"^{re.escape(cluster)}::([0-9.]+:[0-9]+)::", mesh.a.admin("/clusters"), re.M))


def serve_arm(mesh: Mesh, arm: str) -> None:
    through: dict[str, Any] = {"remote_gateways": {"default/web": (GATEWAY_IP,)}} if arm.endswith("-gateway") else {}
    mesh.serve_a(mesh.resources_a(quic=arm.startswith("h3"), **through))
    cluster = "quic:default/web@client" if arm.startswith("h3") else "h2:default/web"
    want = f"{GATEWAY_IP}:18009" if through else f"{mesh.web.ip}:18008"
    mesh.wait_synced(mesh.a)
    wait_for(lambda: hosts(mesh, cluster) == {want}, 30, f"node A's {cluster} on {want}")
    mesh.until_200(mesh.client)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.gateway_tcp", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    p50: dict[str, list[float]] = {a: [] for a in ARMS}
    p99: dict[str, list[float]] = {a: [] for a in ARMS}
    cpu: dict[str, list[float]] = {a: [] for a in ARMS}
    os.environ["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"] = str(build_modules())  # node B's Envoy loads the module
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp, quic_mesh(Path(tmp)) as mesh:
        serve_b(mesh)
        mesh.wait_synced(mesh.b)
        for r in range(args.rounds):
            for arm in ARMS[r % len(ARMS) :] + ARMS[: r % len(ARMS)]:
                serve_arm(mesh, arm)
                timed(mesh, args.warmup)
                forwarded = mesh.b.stat("tcp.east_west_gateway.downstream_cx_total")
                before = mesh.b.cpu_seconds()
                lat = timed(mesh, args.requests)
                cpu[arm].append((mesh.b.cpu_seconds() - before) * 1e6 / args.requests)
                q = statistics.quantiles(lat, n=100)
                p50[arm].append(statistics.median(lat))
                p99[arm].append(q[98])
                through = mesh.b.stat("tcp.east_west_gateway.downstream_cx_total") - forwarded
                print(
                    f"round {r} {arm:10s} p50 {p50[arm][-1]:8.1f} us  p99 {p99[arm][-1]:8.1f} us"
                    f"  node B cpu {cpu[arm][-1]:6.1f} us/req  new gateway connections {through}",
                    flush=True,
                )
    summary: dict[str, Any] = {"requests": args.requests, "rounds": args.rounds}
    for arm in ARMS:
        summary[arm] = {
            "p50_us_median": round(statistics.median(p50[arm]), 1),
            "p99_us_median": round(statistics.median(p99[arm]), 1),
            "node_b_cpu_us_per_req_median": round(statistics.median(cpu[arm]), 1),
        }
    for proto in ("h2", "h3"):
        gw, direct = f"{proto}-gateway", f"{proto}-direct"
        ratios = [g / d for g, d in zip(p50[gw], p50[direct], strict=True)]
        extra = [g - d for g, d in zip(cpu[gw], cpu[direct], strict=True)]
        summary[f"{proto}_gateway_p50_ratio_median"] = round(statistics.median(ratios), 3)
        summary[f"{proto}_gateway_cpu_us_per_req_median"] = round(statistics.median(extra), 1)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
