"""The interface between translation, gates, codec and server: resources as Envoy proto3-JSON dicts.

`Resources` maps a type URL to `{resource name: proto3-JSON dict}`. A dict is the resource message itself
(no top-level `"@type"`; its type is the key); every `Any` inside it carries `"@type"`. That form is what
`aether xds render` prints, what golden tests compare, what `envoy --mode validate` tests put into a static
bootstrap and what `aether.xds.codec.protojson` turns into ADS bytes.

Builder contract (every area's builder, e.g. `aether.xds.translate.l4.udp.build`, `aether.xds.translate.l4.tcp.build`,
`aether.xds.translate.eastwest.build.build`):

    def build(node: MeshNode, records: Mapping[str, PodRecord], options: TranslateOptions) -> Resources

pure, deterministic (same input -> equal dicts), no I/O. `records` are the CNI pod records by pod uid.
`aether.xds.translate.compose.translate` merges the builders' results (a name produced twice for one type is an
error) and the gates (`aether.xds.gates.core`) run on the merged result.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from aether.api.authz import CompiledPolicy
from aether.api.naming import DEFAULT_MESH_DOMAIN, DEFAULT_TRUST_DOMAIN

TYPE_URL_PREFIX: Final = "type.googleapis.com/"  # of every type URL in an Any (the proto packages' full names follow)
LISTENER: Final = TYPE_URL_PREFIX + "envoy.config.listener.v3.Listener"
CLUSTER: Final = TYPE_URL_PREFIX + "envoy.config.cluster.v3.Cluster"
ENDPOINT: Final = TYPE_URL_PREFIX + "envoy.config.endpoint.v3.ClusterLoadAssignment"
ROUTE: Final = TYPE_URL_PREFIX + "envoy.config.route.v3.RouteConfiguration"
SECRET: Final = TYPE_URL_PREFIX + "envoy.extensions.transport_sockets.tls.v3.Secret"
KNOWN_TYPES: Final = (CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET)

ResourceDict: TypeAlias = dict[str, Any]


class Shared(dict[str, Any]):
    """A part of a resource (a proto3-JSON object) that is immutable and shared by identity between resources and
    translations (builders memoize it). The codec and the gates cache their work on it by identity."""


Resources: TypeAlias = dict[str, dict[str, ResourceDict]]


@dataclass(frozen=True)
class TranslateOptions:
    """Knobs of the translation. Other areas extend it with defaulted fields only."""

    mesh_domain: str = DEFAULT_MESH_DOMAIN
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    # udp_proxy session idle timeout (seconds) and GRO on the capture listeners: chosen by bench/xds_udp_path.py
    # (GRO on: ~0.42x vs ~0.35x direct at 1 datagram in flight, no change at 32; docs/performance.md)
    udp_session_idle_s: float = 60.0
    udp_prefer_gro: bool = True
    udp_upstream_prefer_gro: bool | None = None  # None: Envoy's default for udp_proxy upstream sockets
    # replies to the pod through Envoy's GSO batch writer: off, because it drops every reply over 1,452 bytes
    udp_gso_writer: bool = False
    udp_max_rx_datagram_size: int = 65_535  # both sides of udp_proxy; Envoy's own default (1,500) drops larger
    udp_max_sessions: int = 100_000  # concurrent udp_proxy sessions per Service (the cluster's max_connections)
    # backends see the client pod's address (udp_proxy use_original_src_ip); needs the node return path
    # (aether.netns.node_return) installed where Envoy runs
    udp_preserve_source: bool = False
    cluster_connect_timeout_s: float = 1.0
    # which builders run (names in aether.xds.translate.compose.AREAS); empty = all of them
    areas: tuple[str, ...] = ()
    # MeshAuthorizationPolicies (aether.api.authz.compile_bodies): the east-west inbound's RBAC (eastwest/rbac.py)
    authorization: tuple[CompiledPolicy, ...] = ()
    # this node plays the east-west gateway on <address>:18009 (eastwest/gateway.py; `aether xds --east-west-gateway`)
    east_west_gateway: str | None = None
    # ... and its QUIC half on UDP 18009 (eastwest/gateway_quic.py): needs the aether_quic_sni module in Envoy's
    # ENVOY_DYNAMIC_MODULES_SEARCH_PATH (the sidecar sets it when the module is there)
    east_west_gateway_quic: bool = False
    # this node's pods call other pods over QUIC twins; False: over the h2 clusters only (`aether xds --east-west-quic`)
    east_west_quic: bool = True
    # the east-west clusters' idle timeout (`aether xds --east-west-idle-timeout`); None: EastWestOptions' own
    east_west_idle_timeout_s: float | None = None


def seconds(value: float) -> str:
    """proto3-JSON Duration, rounded to microseconds (protobuf refuses more than nine fractional digits, and a float
    such as 1.999999999985448 has more)."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return f"{text}s"


def short_type(type_url: str) -> str:
    return type_url.rsplit(".", 1)[-1]


def canonical_json(resource: ResourceDict) -> bytes:
    return json.dumps(resource, sort_keys=True, separators=(",", ":")).encode()


def version_of(resource: ResourceDict) -> str:
    """A resource's version: a hash of its content, so a restarted server computes the same versions."""
    return hashlib.blake2b(canonical_json(resource), digest_size=10).hexdigest()


def merge(*parts: Resources) -> Resources:
    """Union of builders' results; one name produced twice for one type is a programming error."""
    out: Resources = {}
    for part in parts:
        for type_url, named in part.items():
            dest = out.get(type_url)
            if dest is None:
                out[type_url] = dict(named)
                continue
            if not dest.keys().isdisjoint(named):
                name = next(n for n in named if n in dest)
                raise ValueError(f"two builders produced {short_type(type_url)} {name!r}")
            dest.update(named)
    return out


def count(resources: Mapping[str, Mapping[str, ResourceDict]]) -> dict[str, int]:
    return {short_type(t): len(v) for t, v in sorted(resources.items())}
