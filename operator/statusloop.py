"""The shape of the operator's status loops (`policyctl.PolicyController`, `mcsctl.MulticlusterController`): an
event wakes the loop (`touch`); after `debounce` seconds one pass runs; with no event for `resync` seconds a pass
runs anyway; a failed pass (a bug, an API outage) is logged and the next event or resync tries again. A pass is
`one_pass` in a thread unless the loop overrides `a_pass`."""

from __future__ import annotations

import asyncio
import contextlib
import logging


class StatusLoop:
    def __init__(self, log: logging.Logger, what: str, debounce: float, resync: float) -> None:
        """`what` names the pass in the log line of a failure."""
        self.log, self.what = log, what
        self.debounce, self.resync = debounce, resync
        self.wake = asyncio.Event()
        self.passes = 0

    def touch(self) -> None:
        self.wake.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):  # no event for `resync` seconds: a pass anyway
                await asyncio.wait_for(self.wake.wait(), self.resync)
            await asyncio.sleep(self.debounce)
            self.wake.clear()
            try:
                await self.a_pass()
            except Exception:  # a bug or an API outage: logged, the next event or resync tries again
                self.log.exception("%s pass failed", self.what)
            self.passes += 1

    async def a_pass(self) -> None:
        await asyncio.to_thread(self.one_pass)

    def one_pass(self) -> None:
        raise NotImplementedError
