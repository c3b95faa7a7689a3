"""`aether operator [--kubeconfig F] [--trust-domain D] [--verbose]`: the kopf operator, cluster-wide."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import kopf

from aether.naming import DEFAULT_TRUST_DOMAIN

from .handlers import OperatorConfig, build_registry, quiet_kopf_loggers


async def run(config: OperatorConfig, stop: asyncio.Event | None = None, ready: asyncio.Event | None = None) -> None:
    """Run the operator until `stop` is set (in-process use: tests, the demo) or, without one, until SIGTERM/SIGINT.

    kopf installs its own SIGTERM/SIGINT handlers when it runs in the main thread; a flag of ours set by a second
    handler would never be set (kopf's replaces it) and kopf would then wait 5 s for the task waiting on it."""
    await kopf.operator(
        registry=build_registry(config),
        clusterwide=True,
        standalone=True,
        stop_flag=stop,
        ready_flag=ready,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="aether operator", description=__doc__)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    parser.add_argument("--trust-domain", default=DEFAULT_TRUST_DOMAIN)
    parser.add_argument("--debounce", type=float, default=0.1, help="seconds to coalesce bursts of changes")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        print(f"aether operator: kubeconfig {args.kubeconfig!r} does not exist", file=sys.stderr)
        return 2
    if not args.kubeconfig and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        print("aether operator: no --kubeconfig and not running in a cluster", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    quiet_kopf_loggers(args.verbose)
    config = OperatorConfig(kubeconfig=args.kubeconfig, trust_domain=args.trust_domain, debounce=args.debounce)

    asyncio.run(run(config))  # stops on SIGTERM/SIGINT (kopf's handlers)
    logging.getLogger("aether.operator").info("aether operator stopped")
    return 0
