"""`aether dev-api [--control-plane real|emulated] --kubeconfig OUT [--port P] [--audit FILE] [--no-crds]
[--channel standard|experimental]`: a local API server with a kubeconfig for kubectl, the operator and the sidecar.

`emulated` (the default until `make k8s` has built the real one) is the API test bed: kmock plus our emulator layer.
`real` is etcd, kube-apiserver and kube-controller-manager at the pinned version (aether.testing.controlplane),
with our CRDs and the upstream Gateway API CRDs installed; `--port` and `--audit` apply to the emulator only."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from aether.testing import controlplane
from aether.testing.apiserver import KINDS, Kind, api_server


def _default_kind() -> Kind:
    return "real" if controlplane.available() else "emulated"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="aether dev-api", description=__doc__)
    parser.add_argument("--control-plane", choices=KINDS, help="real or emulated (default: real when built)")
    parser.add_argument("--port", type=int, default=0, help="emulated: TCP port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--kubeconfig", required=True, help="where to write the kubeconfig")
    parser.add_argument("--audit", help="emulated: append every API call as JSON lines to this file")
    parser.add_argument("--no-crds", action="store_true", help="do not pre-install the MeshNode/Gateway API CRDs")
    parser.add_argument("--channel", choices=controlplane.CHANNELS, help="the Gateway API channel's UDPRoute CRD")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        print(f"aether dev-api: bad port {args.port}", file=sys.stderr)
        return 2
    kind: Kind = args.control_plane or _default_kind()
    if kind == "real" and (args.port or args.audit):
        print("aether dev-api: --port and --audit apply to --control-plane emulated only", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        with api_server(
            kind,
            kubeconfig=Path(args.kubeconfig),
            channel=args.channel,
            crds=not args.no_crds,
            port=args.port,
            audit=Path(args.audit) if args.audit else None,
        ) as server:
            where = server.control_plane.url if server.control_plane else server.bed.url if server.bed else "?"
            print(
                f"aether dev-api: {server.version} serving {where}; kubeconfig {server.kubeconfig}",
                flush=True,
            )
            done.wait()
    except (OSError, RuntimeError, controlplane.ControlPlaneMissing) as exc:
        print(f"aether dev-api: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0
