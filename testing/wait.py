"""The one way test support waits for something: poll a predicate until it returns something truthy.

    arm = wait_for(lambda: cluster.arm("n1", "app/dns"), what="the operator's arm")
    wait_for(lambda: envoy.stat("control_plane.connected_state") == 1, timeout=60, what="the ADS stream")

On timeout it raises `TimeoutError` naming what it waited for and the predicate's last value (or the last exception
it was told to `ignore`), plus whatever `diagnose()` says (a log tail, say). Exceptions not in `ignore` propagate at
once: a predicate that finds the process it waits on dead should raise, not be polled until the timeout.

`AETHER_TEST_WAIT` (seconds, default 30) is the default timeout, so a slow machine can stretch every wait that does
not name its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = float(os.environ.get("AETHER_TEST_WAIT", "30"))


def wait_for(
    pred: Callable[[], T | None],
    timeout: float = DEFAULT_TIMEOUT,
    what: str = "condition",
    interval: float = 0.1,
    *,
    ignore: tuple[type[BaseException], ...] = (),
    diagnose: Callable[[], str] | None = None,
) -> T:
    """Call `pred` every `interval` seconds until it returns something truthy, and return that value.

    `ignore`: exception types that mean "not yet" (e.g. OSError while a socket is not up). `diagnose`: called once
    on timeout; its text is appended to the error."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = pred()
        except ignore as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    message = f"timed out after {timeout:g}s waiting for {what}; last value: {last!r}"
    if diagnose is not None:
        message += "\n" + diagnose()
    raise TimeoutError(message)
