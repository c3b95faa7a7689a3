"""Inbound latency added by authorization (the RBAC filter) and by the STRICT ruleset, as ratios to today's inbound,
all in one run.

Harness: `aether.testing.quic_mesh` (two node netns, a real Envoy 1.40 each over delta ADS, client-0 on node A,
web-0 with the HTTP echo app on node B). One Python keep-alive client in client-0 sends `--requests` sequential GETs
to `web.default.<mesh-domain>:18080` per batch (timed one by one with perf_counter_ns, after `--warmup`); node A
carries them on the client's QUIC twin (or, `--h2`, the h2 cluster) to web-0's inbound on node B. The arms, rotated
per round, change only node B's inbound and web-0's ruleset:

- `today`: the inbound as before authorization (no RBAC filter in its HCMs), web-0's ruleset PERMISSIVE (no drop);
- `rbac-filter`: the rule-less RBAC filter every inbound HCM now runs (no policy on web);
- `rbac-policy`: a MeshAuthorizationPolicy on web with 64 sources, client-0's last (the rules Envoy walks);
- `strict`: `today`'s Envoy config with web-0's ruleset STRICT;
- `both`: `rbac-policy` and STRICT (what a guarded pod gets).

Per arm and round: the p50 of the batch; the figure is the median over rounds of p50(arm) / p50(today) of the same
round, and the median added microseconds. On a shared machine batches are disturbed unevenly, so the summary also
gives the ratio of each arm's least disturbed batch (the minimum p50 over rounds), and node B's Envoy CPU per request
(utime+stime from /proc over the batch: what the destination proxy spends, less sensitive to scheduling noise). Node B's config change waits for its snapshot to be active and one batch
of warm-up requests.

    .venv/bin/python -m bench.inbound_authz [--requests 2000] [--warmup 200] [--rounds 5] [--h2]

Needs root (netns). Prints one line per batch and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from aether.netns.contract import InboundMode
from aether.testing.quic_mesh import CLIENT, HOST, TD, TWIN, VIP, Mesh, quic_mesh, wait_in_place, without_rbac
from aether.testing.wait import wait_for
from aether.xds.resources import LISTENER, ROUTE, Resources

ARMS = ("today", "rbac-filter", "rbac-policy", "strict", "both")

# N sequential GETs on one keep-alive connection; prints the per-request latencies (us) as JSON, or fails.
TIMED_CLIENT = r"""
import http.client, json, sys, time
ip, port, host, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
conn = http.client.HTTPConnection(ip, port, timeout=10)
out = []
for _ in range(n):
    t = time.perf_counter_ns()
    conn.request("GET", "/", headers={"Host": host})
    r = conn.getresponse()
    r.read()
    out.append((time.perf_counter_ns() - t) / 1000)
    if r.status != 200:
        sys.exit(f"status {r.status}")
print(json.dumps(out))
"""


def timed(mesh: Mesh, n: int) -> list[float]:
    out = subprocess.run(
        ["ip", "netns", "exec", mesh.client.netns, sys.executable, "-c", TIMED_CLIENT, VIP, "18080", HOST, str(n)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"client failed: {out.stderr.strip()}")
    latencies: list[float] = json.loads(out.stdout)
    return latencies


def policy() -> dict[str, Any]:
    sources = [f"spiffe://{TD}/ns/other{i}/sa/caller" for i in range(63)] + [CLIENT]
    return {
        "apiVersion": "mesh.aether.dev/v1alpha1",
        "kind": "MeshAuthorizationPolicy",
        "metadata": {"name": "web-callers", "namespace": "default"},
        "spec": {"targetRefs": [{"kind": "Service", "name": "web"}], "rules": [{"from": sources}]},
    }


def serve_arm(mesh: Mesh, arm: str, served: dict[str, Resources]) -> None:
    """Node B's inbound and web-0's ruleset for `arm`. A listener change (the RBAC filter in or out) is an in-place
    filter chain update in Envoy 1.40, after which config_dump keeps reporting the listener's previous version_info
    (seen here): wait for the update counter and the drain instead, then for the inbound routes' versions."""
    if arm in ("rbac-policy", "both"):
        res = mesh.resources_b([policy()])
    elif arm == "rbac-filter":
        res = mesh.resources_b([])
    else:
        res = without_rbac(mesh.resources_b([]))
    changed = "last" in served and served["last"][LISTENER] != res[LISTENER]
    updates = mesh.b.stat("listener_manager.listener_in_place_updated")
    mesh.serve_b(res=res)
    served["last"] = res
    if changed:
        wait_in_place(mesh.b, updates)
    snap = mesh.ads.cache.get("node-b")
    assert snap is not None
    want = {n: v for n, v in snap.versions.get(ROUTE, {}).items() if n.startswith("inbound:")}

    def routes_active() -> bool:
        dump = mesh.b.config_dump("dynamic_route_configs").get("configs", [])
        have = {c["route_config"]["name"]: c["version_info"] for c in dump if "route_config" in c}
        return all(have.get(n) == v for n, v in want.items())

    wait_for(routes_active, 30, f"node B's routes for {arm}")
    mesh.enforce(InboundMode.STRICT if arm in ("strict", "both") else InboundMode.PERMISSIVE)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.inbound_authz", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--h2", action="store_true", help="node A carries requests on the h2 cluster (QUIC off)")
    args = p.parse_args(argv)
    p50: dict[str, list[float]] = {a: [] for a in ARMS}
    cpu: dict[str, list[float]] = {a: [] for a in ARMS}
    with tempfile.TemporaryDirectory(prefix="bench-authz-") as tmp, quic_mesh(Path(tmp)) as mesh:
        if args.h2:
            mesh.serve_a(mesh.resources_a(quic=False))
            wait_for(lambda: TWIN not in mesh.a.admin("/clusters"), 30, "twins gone")
        mesh.until_200(mesh.client)
        served: dict[str, Resources] = {}
        serve_arm(mesh, "rbac-filter", served)  # node B knows web (the Service policies target) from here on
        for r in range(args.rounds):
            order = ARMS[r % len(ARMS) :] + ARMS[: r % len(ARMS)]
            for arm in order:
                serve_arm(mesh, arm, served)
                mesh.until_200(mesh.client)
                timed(mesh, args.warmup)
                before = mesh.b.cpu_seconds()
                lat = timed(mesh, args.requests)
                cpu[arm].append((mesh.b.cpu_seconds() - before) * 1e6 / args.requests)
                p50[arm].append(statistics.median(lat))
                q = statistics.quantiles(lat, n=100)
                print(
                    f"round {r} {arm:12s} p50 {p50[arm][-1]:8.1f} us  p90 {q[89]:8.1f} us  p99 {q[98]:8.1f} us"
                    f"  node B cpu {cpu[arm][-1]:6.1f} us/req",
                    flush=True,
                )
        counters = mesh.inbound_counters()
    summary: dict[str, Any] = {"requests": args.requests, "rounds": args.rounds, "protocol": "h2" if args.h2 else "h3"}
    for arm in ARMS:
        ratios = [a / b for a, b in zip(p50[arm], p50["today"], strict=True)]
        added = [a - b for a, b in zip(p50[arm], p50["today"], strict=True)]
        summary[arm] = {
            "p50_us_median": round(statistics.median(p50[arm]), 1),
            "ratio_to_today_median": round(statistics.median(ratios), 3),
            "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
            "added_us_median": round(statistics.median(added), 1),
            "p50_us_min": round(min(p50[arm]), 1),
            "ratio_of_min_p50": round(min(p50[arm]) / min(p50["today"]), 3),
            "node_b_cpu_us_per_req_median": round(statistics.median(cpu[arm]), 1),
            "node_b_cpu_ratio_median": round(
                statistics.median(a / b for a, b in zip(cpu[arm], cpu["today"], strict=True)), 3
            ),
        }
    summary["web0_inbound_counters_last_arm"] = counters
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
