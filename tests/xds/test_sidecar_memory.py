"""The sidecar holds what its live state needs, not every pair record churn ever made (issue 28).

Found with the soak's RSS slope (bench/soak.py: the sidecar grew 250-410 KiB/min) and reproduced here in-process:
the sidecar's reconcile driven over states that churn like the soak's (a pod roll every step, a new ServiceAccount
every few, the destinations' endpoints moving), each pair used on the way. The pairs' wire form was memoized by an
LRU of 16,384 entries keyed by the whole record, evidence time included, so every use of a pair added one
(QuicPair, PairEvidence and the machine's records with it) while only 9 pairs were ever live. The translation's
memos were LRUs of a fixed size too (capture listeners per pod, load assignments per endpoint set, the east-west
key converter per data key): each pod roll or endpoint move added entries until the cap."""

from __future__ import annotations

import gc
import logging
import tracemalloc

from aether.api.meshnode import MeshNode, QuicPair
from aether.api.naming import quic_twin
from aether.netns.records import PodRecord
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.samples import udp_arm
from aether.xds import translate
from aether.xds.ads import cache as ads_cache
from aether.xds.ads.cache import SnapshotCache
from aether.xds.resources import CLUSTER, TranslateOptions
from aether.xds.sidecar.loop import Sidecar

STEPS = 80


def churned(step: int) -> tuple[MeshNode, dict[str, PodRecord]]:
    """Step `step` of the churn: 6 live pods (the oldest replaced by a new one each step), 3 live ServiceAccounts
    (each replaced every 8 steps), 3 destinations whose endpoints move, 5 UDP Services whose endpoints move."""
    pods = []
    for k in range(6):
        gen = step - k
        sa = f"sa-{gen // 8}-{k % 3}"
        ip = f"10.200.{gen // 250 % 250}.{gen % 250 + 1}"
        pods.append(SamplePod(f"u-{gen}", f"pod-{gen}", ip, sa, f"/run/netns/memory-{gen}"))
    dests = [
        SampleDestination(
            f"default/web{d}",
            f"web-sa{d}",
            (8080,),
            tuple(f"10.201.{d}.{(step + e) % 250 + 1}" for e in range(3)),
            vip=f"10.96.1.{d + 1}",
        )
        for d in range(3)
    ]
    node, records = sample_node("node-a", pods, dests, dialled=False)
    node.status.udp.services = [udp_arm(i, endpoint_ip=f"10.202.{i}.{(step + i) % 250 + 1}") for i in range(5)]
    return node, records


def drive(sidecar: Sidecar, step: int) -> None:
    """What the sidecar sees in one step: the new pods' records and state, a fresh stream, every local source's
    first use of every destination (on-demand CDS), two rebuilds (its 5 s certificate poll) and the pair clock."""
    node, records = churned(step)
    sidecar.on_records(records)
    sidecar.on_state(node)
    sidecar.on_first_request("node-a", step, CLUSTER, frozenset(), frozenset())
    twins = {
        quic_twin(d.service.partition("/")[0], d.service.partition("/")[2], p.service_account, p.namespace)
        for p in node.status.pods
        for d in node.status.quic.destinations
    }
    sidecar.on_demand("node-a", CLUSTER, twins)
    for _ in range(2):
        sidecar.poll_secrets()
        sidecar.tick_pairs()


def live_quic_pairs() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is QuicPair)


def test_pair_records_held_are_bounded_by_the_live_pairs_not_by_churn() -> None:
    logging.disable(logging.WARNING)  # every refused twin logs a line
    try:
        cache = SnapshotCache()
        sidecar = Sidecar("node-a", cache, None, options=TranslateOptions(), path_exists=lambda _: True)
        for step in range(10):
            drive(sidecar, step)
        before = live_quic_pairs()
        for step in range(10, 10 + STEPS):
            drive(sidecar, step)
        after = live_quic_pairs()
    finally:
        logging.disable(logging.NOTSET)
    assert sidecar.pairs.state is not None
    live = len(sidecar.pairs.state.persist().pairs)
    assert live > 0, "the churn made no pairs: the test would prove nothing"
    # the served node carries the live pairs once per snapshot the cache keeps (current and fallback) and the memo
    # once more: a few times the live count, never one per use
    assert after <= 4 * live + 8, f"{after} QuicPair objects alive for {live} live pairs (was {before} before)"


def grown_while_churning(pattern: str, warm: int, trace_warmup: bool) -> int:
    """Bytes that files matching `pattern` hold more after STEPS // 2 churn steps than after `warm` of them
    (`trace_warmup`: tracemalloc from the first step, so what is live at the start is counted on both sides)."""
    logging.disable(logging.WARNING)
    sidecar = Sidecar("node-a", SnapshotCache(), None, options=TranslateOptions(), path_exists=lambda _: True)
    if trace_warmup:
        tracemalloc.start(1)
    try:
        for step in range(warm):
            drive(sidecar, step)
        gc.collect()
        if not trace_warmup:
            tracemalloc.start(1)
        before = tracemalloc.take_snapshot()
        for step in range(warm, warm + STEPS // 2):
            drive(sidecar, step)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
        logging.disable(logging.NOTSET)
    only = [tracemalloc.Filter(True, pattern)]
    return sum(s.size_diff for s in after.filter_traces(only).compare_to(before.filter_traces(only), "filename"))


def test_snapshot_versioning_keeps_nothing_per_resource_name() -> None:
    """The snapshot's per-type mix hashed each resource name through an LRU of 131,072 names, so every rolled pod's
    listener, cluster and route names stayed after the pod had gone: what `aether.xds.ads.cache` holds after the
    churn must not grow with it."""
    grown = grown_while_churning(ads_cache.__file__, 5, trace_warmup=False)
    # the current and fallback snapshots' own dicts (versions, encodings) change size a little between steps
    assert grown < 32 << 10, f"aether.xds.ads.cache kept {grown // 1024} KiB more after {STEPS // 2} churn steps"


def test_the_translation_keeps_what_the_last_one_served_not_what_churn_made() -> None:
    """What aether.xds.translate holds after 40 churn steps: about what it held after 10. Red with the LRUs of a fixed
    size (capture listeners, load assignments, the east-west key converter): 548 KiB more, 297 KiB of it in l4."""
    grown = grown_while_churning(f"{translate.__path__[0]}/*", 10, trace_warmup=True)
    assert grown < 32 << 10, f"aether.xds.translate kept {grown // 1024} KiB more after {STEPS // 2} churn steps"
