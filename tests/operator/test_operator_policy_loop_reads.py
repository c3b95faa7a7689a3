"""The policy loop reads kopf's indexes on the event loop (where kopf changes them), never from the thread its
pass writes from: read from that thread, an index could change size mid-iteration (`RuntimeError: dictionary
changed size during iteration`, seen twice in churn runs)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aether.operator.policyctl import PolicyController


def test_a_pass_reads_every_index_on_the_event_loop_thread() -> None:
    readers: dict[str, int] = {}

    def reader(name: str) -> Any:
        def read() -> list[Any]:
            readers[name] = threading.get_ident()
            return []

        return read

    names = ("policies", "services", "slices", "pods", "meshnodes")
    policies, services, slices, pods, meshnodes = (reader(n) for n in names)
    ctl = PolicyController(None, policies, services, slices, pods, meshnodes, "cluster.local")
    loop_thread: list[int] = []

    async def one() -> None:
        loop_thread.append(threading.get_ident())
        await ctl.a_pass()

    asyncio.run(one())
    assert readers == dict.fromkeys(names, loop_thread[0])
