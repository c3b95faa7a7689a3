"""xDS translation + serialization: full builds at 1, 100, 1,000 and 10,000 UDP services, one change
incremental, bytes pushed per change; and the proto package comparison that chose xds-protos.

    .venv/bin/python -m bench.xds_translate [--edp DIR]

Targets (issue 3): 1,000 services full <= 100 ms; one changed service <= 5 ms. `--edp DIR` adds the
envoy-data-plane 2.2.0 comparison (a `pip install --target DIR envoy-data-plane==2.2.0`; kept out of the venv
because both packages install an `envoy` tree of different shapes).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable

from aether.api.meshnode import MeshNode
from aether.testing.samples import node_with, records_for, udp_arm
from aether.xds.ads.cache import Snapshot, make_snapshot
from aether.xds.codec import protojson as codec
from aether.xds.gates.core import run_gates
from aether.xds.resources import CLUSTER, TranslateOptions
from aether.xds.translate.compose import clear_memo, translate

L4 = TranslateOptions(areas=("udp", "tcp-floor"))
PODS = 2


def _ok(path: str) -> bool:
    return True


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def build(node: MeshNode, previous: Snapshot | None) -> Snapshot:
    """What the sidecar does per desired state: translate, gates, snapshot (version + encode)."""
    resources = translate(node, records_for(node), L4)
    failures = run_gates(node, resources, _ok)
    assert not failures, failures
    return make_snapshot(resources, previous)


def pushed_bytes(old: Snapshot, new: Snapshot) -> tuple[int, int, int]:
    """(resources sent, their bytes, names removed) for a stream holding `old` when `new` is served."""
    sent = size = removed = 0
    for type_url, versions in new.versions.items():
        held = old.versions.get(type_url, {})
        for name, ver in versions.items():
            if held.get(name) != ver:
                sent += 1
                size += len(new.encoded[type_url][name])
        removed += sum(1 for name in held if name not in versions)
    return sent, size, removed


def full(n: int, repeat: int) -> float:
    node = node_with(n, PODS)

    def cold() -> None:
        clear_memo()
        build(node, None)

    return _median_ms(cold, repeat)


def incremental(n: int, repeat: int) -> list[tuple[str, float, tuple[int, int, int]]]:
    out = []
    node = node_with(n, PODS)
    base = build(node, None)

    def endpoint_change(i: int) -> MeshNode:
        changed = node.model_copy(deep=True)
        changed.status.udp.services[n // 2].endpoints[0].port = 20000 + i
        return changed

    def add_service(i: int) -> MeshNode:
        changed = node.model_copy(deep=True)
        changed.status.udp.services.append(udp_arm(n + 1 + i))
        return changed

    def remove_service(i: int) -> MeshNode:
        changed = node.model_copy(deep=True)
        del changed.status.udp.services[i % n]
        return changed

    for label, make in (
        ("one endpoint changed", endpoint_change),
        ("one service added", add_service),
        ("one service removed", remove_service),
    ):
        inputs = [make(i) for i in range(repeat)]
        times = []
        snap = base
        for state in inputs:
            build(node, base)  # back to the base state (memo warm, as in a running sidecar)
            gc.collect()
            t0 = time.perf_counter()
            snap = build(state, base)
            times.append((time.perf_counter() - t0) * 1e3)
        out.append((label, statistics.median(times), pushed_bytes(base, snap)))
    return out


def codec_comparison(edp_dir: str | None, n: int = 100) -> list[str]:
    resources = translate(node_with(n, PODS), records_for(node_with(n, PODS)), L4)
    clusters = list(resources[CLUSTER].values())
    lines = [f"| codec, {len(clusters)} clusters (build + serialize) | ms |", "|---|---|"]
    lines.append(
        f"| xds-protos, aether fast filler | {_median_ms(lambda: [codec.encode(CLUSTER, c) for c in clusters], 5):.1f} |"
    )
    lines.append(
        f"| xds-protos, json_format.ParseDict | {_median_ms(lambda: [codec.encode(CLUSTER, c, fast=False) for c in clusters], 5):.1f} |"
    )
    if not edp_dir:
        lines.append("| envoy-data-plane 2.2.0 | not run (pass --edp DIR) |")
        return lines
    sys.path.append(edp_dir)
    t0 = time.perf_counter()
    # envoy-data-plane is not a dependency (only with --edp DIR): mypy cannot see it
    from envoy_data_plane.envoy.config.cluster.v3 import Cluster  # type: ignore[import-not-found]

    imported = (time.perf_counter() - t0) * 1e3
    ours = [codec.encode(CLUSTER, c) for c in clusters]
    theirs = [bytes(Cluster.from_dict(c)) for c in clusters]
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    ms = _median_ms(lambda: [bytes(Cluster.from_dict(c)) for c in clusters], 3)
    lines.append(f"| envoy-data-plane 2.2.0 (betterproto2 from_dict + bytes) | {ms:.1f} (import {imported:.0f} ms) |")
    lines.append(f"| identical bytes | {same}/{len(clusters)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.xds_translate")
    p.add_argument("--edp", help="directory holding envoy-data-plane 2.2.0 (pip install --target DIR)")
    p.add_argument("--quick", action="store_true", help="skip 10,000 services")
    args = p.parse_args(argv)
    build(node_with(1, 1), None)  # warm the descriptor pool
    sizes = [1, 100, 1000] + ([] if args.quick else [10_000])
    print(f"## full translation + gates + encode ({PODS} local pods; median, cold memo)\n")
    print("| services | ms |\n|---|---|")
    for n in sizes:
        print(f"| {n} | {full(n, 3 if n >= 10_000 else 7):.1f} |")
    print("\n## one change, incremental (median of 9; a running sidecar's warm memo)\n")
    print("| services | change | ms | resources sent | bytes sent | removed |\n|---|---|---|---|---|---|")
    for n in sizes:
        for label, ms, (sent, size, removed) in incremental(n, 9 if n < 10_000 else 3):
            print(f"| {n} | {label} | {ms:.2f} | {sent} | {size} | {removed} |")
    print()
    print("\n".join(codec_comparison(args.edp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
