"""Argument types of the sidecar's command line (`aether xds`): durations, the mesh domain, the east-west transport,
the gateway address."""

from __future__ import annotations

import argparse
import ipaddress
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aether.api.meshnode import UDP_DATAPLANES
from aether.api.naming import DEFAULT_MESH_DOMAIN
from aether.xds.translate.eastwest.gateway_quic import MODULE as QUIC_MODULE

MESH_DOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+")

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def duration(value: str) -> float:
    """`90`, `90s`, `30m`, `1h` (seconds, minutes, hours): greater than 0."""
    text = value.strip().lower()
    unit = _UNITS.get(text[-1:])
    try:
        number = float(text[:-1] if unit else text) * (unit or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: not a duration (e.g. 3600, 90s, 30m, 1h)") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: must be greater than 0")
    return number


def mesh_domain_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mesh-domain",
        type=mesh_domain,
        default=DEFAULT_MESH_DOMAIN,
        help=f"the domain pods dial Services under (<svc>.<ns>.<domain>), which the QUIC SNI and the SVIDs' DNS names "
        f"end in (default {DEFAULT_MESH_DOMAIN}; every node and the certificates must agree)",
    )


def east_west_quic_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--east-west-quic",
        choices=["on", "off"],
        default="on",
        help="on (default): this node's pods call other pods over their QUIC twins (HTTP/3, one per source "
        "ServiceAccount and destination); off: every destination over its h2 cluster (TCP mTLS HTTP/2 with the "
        "source's own SVID), no twin built. Either way the node's inbound serves both",
    )
    p.add_argument(
        "--east-west-idle-timeout",
        type=duration,
        default=None,
        help="how long a source's east-west connection (its h2 pool's or its twin's) may carry no request before "
        "this node's Envoy closes it (e.g. 90s, 5m; default 5m). The h2 pools are per source identity: a "
        "ServiceAccount's connections outlive its last pod on the node by this much",
    )


def east_west_transport(args: argparse.Namespace) -> dict[str, Any]:
    """The `TranslateOptions` fields `east_west_quic_argument`'s flags set."""
    return {"east_west_quic": args.east_west_quic == "on", "east_west_idle_timeout_s": args.east_west_idle_timeout}


def udp_dataplane_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--udp-dataplane",
        choices=UDP_DATAPLANES,
        default="envoy",
        help="the node's default UDP data path for plaintext UDP Services (a Service's annotation "
        "mesh.aether.dev/udp-dataplane overrides it): envoy (default: the capture to the node's Envoy) or kernel "
        "(nft rules in each meshed pod's netns pick a backend and rewrite the address; needs CAP_NET_ADMIN and "
        "CAP_SYS_ADMIN to enter the pods' netns; docs/operations.md#the-udp-data-path)",
    )


def east_west_gateway_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--east-west-gateway",
        metavar="ADDRESS",
        type=ipv4_address,
        help="play the east-west gateway: a TCP listener on ADDRESS:18009 (this node's own address, reachable from "
        "the other cluster) forwarding TLS by its SNI, unopened, to the pods of every QUIC destination this node's "
        "MeshNode lists (docs/architecture.md#the-east-west-gateway); default: no gateway",
    )
    p.add_argument(
        "--east-west-gateway-quic",
        choices=["auto", "on", "off"],
        default="auto",
        help="the gateway's QUIC half, a UDP listener on ADDRESS:18009 (HTTP/3 passed through by the SNI of the "
        "client's Initial); it needs the aether_quic_sni module (lib" + QUIC_MODULE + ".so) in Envoy's "
        "ENVOY_DYNAMIC_MODULES_SEARCH_PATH, as the node image ships it. auto (default): on when the module is there",
    )


def east_west_gateway_quic(choice: str, environ: Mapping[str, str]) -> bool:
    """Whether the gateway serves its QUIC half: `on`/`off`, or for `auto` whether Envoy (which inherits this
    environment) will find the module. Without it, Envoy would refuse the listener and with it the whole update."""
    if choice != "auto":
        return choice == "on"
    search = environ.get("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", "")
    return bool(search) and (Path(search) / f"lib{QUIC_MODULE}.so").is_file()


def ipv4_address(value: str) -> str:
    try:
        return str(ipaddress.IPv4Address(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an IPv4 address") from None


def mesh_domain(value: str) -> str:
    if not MESH_DOMAIN.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a DNS domain of two or more lowercase labels")
    return value
