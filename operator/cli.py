"""`aether operator [--kubeconfig F] [--trust-domain D] [--metrics HOST:PORT] [--liveness HOST:PORT]
[--full-gc-every SECONDS] [--verbose]`: the kopf operator, cluster-wide. `--metrics` serves Prometheus metrics at
/metrics, `--liveness` kopf's liveness endpoint at /healthz (both off by default); `--full-gc-every` runs a full
garbage collection on that period (aether.heap; default 60 s, 0: off)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
from kopf._core.reactor.inventory import ResourceMemories

from aether.api.addresses import AddressError, parse_hostport
from aether.api.naming import DEFAULT_TRUST_DOMAIN
from aether.heap import FullCollections, add_full_gc_argument
from aether.operator.handlers import OperatorConfig, build_registry, discover_route_version, quiet_kopf_loggers

log = logging.getLogger("aether.operator")

SHUTDOWN_GRACE_S = 15.0  # how long a stop waits for API calls still in flight in worker threads
WORKER_PREFIX = "aether-worker"  # the loop's executor threads (asyncio.to_thread: every API call)


def _url(host: str, port: int, path: str) -> str:
    return f"http://[{host}]:{port}{path}" if ":" in host else f"http://{host}:{port}{path}"


async def run(config: OperatorConfig, stop: asyncio.Event | None = None, ready: asyncio.Event | None = None) -> None:
    """Run the operator until `stop` is set (in-process use: tests, the demo) or, without one, until SIGTERM/SIGINT.

    kopf installs its own SIGTERM/SIGINT handlers when it runs in the main thread; a flag of ours set by a second
    handler would never be set (kopf's replaces it) and kopf would then wait 5 s for the task waiting on it."""
    server = None
    if config.metrics is not None:
        from aether.metrics import serve

        server = serve(*config.metrics)
        log.info("metrics at %s", _url(config.metrics[0], server.server_port, "/metrics"))
    liveness = _url(*config.liveness, "/healthz") if config.liveness is not None else None
    if liveness is not None:
        log.info("liveness at %s", liveness)
    collections = FullCollections(config.full_gc_every).start()  # here: a metrics port in use left it running
    try:
        route_version = await asyncio.to_thread(discover_route_version, config)
        memories = ResourceMemories()  # kopf's per-object memory, shared with the index sweep (resync.py)
        await kopf.operator(
            registry=build_registry(config, route_version, memories),
            memories=memories,
            clusterwide=True,
            standalone=True,
            stop_flag=stop,
            ready_flag=ready,
            liveness_endpoint=liveness,
        )
    finally:
        collections.stop()
        if server is not None:
            server.shutdown()
            server.server_close()


def run_until_stopped(main: Coroutine[Any, Any, None], grace: float = SHUTDOWN_GRACE_S) -> bool:
    """`asyncio.run(main)` with a bounded end: True when it ended clean, False when worker threads were still busy
    `grace` seconds after `main` returned (their stacks logged; the caller must then leave with os._exit).

    The operator's API calls run in the loop's default executor, and the kubernetes client sets no timeout, so one
    call the API never answers keeps its thread, and asyncio.run's last step (joining the executor: its
    shutdown_default_executor joins even when cancelled) and the interpreter's exit would wait for it forever: a
    SIGTERM that never ends the process. Here the executor is ours: a stop gives calls in flight `grace` seconds;
    what is cut short is written again by the next operator (level-based)."""
    loop = asyncio.new_event_loop()
    executor = ThreadPoolExecutor(thread_name_prefix=WORKER_PREFIX)
    loop.set_default_executor(executor)
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(main)
    finally:
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            executor.shutdown(wait=False)  # idle workers leave; busy ones finish their call first
            busy = _join_workers(time.monotonic() + grace)
            asyncio.set_event_loop(None)
            loop.close()
    if busy:
        _log_busy(busy, grace)
    return not busy


def _join_workers(deadline: float) -> list[threading.Thread]:
    """The executor's threads still running at `deadline`."""
    workers = [t for t in threading.enumerate() if t.name.startswith(WORKER_PREFIX)]
    for t in workers:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t for t in workers if t.is_alive()]


def _log_busy(busy: list[threading.Thread], grace: float) -> None:
    frames = sys._current_frames()
    for thread in busy:
        frame = frames.get(thread.ident or 0)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no frame)\n"
        log.warning(
            "stopping: thread %s still busy %gs after the stop, left behind; it was at:\n%s", thread.name, grace, stack
        )


def _hostport(value: str) -> tuple[str, int]:
    try:
        return parse_hostport(value)
    except AddressError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aether operator", description=__doc__)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    parser.add_argument("--trust-domain", default=DEFAULT_TRUST_DOMAIN)
    parser.add_argument("--debounce", type=float, default=0.1, help="seconds to coalesce bursts of changes")
    parser.add_argument(
        "--metrics", type=_hostport, metavar="HOST:PORT", help="serve Prometheus metrics at http://HOST:PORT/metrics"
    )
    parser.add_argument(
        "--liveness",
        type=_hostport,
        metavar="HOST:PORT",
        help="serve kopf's liveness probe at http://HOST:PORT/healthz",
    )
    parser.add_argument(
        "--stall-after",
        type=float,
        metavar="SECONDS",
        default=300.0,
        help="with --liveness: fail the probe when one reconcile pass runs longer than this (seconds, default 300)",
    )
    add_full_gc_argument(parser)
    parser.add_argument("--verbose", action="store_true")
    return parser


def main(argv: list[str]) -> int:
    args = make_parser().parse_args(argv)
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        print(f"aether operator: kubeconfig {args.kubeconfig!r} does not exist", file=sys.stderr)
        return 2
    if not args.kubeconfig and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        print("aether operator: no --kubeconfig and not running in a cluster", file=sys.stderr)
        return 2
    if args.stall_after <= 0:
        print("aether operator: --stall-after must be positive", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    quiet_kopf_loggers(args.verbose)
    config = OperatorConfig(
        kubeconfig=args.kubeconfig,
        trust_domain=args.trust_domain,
        debounce=args.debounce,
        metrics=args.metrics,
        liveness=args.liveness,
        stall_after=args.stall_after,
        full_gc_every=args.full_gc_every,
    )
    try:
        clean = run_until_stopped(run(config))  # stops on SIGTERM/SIGINT (kopf's handlers)
    except OSError as exc:
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        where = ", ".join(
            f"{flag} {a[0]}:{a[1]}" for flag, a in (("--metrics", args.metrics), ("--liveness", args.liveness)) if a
        )
        print(f"aether operator: cannot listen ({where}): {exc}", file=sys.stderr)
        return 1
    if not clean:  # the busy threads would hold the interpreter's exit: leave without joining them
        log.info("aether operator stopped (API calls still in flight were abandoned)")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    log.info("aether operator stopped")
    return 0
