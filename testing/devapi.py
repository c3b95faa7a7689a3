"""`aether dev-api [--port P] --kubeconfig OUT [--audit FILE] [--no-crds]`: the API test bed as a local
server (kmock + our emulator layer), with a kubeconfig for kubectl, the operator and the sidecar."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from aether.testing.apitestbed import start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="aether dev-api", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--kubeconfig", required=True, help="where to write the kubeconfig")
    parser.add_argument("--audit", help="append every API call as JSON lines to this file")
    parser.add_argument("--no-crds", action="store_true", help="do not pre-install the MeshNode/Gateway API CRDs")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        print(f"aether dev-api: bad port {args.port}", file=sys.stderr)
        return 2
    try:
        bed = start(
            args.port,
            Path(args.kubeconfig),
            Path(args.audit) if args.audit else None,
            crds=not args.no_crds,
        )
    except (OSError, RuntimeError) as exc:
        print(f"aether dev-api: cannot start: {exc}", file=sys.stderr)
        return 1
    print(f"aether dev-api: serving {bed.url}; kubeconfig {bed.kubeconfig_path}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    bed.stop()
    return 0
