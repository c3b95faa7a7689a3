"""Argument types of the sidecar's command line (`aether xds`): durations, the mesh domain, the gateway address."""

from __future__ import annotations

import argparse
import ipaddress
import re

from aether.api.naming import DEFAULT_MESH_DOMAIN

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


def east_west_gateway_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--east-west-gateway",
        metavar="ADDRESS",
        type=ipv4_address,
        help="play the east-west gateway: a TCP listener on ADDRESS:18009 (this node's own address, reachable from "
        "the other cluster) forwarding TLS by its SNI, unopened, to the pods of every QUIC destination this node's "
        "MeshNode lists (docs/architecture.md#the-east-west-gateway); default: no gateway",
    )


def ipv4_address(value: str) -> str:
    try:
        return str(ipaddress.IPv4Address(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an IPv4 address") from None


def mesh_domain(value: str) -> str:
    if not MESH_DOMAIN.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a DNS domain of two or more lowercase labels")
    return value
