"""Keep the CPUs out of their idle states while a latency benchmark runs (`/dev/cpu_dma_latency`, the kernel's PM QoS
interface: a process that holds it open with a 32-bit 0 written asks for 0 us wake-up latency, so cpuidle uses
only its polling state; closing it, or the process exiting, lifts the request).

Why: on these virtual machines an idle vCPU halts (cpuidle driver and governor `haltpoll`), and waking it for each
datagram of a one-in-flight ping-pong is a VM exit: measured here, direct UDP ping-pong between two pod netns gave
11-14k replies/s on a quiet machine and 45k with the request held, and the spread of one path's ratio to another
across rounds went from 0.45-2.42 to 0.81-0.98 (kernel/direct, 1 in flight). The request applies alike to every
path a run compares.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator

PM_QOS_DEVICE = "/dev/cpu_dma_latency"


@contextlib.contextmanager
def cpu_latency(us: int | None) -> Iterator[bool]:
    """Hold a wake-up latency request of `us` microseconds for the block (None: none). Yields whether it is held
    (False where the device is absent or not writable: the run goes on, and says so)."""
    if us is None:
        yield False
        return
    try:
        fd = os.open(PM_QOS_DEVICE, os.O_WRONLY)
    except OSError:
        yield False
        return
    try:
        os.write(fd, struct.pack("i", us))
        yield True
    finally:
        os.close(fd)
