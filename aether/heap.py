"""The process's heap in use, and full garbage collections on a period so that figure is the live heap.

CPython frees most objects when their last reference goes, but objects in reference cycles (an exception with its
traceback and frames, a closure holding itself, a gRPC call's or an HTTP connection's bookkeeping) wait for the
cyclic collector, and its full (generation 2) pass runs only once the objects that survived younger passes have
grown by a quarter of those already in the oldest generation. A process holding some 300,000 objects (the sidecar,
the operator) therefore carries tens of thousands of dead objects and the buffers they point to for minutes to hours
between full passes: its heap in use rises steadily, then drops. Measured in the soak (docs/performance.md): each
sidecar left about 2,000 objects in cycles every 30 s, some 60-130 KiB of C malloc with them; the operator 2,000-
4,000. A heap that rises for that reason cannot be told from a leak over half an hour.

So each long-running process runs a full collection every `every` seconds (`FullCollections`; 20-80 ms of CPU for
those processes, every 15 s by default), then hands C malloc's free pages back to the kernel
(`release_free_pages`), and records, at the end of each of its passes (of the interpreter's own
when the periodic ones are off), the heap in use right after it: what is still reachable. `aether.metrics` exports
both the figures of the moment and these (docs/operations.md#metrics).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("aether.heap")

# The default period of the processes' full collections (0: off, the interpreter's own only). Dead cycles wait for
# the next pass, and until then the allocator must find room for them beside the live heap: under the soak's churn
# the operator's passes freed 7,600-11,100 objects a minute (kopf's per-event bodies and patches, aiohttp's failed
# connections during an API outage), a sidecar's 3,900-8,300 (urllib3's), so a minute's worth raised the peak CPython
# and glibc had to map for, and each new peak maps memory that stays. 15 s holds a quarter of that, for 0.1-0.5 % of
# a core (a pass takes 19-43 ms in a sidecar, 44-80 ms in the operator)
FULL_GC_EVERY_S = 15.0


class _MallInfo2(ctypes.Structure):
    _fields_ = [  # glibc's struct mallinfo2 (2.33 on), every field a size_t
        (name, ctypes.c_size_t)
        for name in [
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        ]
    ]


_LIBC = ctypes.CDLL(None)
_MALLINFO2 = getattr(_LIBC, "mallinfo2", None)  # looked up once; None where the C library has none
if _MALLINFO2 is not None:
    _MALLINFO2.restype = _MallInfo2
_MALLOC_TRIM = getattr(_LIBC, "malloc_trim", None)
if _MALLOC_TRIM is not None:
    _MALLOC_TRIM.argtypes = [ctypes.c_size_t]
    _MALLOC_TRIM.restype = ctypes.c_int


def malloc_in_use() -> int | None:
    """Bytes C malloc has handed out and not had back (mallinfo2: `uordblks` + `hblkhd`, every arena and mmapped
    chunk: Python's large objects, gRPC, protobuf, OpenSSL); None without glibc's mallinfo2."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


def release_free_pages() -> bool:
    """Give the kernel back the whole free pages inside C malloc's heaps (glibc `malloc_trim(0)`: every arena, not
    only the top of the main one); whether any were released (False without glibc's malloc_trim).

    glibc returns memory by itself only from the top of its main heap: pages freed in the middle of a heap, or in a
    thread's arena, stay in the process's RSS until something is allocated there again. A process that frees
    what a burst of work allocated (an API watch's page of objects, a snapshot's serialised resources) therefore
    keeps its highest-ever footprint, and its RSS creeps up as the free space fragments. Trimming after each
    periodic full collection, right after the collector freed the dead cycles, returns those pages; pages still
    partly in use, and CPython's own arenas, stay (docs/limits.md)."""
    return _MALLOC_TRIM is not None and bool(_MALLOC_TRIM(0))


@dataclass
class AfterFull:
    """The heap in use at the end of the last full collection (None before the first)."""

    malloc_bytes: int | None = None
    python_blocks: int | None = None
    collections: int = 0  # full collections recorded: the periodic ones while they run, else the interpreter's


AFTER_FULL = AfterFull()
_WATCHING = threading.Lock()


COLLECTOR_THREAD = "aether-full-gc"
_OWN_ONLY = threading.Event()  # set while periodic full collections run: only theirs are recorded


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    # "stop" comes after the pass has freed what it found unreachable. The interpreter starts a full pass of its
    # own when allocations pile up, i.e. in the middle of a burst of work, so its figure counts that work's
    # temporaries as well (the soak saw a sidecar's block count 10,000 over its level at such passes); with
    # periodic collections on, only theirs are recorded, from their own thread
    if _OWN_ONLY.is_set() and threading.current_thread().name != COLLECTOR_THREAD:
        return
    if phase == "stop" and info.get("generation") == 2:
        AFTER_FULL.malloc_bytes = malloc_in_use()
        AFTER_FULL.python_blocks = sys.getallocatedblocks()
        AFTER_FULL.collections += 1


def watch_full_collections() -> None:
    """Record the heap after every full collection from now on (once per process; idempotent)."""
    with _WATCHING:
        if _on_collection not in gc.callbacks:
            gc.callbacks.append(_on_collection)


class FullCollections:
    """A daemon thread running `gc.collect()` and `release_free_pages()` when started and every `every` seconds after
    until `stop()` (none when `every` is 0); a context manager: started on entry, stopped on exit."""

    def __init__(self, every: float) -> None:
        if every < 0:
            raise ValueError(f"the period of full collections must be 0 (off) or positive, not {every}")
        self.every = every
        self.last_seconds = 0.0  # how long the last one took
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=COLLECTOR_THREAD, daemon=True)

    def start(self) -> FullCollections:
        watch_full_collections()
        if self.every > 0:
            _OWN_ONLY.set()
            self._thread.start()
        return self

    def _run(self) -> None:
        while True:  # the first pass at once, so the figures after one exist from the start
            began = time.perf_counter()
            found = gc.collect()
            released = release_free_pages()
            self.last_seconds = time.perf_counter() - began
            log.debug(
                "full collection: %d unreachable objects freed, free pages %sreleased, in %.0f ms",
                found,
                "" if released else "not ",
                self.last_seconds * 1000,
            )
            if self._stop.wait(self.every):
                return

    def stop(self) -> None:
        self._stop.set()
        _OWN_ONLY.clear()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> FullCollections:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def _period(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"{value!r}: must be 0 (off) or positive seconds")
    return seconds


def add_full_gc_argument(parser: argparse.ArgumentParser) -> None:
    """`--full-gc-every SECONDS` on a long-running process's command line (the sidecar's, the operator's)."""
    parser.add_argument(
        "--full-gc-every",
        type=_period,
        metavar="SECONDS",
        default=FULL_GC_EVERY_S,
        help="seconds between full garbage collections, so the heap's dead cycles are freed and the heap metrics "
        f"read the live heap (default {FULL_GC_EVERY_S:g}; 0: the interpreter's own only)",
    )
