"""aether.metrics.HeapCollector: the heap in use it exports follows what the process allocates and frees (the soak's
leak gate reads it for the sidecar and the operator, whose RSS keeps freed pages)."""

from __future__ import annotations

import gc
import threading

import pytest
from prometheus_client import generate_latest

from aether.heap import FullCollections, release_free_pages, watch_full_collections
from aether.metrics import REGISTRY
from aether.testing.promtext import named, parse
from aether.testing.wait import wait_for


def _heap() -> tuple[float, float]:
    got = parse(generate_latest(REGISTRY).decode())
    malloc = sum(named(got, "aether_process_malloc_in_use_bytes").values())
    blocks = sum(named(got, "aether_process_python_allocated_blocks").values())
    return malloc, blocks


def test_the_heap_in_use_follows_allocations_and_frees() -> None:
    gc.collect()
    malloc0, blocks0 = _heap()
    big = [bytearray(1 << 20) for _ in range(16)]  # 16 MiB from C malloc (mmapped chunks)
    small = [(i, str(i)) for i in range(100_000)]  # 200,000+ small objects from CPython's allocator
    malloc1, blocks1 = _heap()
    assert malloc1 - malloc0 >= 15 * (1 << 20), (malloc0, malloc1)
    assert blocks1 - blocks0 >= 150_000, (blocks0, blocks1)
    del big, small
    gc.collect()
    malloc2, blocks2 = _heap()
    assert malloc2 - malloc0 < 2 * (1 << 20) and blocks2 - blocks0 < 20_000, (malloc0, malloc2, blocks0, blocks2)


def _after_full() -> tuple[float, float, float]:
    got = parse(generate_latest(REGISTRY).decode())
    return (
        sum(named(got, "aether_process_malloc_in_use_after_full_gc_bytes").values()),
        sum(named(got, "aether_process_python_allocated_blocks_after_full_gc").values()),
        sum(named(got, "aether_process_full_gc_total").values()),
    )


def test_after_a_full_collection_the_heap_figures_hold_what_is_reachable_not_cycles_waiting() -> None:
    """Dead objects in reference cycles stay in the heap of the moment until a full collection; the figures taken
    at the end of the last full collection do not count them, and the periodic collections free them (the soak's
    sidecars left ~2,000 such objects every 30 s: a heap of the moment rising for minutes between full passes)."""
    watch_full_collections()
    gc.disable()  # no automatic pass frees the cycles before the periodic one does
    try:
        gc.collect()
        malloc0, blocks0 = _heap()
        after0 = _after_full()
        assert after0[2] >= 1 and abs(after0[0] - malloc0) < 1 << 20, (after0, malloc0)
        for _ in range(20_000):  # cycles, each holding 1 KiB of C malloc: garbage the moment they are made
            cycle: list[object] = [bytearray(1024)]
            cycle.append(cycle)
        del cycle
        malloc1, blocks1 = _heap()
        assert malloc1 - malloc0 >= 15 << 20 and blocks1 - blocks0 >= 15_000, (malloc0, malloc1, blocks0, blocks1)
        assert _after_full()[:2] == after0[:2], "no full collection ran: the figures after the last must not move"
        collections = FullCollections(0.05).start()
        try:
            wait_for(lambda: _after_full()[2] > after0[2], 10.0, "a periodic full collection")
        finally:
            collections.stop()
        malloc2, blocks2, _ = _after_full()
        assert malloc2 - after0[0] < 2 << 20 and blocks2 - after0[1] < 5_000, (after0, malloc2, blocks2)
    finally:
        gc.enable()


def test_no_periodic_collection_when_the_period_is_zero() -> None:
    with FullCollections(0) as off:
        assert not any(t.name == "aether-full-gc" for t in threading.enumerate())
    assert off.last_seconds == 0.0
    with pytest.raises(ValueError, match="positive"):
        FullCollections(-1.0)


_PARKED = """
import json, random, threading, time
from aether.heap import malloc_in_use
def work(done):
    held = []
    for _ in range(20000):
        held.append(bytes(random.randint(1, 1000)))
        if len(held) > 50:
            held.pop(random.randrange(len(held)))
    held.clear()
    done.set()
    threading.Event().wait()
base = malloc_in_use()
for _ in range(4):
    done = threading.Event()
    threading.Thread(target=work, args=(done,), daemon=True).start()
    done.wait()
print(json.dumps((malloc_in_use() - base) // 1024))
"""


def _parked_kib(tunables: str | None) -> int:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    got = subprocess.run([sys.executable, "-c", _PARKED], env=env, capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    return int(json.loads(got.stdout))


def test_a_threads_own_malloc_cache_counts_as_in_use_unless_the_soak_turns_it_off() -> None:
    """Why bench.soak runs its processes with glibc's tcache off (bench.soak.MALLOC_ENV): four threads that did
    mixed-size work and then wait hold their freed chunks in their caches, which mallinfo2 counts as in use (some
    180 KiB a thread here), so the heap-in-use figure steps up when idle threads first work and stays there; with the
    cache off the same threads leave almost nothing."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    ask = (  # bench is a directory at the repository's root, not an installed package: asked from there
        "import json; from bench.soak import MALLOC_ENV, measured_malloc_env; print(json.dumps([MALLOC_ENV,"
        " measured_malloc_env({'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2:glibc.malloc.tcache_count=7'})]))"
    )
    root = Path(__file__).resolve().parents[1]
    got = subprocess.run([sys.executable, "-c", ask], cwd=root, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    malloc_env, merged = json.loads(got.stdout)
    cached, uncached = _parked_kib(None), _parked_kib(malloc_env["GLIBC_TUNABLES"])
    assert cached >= 4 * 100, cached
    assert uncached <= 100, uncached
    assert merged["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=0"


def test_with_periodic_collections_on_only_theirs_are_recorded() -> None:
    """A full pass the interpreter starts comes in the middle of work (allocations piling up are what start it), so
    its figure counts that work's temporaries: in the soak a sidecar's block count read some 10,000 over its level
    at such passes. While the periodic collections run, only theirs are recorded."""
    watch_full_collections()
    collections = FullCollections(3600.0).start()  # its first pass at once, then none during the test
    try:
        wait_for(lambda: collections.last_seconds > 0, 10.0, "the first periodic full collection")
        before = _after_full()
        burst = [(i, str(i)) for i in range(200_000)]  # work in flight when another full pass comes
        gc.collect()  # a full pass outside the collector's thread, as the interpreter's own would be
        assert _after_full() == before, "a full pass in the middle of work was recorded"
        del burst
    finally:
        collections.stop()
    gc.collect()  # periodic collections off: every full pass is recorded again
    assert _after_full()[2] == before[2] + 1


_FRAGMENTED = """
import json, time
from aether.heap import FullCollections
def rss() -> int:
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0])
keep, junk = [], []
for i in range(100_000):  # 60-140 MiB of mid-sized chunks (C malloc's, over CPython's 512-byte limit), one in 50 kept
    (keep if i % 50 == 0 else junk).append(bytes(600 + (i % 7) * 100))
del junk
before = rss()
collections = FullCollections(3600.0).start()  # its first pass (collection, then the trim) at once
while collections.last_seconds == 0.0:
    time.sleep(0.01)
print(json.dumps([before, rss()]))
"""


def test_a_periodic_collection_hands_c_mallocs_free_pages_back() -> None:
    """Chunks freed in the middle of glibc's heap stay in RSS (glibc trims only the heap's top), so a process kept
    its highest-ever footprint and its RSS crept up as the free space fragmented (the soak: every role's RSS grew
    while its heap in use did not). Each periodic collection ends with `release_free_pages`: here a heap with one
    chunk in 50 still in use gives most of its ~100 MiB back."""
    import json
    import subprocess
    import sys

    got = subprocess.run([sys.executable, "-c", _FRAGMENTED], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    before, after = json.loads(got.stdout)
    assert before - after >= 50 * 1024, (before, after)
    assert release_free_pages() is True
