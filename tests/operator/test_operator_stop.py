"""The operator's stop is bounded: an API call still in flight in a worker thread (the kubernetes client sets no
timeout, so one the API never answers blocks its thread for good) must not keep a stopped operator alive.
`run_until_stopped` is what `aether operator` runs its loop with; the test runs it in a child process, since a
thread blocked for good cannot be cleaned up in this one. No API is needed: the blocked call is a thread waiting on
an event nobody sets. A CI run once saw the operator still running 60 s after SIGTERM (tests/operator/
test_operator_metrics.py), with nothing logged after the signal: this bounds that and logs where each thread was."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

CHILD = textwrap.dedent(
    """
    import asyncio, logging, os, sys, threading
    from aether.operator import cli

    logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
    forever = threading.Event()

    def api_call_never_answered() -> None:
        forever.wait()

    async def main() -> None:
        asyncio.get_running_loop().run_in_executor(None, api_call_never_answered)
        await asyncio.sleep(0.1)  # the operator stops while the call is in flight

    mode = sys.argv[1]
    if mode == "bounded":
        clean = cli.run_until_stopped(main(), grace=float(sys.argv[2]))
        print("clean" if clean else "abandoned", flush=True)
        os._exit(0)
    asyncio.run(main())  # the negative control: what `aether operator` ran before
    """
)


def _child(*args: str, timeout: float) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return None


def test_a_call_in_flight_at_the_stop_is_abandoned_after_the_grace_and_named() -> None:
    began = time.monotonic()
    got = _child("bounded", "1.0", timeout=30)
    assert got is not None, "the bounded stop did not end within 30 s"
    assert got.returncode == 0 and "abandoned" in got.stdout, got
    assert "thread aether-worker_0 still busy 1s after the stop" in got.stderr, got.stderr
    assert "in api_call_never_answered" in got.stderr, got.stderr  # where the thread was (source lines: -c has none)
    assert time.monotonic() - began < 30


def test_without_the_bound_the_stop_never_ends() -> None:
    """Negative control: asyncio.run joins the executor, so the same call keeps the process alive."""
    assert _child("plain", timeout=5) is None


def test_a_stop_with_nothing_in_flight_is_clean() -> None:
    script = CHILD.replace("run_in_executor(None, api_call_never_answered)", "run_in_executor(None, forever.set)")
    got = subprocess.run([sys.executable, "-c", script, "bounded", "1.0"], capture_output=True, text=True, timeout=30)
    assert got.returncode == 0 and "clean" in got.stdout and "still busy" not in got.stderr, got
