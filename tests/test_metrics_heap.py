"""aether.metrics.HeapCollector: the heap in use it exports follows what the process allocates and frees (the soak's
leak gate reads it for the sidecar and the operator, whose RSS keeps freed pages)."""

from __future__ import annotations

import gc

from prometheus_client import generate_latest

from aether.metrics import REGISTRY
from aether.testing.promtext import named, parse


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
