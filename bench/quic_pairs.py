"""QUIC pairs in the sidecar: cluster counts with on-demand twins vs the old up-front fan-out, snapshot size and the
time of one on-demand admission (machine step + translation + snapshot) as pairs grow to 1,000 on one node, and the
sidecar's memory per pair. No Envoy: the first-use latency with real Envoys is `bench.quic_pairs_latency`.

    .venv/bin/python -m bench.quic_pairs [--repeat N]

Each admission is timed through `Sidecar.on_demand`, the code the ADS server runs before it answers a fetch (the
certificate source is the built-in CA; gates and the codec run as in the sidecar).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc

from aether.api.meshnode import Condition, MeshNode
from aether.api.naming import quic_twin
from aether.netns.records import PodRecord
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.xds.ads.cache import SnapshotCache
from aether.xds.resources import CLUSTER, ENDPOINT, TranslateOptions
from aether.xds.sidecar.loop import Sidecar
from aether.xds.sidecar.secrets import SecretKeeper, make_source

NODE = "node-a"
OPTS = TranslateOptions(areas=("eastwest",))


def fleet(sas: int, dests: int, dialled: bool) -> tuple[MeshNode, dict[str, PodRecord], list[str]]:
    """`sas` local ServiceAccounts (one pod each) x `dests` destinations; the twin names of every pair."""
    pods = [
        SamplePod(f"u{i}", f"pod-{i}", f"10.200.{1 + i // 200}.{2 + i % 200}", f"sa-{i}", f"/run/netns/p{i}")
        for i in range(sas)
    ]
    ds = [
        SampleDestination(
            f"default/svc-{j}",
            f"svc-{j}",
            (8080,),
            (f"10.201.{j // 200}.{2 + j % 200}",),
            f"10.96.{j // 200}.{10 + j % 200}",
        )
        for j in range(dests)
    ]
    node, records = sample_node(NODE, pods, ds, dialled=dialled)
    twins = [quic_twin("default", f"svc-{j}", f"sa-{i}") for j in range(dests) for i in range(sas)]
    return node, records, twins


class _Sink:
    def publish(self, node_name: str, conditions: list[Condition]) -> None:
        pass

    def publish_pairs(self, node_name: str, pairs: list[object], dormant: list[object]) -> None:
        pass


def sidecar(node: MeshNode, records: dict[str, PodRecord]) -> Sidecar:
    sc = Sidecar(
        NODE,
        SnapshotCache(),
        _Sink(),
        options=OPTS,
        path_exists=lambda _: True,
        secrets=SecretKeeper(make_source(None, OPTS)),
    )
    sc.on_records(records)
    sc.on_state(node)
    return sc


def counts(sc: Sidecar) -> tuple[int, int, int]:
    snap = sc.cache.get(NODE)
    assert snap is not None
    clusters = snap.versions.get(CLUSTER, {})
    twins = sum(1 for n in clusters if n.startswith("quic:"))
    size = sum(len(b) for t in (CLUSTER, ENDPOINT) for b in snap.encoded.get(t, {}).values())
    return len(clusters), twins, size


def cluster_counts() -> None:
    print("cluster count, 50 local ServiceAccounts x 40 destinations, 10 pairs dialling:")
    node, records, twins = fleet(50, 40, dialled=True)
    up_front = sidecar(node, records)
    print(
        f"  up front (every pair a twin, the old fan-out): clusters {counts(up_front)[0]}, twins {counts(up_front)[1]}"
    )
    node, records, twins = fleet(50, 40, dialled=False)
    sc = sidecar(node, records)
    print(f"  on demand, before any request:                 clusters {counts(sc)[0]}, twins {counts(sc)[1]}")
    for t in twins[:: len(twins) // 10][:10]:
        sc.on_demand(NODE, CLUSTER, {t})
    print(f"  on demand, after 10 pairs dialled:             clusters {counts(sc)[0]}, twins {counts(sc)[1]}")


def growth(repeat: int) -> None:
    print("\none node, 50 local ServiceAccounts x 20 destinations; admitting pairs on demand up to 1,000:")
    print("  pairs  clusters  CDS+EDS bytes  one admission p50 (ms)  p90 (ms)")
    node, records, twins = fleet(50, 20, dialled=False)
    sc = sidecar(node, records)
    done = 0
    for target in (10, 100, 500, 1000):
        while done < target - repeat:
            sc.on_demand(NODE, CLUSTER, {twins[done]})
            done += 1
        times = []
        while done < target:  # the last `repeat` admissions up to `target` pairs are timed
            gc.collect()
            t0 = time.perf_counter()
            sc.on_demand(NODE, CLUSTER, {twins[done]})
            times.append((time.perf_counter() - t0) * 1000)
            done += 1
        n, tw, size = counts(sc)
        p50 = statistics.median(times) if times else float("nan")
        p90 = statistics.quantiles(times, n=10)[-1] if len(times) >= 2 else p50
        print(f"  {tw:5d}  {n:8d}  {size:13,d}  {p50:22.2f}  {p90:8.2f}")


def memory() -> None:
    node, records, twins = fleet(50, 20, dialled=False)
    gc.collect()
    tracemalloc.start()
    sc = sidecar(node, records)
    gc.collect()
    base = tracemalloc.get_traced_memory()[0]
    for t in twins:
        sc.on_demand(NODE, CLUSTER, {t})
    gc.collect()
    full = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    n = len(sc.pairs.published())
    print(
        f"\nsidecar memory (tracemalloc, live Python objects): {base / 1e6:.1f} MB at 0 pairs, "
        f"{full / 1e6:.1f} MB at {n} pairs: {(full - base) / n / 1024:.1f} KiB per pair "
        "(state, twin + load assignment dicts, encoded snapshot, previous snapshot kept for rollback)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.quic_pairs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=10, help="admissions timed at each size (default 10)")
    args = ap.parse_args()
    cluster_counts()
    growth(args.repeat)
    memory()


if __name__ == "__main__":
    main()
