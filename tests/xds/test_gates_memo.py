"""The gates' walk memo keeps what the latest translation needs, not every listener it was ever shown.

Found by the soak (bench/soak.py): each sidecar's RSS grew 3-8 MiB a minute, traffic or not. The sidecar
reconciles every 5 s (its certificate poll), and the east-west builders return fresh listener dicts each time,
so `clusters_named_by`'s memo (keyed by object id, holding the object) kept every listener of every translation,
up to 8,192 of them (about 18 KiB each here) before it was cleared."""

from __future__ import annotations

import tracemalloc

from aether.testing.eastwest_sample import two_sources_one_destination
from aether.xds.gates import core
from aether.xds.resources import LISTENER, TranslateOptions
from aether.xds.sidecar.pipeline import gated_snapshot

ROUNDS = 60


def test_repeated_translations_of_one_state_keep_one_translations_walks() -> None:
    node, records = two_sources_one_destination()
    options = TranslateOptions()
    first = gated_snapshot(node, records, options, path_exists=lambda _: True)
    listeners = len(first.resources[LISTENER])
    tracemalloc.start()
    try:
        gated_snapshot(node, records, options, path_exists=lambda _: True)
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(ROUNDS):
            gated_snapshot(node, records, options, path_exists=lambda _: True)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(core._walked) <= listeners, f"{len(core._walked)} walks kept for {listeners} listeners"
    assert grown < 1 << 20, f"{grown // 1024} KiB kept after {ROUNDS} translations of the same state"
