"""The east-west gateway's TCP half on `<gateway address>:18009` (pure dicts): SNI passthrough, never terminating.

One TCP listener (`LISTENER_NAME`) on the gateway node's own address and `EAST_WEST_PORT`: the `tls_inspector`
listener filter reads the ClientHello's `server_name`, and one filter chain per exported SNI
(`<port>.<sa>.<ns>.<mesh-domain>`, `aether.api.naming.quic_sni`, the SNI every east-west client already sends)
hands the connection, bytes unread, to `tcp_proxy` and a cluster of the pods serving that SNI, on their inbound
18008. No chain carries a transport socket: the gateway holds no certificate and no key, and the TLS session is the
source proxy's with the destination's inbound, which verifies the source's own SVID (and sets XFCC from it).

An SNI no exported Service has, a ClientHello without SNI, or a connection that is not TLS meets no chain: there is
no `default_filter_chain`, so Envoy closes the connection and counts it in
`listener.east_west_gateway.no_filter_chain_match` (the listener's `stat_prefix`). Forwarded connections count in
`tcp.east_west_gateway.*`, per destination in `cluster.east-west_<sni>.*` (the cluster `east-west:<sni>`; Envoy
writes `:` as `_` in stat names).

Several Services with one ServiceAccount and port share an SNI (the name carries the ServiceAccount, because the
client checks the destination's SVID by it): their endpoints are one cluster, as any of those pods' inbound has
the chain that SNI selects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from aether.api.meshnode import MeshNode
from aether.api.naming import quic_sni
from aether.netns.contract import EAST_WEST_PORT
from aether.netns.records import PodRecord
from aether.xds.resources import CLUSTER, ENDPOINT, LISTENER, TYPE_URL_PREFIX, Resources, TranslateOptions
from aether.xds.translate.eastwest import gateway_quic
from aether.xds.translate.eastwest.build import camel
from aether.xds.translate.eastwest.inbound import TLS_INSPECTOR
from aether.xds.translate.eastwest.outbound import eds_cluster, endpoints_assignment
from aether.xds.translate.eastwest.plan import Destination, destinations

LISTENER_NAME: Final = "east-west-gateway"
STAT_PREFIX: Final = "east_west_gateway"  # listener.east_west_gateway.no_filter_chain_match, tcp.east_west_gateway.*
CLUSTER_PREFIX: Final = "east-west:"
TCP_PROXY: Final = "envoy.filters.network.tcp_proxy"
TCP_PROXY_TYPE: Final = TYPE_URL_PREFIX + "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"


def cluster_name(sni: str) -> str:
    return CLUSTER_PREFIX + sni


def exported_snis(exports: Sequence[Destination], mesh_domain: str) -> dict[str, list[tuple[str, int]]]:
    """Every SNI the gateway forwards, with the inbound endpoints behind it (union over the Services sharing it,
    first seen first), sorted by SNI."""
    out: dict[str, list[tuple[str, int]]] = {}
    for d in exports:
        for port in d.ports:
            seen = out.setdefault(quic_sni(port, d.service_account, d.namespace, mesh_domain), [])
            seen += [e for e in d.endpoints if e not in seen]
    return {sni: out[sni] for sni in sorted(out)}


def _chain(sni: str) -> dict[str, Any]:
    return {
        "name": f"sni:{sni}",
        "filter_chain_match": {"server_names": [sni], "transport_protocol": "tls"},
        "filters": [
            {
                "name": TCP_PROXY,
                "typed_config": {"@type": TCP_PROXY_TYPE, "stat_prefix": STAT_PREFIX, "cluster": cluster_name(sni)},
            }
        ],
    }


def listener(snis: Sequence[str], address: str) -> dict[str, Any]:
    """The passthrough listener: tls_inspector, one chain per SNI, no default chain, no transport socket."""
    return {
        "name": LISTENER_NAME,
        "stat_prefix": STAT_PREFIX,
        "address": {"socket_address": {"protocol": "TCP", "address": address, "port_value": EAST_WEST_PORT}},
        "listener_filters": [TLS_INSPECTOR],
        "filter_chains": [_chain(sni) for sni in snis],
    }


def build(
    exports: Sequence[Destination],
    address: str,
    mesh_domain: str,
    *,
    connect_timeout_s: float = 2.0,
    config_source: Mapping[str, Any] | None = None,
    quic: bool = False,
) -> Resources:
    """The gateway role's resources, served form (lowerCamelCase, as `eastwest.build`): its listener on
    `address:18009`, one EDS cluster and load assignment per exported SNI; with `quic`, also the UDP listener on
    the same address and port and its one cluster (`gateway_quic`). No exports: the port is closed and
    refuses every connection: no listener at all (Envoy rejects a listener without filter chains: "no filter chains
    specified", seen with `--mode validate`)."""
    snis = exported_snis(exports, mesh_domain)
    out: Resources = {
        LISTENER: {LISTENER_NAME: listener(list(snis), address)} if snis else {},
        CLUSTER: {cluster_name(s): eds_cluster(cluster_name(s), connect_timeout_s, config_source) for s in snis},
        ENDPOINT: {cluster_name(s): endpoints_assignment(cluster_name(s), eps) for s, eps in snis.items()},
    }
    if quic and snis:
        out[LISTENER][gateway_quic.LISTENER_NAME] = gateway_quic.listener(list(snis), address)
        out[CLUSTER][gateway_quic.CLUSTER_NAME] = gateway_quic.cluster(connect_timeout_s, config_source)
        out[ENDPOINT][gateway_quic.CLUSTER_NAME] = gateway_quic.assignment(snis)
    converted: Resources = camel(out)
    return converted


def area(node: MeshNode, records: Mapping[str, PodRecord], options: TranslateOptions) -> Resources:
    """The gateway role as a translation area (`aether.xds.translate.compose`): nothing unless
    `options.east_west_gateway` names this node's address. It exports every QUIC destination the node's MeshNode
    lists (its dependency set: with the default egress, every eligible Service of the cluster), with their
    endpoints, so a gateway node is one whose egress reaches what it exports; a destination that is itself remote
    (`gateways`) is not exported. `options.east_west_gateway_quic` adds the UDP half (the sidecar sets it when
    its Envoy can load the `aether_quic_sni` module)."""
    if options.east_west_gateway is None:
        return {}
    exports = [d for d in destinations(node, options.trust_domain) if not d.gateways]  # never re-export a remote one
    address, quic = options.east_west_gateway, options.east_west_gateway_quic
    return build(exports, address, options.mesh_domain, connect_timeout_s=2.0, quic=quic)
