"""`aether xds`: the node sidecar, `aether xds render` and `aether xds bootstrap`.

    aether xds --node N [--state FILE | --kubeconfig F] [--listen ADDR] [--allow-sds-over-tcp] [--records DIR]
               [--status-out FILE] [--metrics ADDR] [--quic-pair-fetch-window DURATION]
               [--announce on|off] [--udp-dataplane envoy|kernel] [--full-gc-every SECONDS]
    aether xds render --state FILE [--node N] [--records DIR]
    aether xds bootstrap --node N [--xds ADDR] [--admin ADDR]

ADDR is host:port or unix:PATH (default unix:/run/aether-xds/ads.sock, created 0600). The stream serves SDS, the
private keys of every local workload's SVID: on a TCP address any process that can connect (every hostNetwork pod
of the node, for 127.0.0.1) would get them, so the sidecar refuses one while it serves secrets (the east-west area)
unless `--allow-sds-over-tcp` says so, and then logs it as an error. FILE is a MeshNode, or a `kind: List` holding
the MeshNode and its MeshServiceSlices. Without --state the sidecar watches MeshNode N and the slices it names
in the cluster through `aether.xds.sidecar.kube_source` (imported only then).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aether.api.addresses import AddressError, parse_addr, parse_hostport
from aether.api.authz import KIND as POLICY_KIND
from aether.api.authz import compile_bodies
from aether.api.meshnode import MeshNodeFileError
from aether.api.slices import load_state_file
from aether.heap import FullCollections, add_full_gc_argument
from aether.netns.records import load_records, state_dir
from aether.xds.sidecar.arguments import duration, east_west_transport
from aether.xds.sidecar.arguments import east_west_gateway_argument as _east_west_gateway_argument
from aether.xds.sidecar.arguments import east_west_gateway_quic as _east_west_gateway_quic
from aether.xds.sidecar.arguments import east_west_quic_argument as _east_west_quic_argument
from aether.xds.sidecar.arguments import mesh_domain_argument as _mesh_domain_argument
from aether.xds.sidecar.arguments import udp_dataplane_argument as _udp_dataplane_argument
from aether.xds.sidecar.bootstrap import DEFAULT_XDS_ADDR, ads_bootstrap

if TYPE_CHECKING:
    import grpc

    from aether.xds.ads.cache import SnapshotCache
    from aether.xds.resources import TranslateOptions
    from aether.xds.sidecar.loop import Sidecar
    from aether.xds.sidecar.secrets import SecretKeeper
    from aether.xds.sidecar.sources import StateSource, StatusSink

log = logging.getLogger("aether.xds")
# the environment form of --dev-builtin-ca (the test session and the demo set it: their sidecars run as child processes)
DEV_CA_ENV = "AETHER_XDS_DEV_BUILTIN_CA"

SDS_OVER_TCP_REFUSED = (
    "aether xds: refusing to serve SDS secrets (every local workload's private key) on TCP {listen}: any process "
    "that can connect would get them. Listen on a unix socket (the default, unix:/run/aether-xds/ads.sock, is "
    "created 0600) or pass --allow-sds-over-tcp"
)
SDS_OVER_TCP_ALLOWED = (
    "--allow-sds-over-tcp: serving SDS secrets (workload private keys) on TCP %s: ANY process that can connect "
    "gets every local workload's private key"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _addr(value: str) -> str:
    try:
        parse_addr(value)
    except AddressError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return value


def _hostport(value: str) -> tuple[str, int]:
    try:
        return parse_hostport(value)
    except AddressError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _positive(kind: Callable[[str], float]) -> Callable[[str], Any]:
    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r}: not a number") from None
        if number <= 0:
            raise argparse.ArgumentTypeError(f"{value!r}: must be greater than 0")
        return number

    return parse


def _render(argv: list[str]) -> int:
    p = _Parser(prog="aether xds render", description="print the Envoy resources the sidecar would serve, as JSON")
    p.add_argument(
        "--state",
        required=True,
        help="MeshNode file (YAML or JSON), or a List of it, its MeshServiceSlices and MeshAuthorizationPolicies",
    )
    p.add_argument("--node", help="the MeshNode to render when the List holds several (kubectl get mn,mss -o yaml)")
    p.add_argument("--records", help=f"pod records directory (default ${'{'}AETHER_STATE_DIR{'}'} or {state_dir()})")
    _mesh_domain_argument(p)
    _east_west_quic_argument(p)
    _east_west_gateway_argument(p)
    args = p.parse_args(argv)
    from aether.xds.resources import TranslateOptions
    from aether.xds.sidecar.pipeline import gated_snapshot

    try:
        state = load_state_file(args.state, args.node)
    except MeshNodeFileError as exc:
        print(f"aether xds render: {exc}", file=sys.stderr)
        return 1
    node, others = state.effective(), state.others
    for problem in state.problems():
        print(f"aether xds render: incomplete state, the rest is rendered: {problem}", file=sys.stderr)
    td = TranslateOptions().trust_domain
    options = TranslateOptions(
        authorization=compile_bodies(others.get(POLICY_KIND, ()), td),
        mesh_domain=args.mesh_domain,
        east_west_gateway=args.east_west_gateway,
        east_west_gateway_quic=_east_west_gateway_quic(args.east_west_gateway_quic, os.environ),
        **east_west_transport(args),
    )
    for policy in options.authorization:
        if not policy.accepted:
            print(
                f"aether xds render: MeshAuthorizationPolicy {policy.ref} is not accepted: it allows nothing on "
                f"{', '.join(policy.services) or 'no Service'}",
                file=sys.stderr,
            )
    # what the sidecar does: one bad arm or listener is refused and the rest is served
    gated = gated_snapshot(node, load_records(args.records), options)
    json.dump(gated.resources, sys.stdout, indent=2, sort_keys=True)
    print()
    for failure in gated.refused:
        print(f"aether xds render: refused, the rest is served: {failure}", file=sys.stderr)
    for failure in gated.failures:
        print(f"aether xds render: gate refused the whole state: {failure}", file=sys.stderr)
    return 1 if gated.failures else 0


def _bootstrap(argv: list[str]) -> int:
    p = _Parser(prog="aether xds bootstrap", description="print the Envoy bootstrap pointing delta ADS at the sidecar")
    p.add_argument("--node", required=True)
    p.add_argument("--xds", type=_addr, default=DEFAULT_XDS_ADDR, help="host:port or unix:PATH")
    p.add_argument("--admin", type=_addr, default="127.0.0.1:19000", help="Envoy admin host:port")
    args = p.parse_args(argv)
    json.dump(ads_bootstrap(args.node, args.xds, args.admin), sys.stdout, indent=2)
    print()
    return 0


def _serve_parser() -> _Parser:
    p = _Parser(prog="aether xds", description="the node xDS sidecar (delta ADS for the node's Envoy)")
    p.add_argument("--node", required=True, help="node name: the MeshNode and Envoy's node id")
    p.add_argument(
        "--state",
        help="MeshNode file, or a List of it, its MeshServiceSlices and MeshAuthorizationPolicies (re-read on change); "
        "the cluster's MeshNode, slices and policies when absent",
    )
    p.add_argument("--kubeconfig", help="cluster mode (no --state): kubeconfig file (in-cluster config otherwise)")
    p.add_argument(
        "--listen", type=_addr, default=DEFAULT_XDS_ADDR, help=f"unix:PATH (default {DEFAULT_XDS_ADDR}) or host:port"
    )
    p.add_argument(
        "--allow-sds-over-tcp",
        action="store_true",
        help="serve SDS secrets (workload private keys) on a TCP --listen address: anyone who connects gets them",
    )
    p.add_argument("--records", help="pod records directory (default $AETHER_STATE_DIR or /run/aether/pods)")
    p.add_argument("--status-out", help="file mode: where the Programmed condition goes (default <state>.status.json)")
    p.add_argument("--metrics", type=_hostport, help="serve Prometheus metrics on host:port")
    p.add_argument(
        "--areas", default="", help="comma-separated translation areas (default all: udp,tcp-floor,eastwest)"
    )
    _udp_arguments(p)
    _eastwest_arguments(p)
    add_full_gc_argument(p)
    p.add_argument("--log-level", default="INFO")
    return p


def _udp_arguments(p: _Parser) -> None:
    p.add_argument(
        "--udp-gro", choices=["on", "off"], default="on", help="GRO on the UDP capture listeners' sockets (default on)"
    )
    p.add_argument(
        "--udp-upstream-gro", choices=["on", "off"], help="GRO on udp_proxy's upstream sockets (default: Envoy's)"
    )
    p.add_argument(
        "--udp-gso",
        choices=["on", "off"],
        default="off",
        help="GSO batch writer on the UDP capture listeners (default off: it drops every reply over 1,452 bytes)",
    )
    p.add_argument("--udp-idle-timeout", type=_positive(float), default=60.0, help="udp_proxy session idle timeout (s)")
    p.add_argument(
        "--udp-max-sessions",
        type=_positive(int),
        default=100_000,
        help="concurrent UDP flows (client address and port) per Service before new ones are refused "
        "(the udp clusters' max_connections; default 100000)",
    )
    p.add_argument(
        "--udp-preserve-source",
        action="store_true",
        help="UDP backends see the client pod's address instead of the node's; needs `aether node-return install` "
        "where Envoy runs",
    )
    _udp_dataplane_argument(p)


def _eastwest_arguments(p: _Parser) -> None:
    _mesh_domain_argument(p)
    _east_west_quic_argument(p)
    _east_west_gateway_argument(p)
    p.add_argument(
        "--certs-dir",
        help="east-west: a PEM directory per identity (docs/identity.md); required unless --dev-builtin-ca",
    )
    p.add_argument(
        "--dev-builtin-ca",
        action="store_true",
        default=os.environ.get(DEV_CA_ENV) == "1",
        help=f"development only: without --certs-dir, issue identities from a built-in CA that no other node shares "
        f"(tests and the demo; also {DEV_CA_ENV}=1)",
    )
    p.add_argument(
        "--quic-pair-fetch-window",
        type=duration,
        default="1h",
        help="a stored QUIC pair with no evidence of use (fetch, re-subscription, held) this long after the sidecar "
        "starts is pruned with its twin; never a dormant one (default 1h; docs/pairs.md)",
    )
    p.add_argument(
        "--announce",
        choices=("on", "off"),
        default="on",
        help="on: a fetched twin's load assignment goes out right after the twin, before Envoy subscribes to it "
        "(saves a round trip on a pair's first request); off: only when asked (default on; docs/pairs.md)",
    )


def _areas(p: _Parser, value: str) -> tuple[str, ...]:
    """--areas as a tuple (empty: all of them); an unknown area is a usage error."""
    from aether.xds.translate.compose import AREAS

    areas = tuple(a for a in value.split(",") if a)
    if set(areas) - set(AREAS):
        p.error(f"--areas: unknown {sorted(set(areas) - set(AREAS))}; known: {','.join(AREAS)}")
    return areas


def _sds_listen_refused(args: argparse.Namespace, serves_secrets: bool) -> bool:
    """True (after saying why) when SDS would go out on a TCP address without --allow-sds-over-tcp."""
    if serves_secrets and not isinstance(parse_addr(args.listen), str):
        if not args.allow_sds_over_tcp:
            print(SDS_OVER_TCP_REFUSED.format(listen=args.listen), file=sys.stderr)
            return True
        log.error(SDS_OVER_TCP_ALLOWED, args.listen)
    return False


def _state_io(args: argparse.Namespace) -> tuple[StateSource, StatusSink]:
    """Where the desired state comes from and the status goes: the --state file, or the cluster's MeshNode."""
    from aether.xds.sidecar.sources import FileSource, FileStatusSink, default_status_path

    if args.state:
        status_path = args.status_out or default_status_path(args.state)
        return FileSource(args.state, node=args.node), FileStatusSink(status_path)
    kube = importlib.import_module("aether.xds.sidecar.kube_source")
    return kube.source(args.node, args.kubeconfig), kube.status_sink(args.node, args.kubeconfig)


def _translate_options(args: argparse.Namespace, areas: tuple[str, ...]) -> TranslateOptions:
    from aether.xds.resources import TranslateOptions

    options = TranslateOptions(
        areas=areas,
        udp_prefer_gro=args.udp_gro == "on",
        udp_session_idle_s=args.udp_idle_timeout,
        udp_upstream_prefer_gro=None if args.udp_upstream_gro is None else args.udp_upstream_gro == "on",
        udp_gso_writer=args.udp_gso == "on",
        udp_max_sessions=args.udp_max_sessions,
        udp_preserve_source=args.udp_preserve_source,
        mesh_domain=args.mesh_domain,
        east_west_gateway=args.east_west_gateway,
        east_west_gateway_quic=_east_west_gateway_quic(args.east_west_gateway_quic, os.environ),
        **east_west_transport(args),
    )
    if options.udp_gso_writer:
        log.warning("--udp-gso on: UDP replies over 1,452 bytes to pods are dropped (Envoy's GSO writer refuses them)")
    return options


def _secret_keeper(args: argparse.Namespace, options: TranslateOptions) -> SecretKeeper:
    from aether.xds.sidecar.secrets import SecretKeeper, make_source

    if not args.certs_dir:
        log.warning("east-west identities from a built-in CA (--dev-builtin-ca): for tests and the demo only")
    return SecretKeeper(make_source(args.certs_dir, options))


def _listen(args: argparse.Namespace, sidecar: Sidecar, cache: SnapshotCache) -> grpc.Server | None:
    """The ADS server on --listen and the metrics on --metrics, started; None (after saying why) when either
    cannot listen."""
    from aether.xds.ads.server import DeltaAdsServer, serve

    servicer = DeltaAdsServer(cache, events=sidecar, on_demand=sidecar.on_demand, announce=args.announce == "on")
    try:
        server, port = serve(servicer, args.listen)
    except (OSError, RuntimeError) as exc:
        print(f"aether xds: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return None
    log.info("delta ADS on %s (port %s) for node %s", args.listen, port, args.node)
    if args.metrics:
        from aether.metrics import REGISTRY
        from aether.metrics import serve as serve_metrics
        from aether.xds.sidecar.kernel_metrics import KernelUdpCollector

        if sidecar.kernel is not None:  # the kernel path's counters, swept from the pod netns by their own thread
            collector = KernelUdpCollector(sidecar.kernel.holding)
            REGISTRY.register(collector)
            collector.start()
        try:
            serve_metrics(*args.metrics)
        except OSError as exc:
            print(f"aether xds: cannot listen (--metrics {args.metrics[0]}:{args.metrics[1]}): {exc}", file=sys.stderr)
            server.stop(0)
            return None
    return server


def _serve(argv: list[str]) -> int:
    p = _serve_parser()
    args = p.parse_args(argv)
    areas = _areas(p, args.areas)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    serves_secrets = not areas or "eastwest" in areas
    if _sds_listen_refused(args, serves_secrets):
        return 2
    if serves_secrets and not args.certs_dir and not args.dev_builtin_ca:
        print(
            "aether xds: east-west needs the node's identities: give --certs-dir DIR (a PEM directory per identity,"
            " docs/identity.md), or --dev-builtin-ca for a development CA no other node shares",
            file=sys.stderr,
        )
        return 2
    from aether.xds.ads.cache import SnapshotCache
    from aether.xds.pairs.values import PairConfig
    from aether.xds.sidecar.kernel_path import KernelUdpPath
    from aether.xds.sidecar.loop import Sidecar

    source, sink = _state_io(args)
    cache = SnapshotCache()
    options = _translate_options(args, areas)
    keeper = _secret_keeper(args, options) if serves_secrets else None
    pair_config = PairConfig(fetch_window_s=args.quic_pair_fetch_window)
    kernel = KernelUdpPath(args.udp_dataplane, idle_timeout_s=args.udp_idle_timeout)
    sidecar = Sidecar(
        args.node, cache, sink, args.records, options, secrets=keeper, pair_config=pair_config, kernel=kernel
    )
    stop = threading.Event()
    if not args.state and serves_secrets:  # cluster mode: the policies come from the API, read-only
        policies = importlib.import_module("aether.xds.sidecar.kube_policies")
        sidecar.awaiting_policies = True
        policies.start(sidecar.on_policies, stop, args.kubeconfig)
    server = _listen(args, sidecar, cache)
    if server is None:
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with FullCollections(args.full_gc_every):
        try:
            sidecar.run(source, stop)
        finally:
            server.stop(grace=1).wait(2)
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "render":
        return _render(argv[1:])
    if argv and argv[0] == "bootstrap":
        return _bootstrap(argv[1:])
    return _serve(argv)
