"""Outbound HTTP (pure dicts): per local pod a transparent TCP listener on 0.0.0.0:18080 (and on [::]:18080 for a pod
with an IPv6 address) in its netns that stamps
the pod's identity; one node-wide route table picking, per destination Host, the source's QUIC twin or the h2
cluster; the h2 clusters, the twins and their load assignments.

The listener takes only the pod's own traffic: its one filter chain matches connections whose direct source is the
pod's IP or loopback (what the pod's diverted egress and its own `127.0.0.1:18080` carry; a packet from outside the
netns with either source is a martian the kernel drops). Anything else, such as a process in the node's netns or on
another node (a mesh source STRICT admits) dialling `<pod IP>:18080`, meets the default chain: a deny-all RBAC filter
answers 403, counted in `http.http_outbound_foreign_source.rbac.denied` and logged as one JSON line
(`aether-outbound-refused`: the pod, the peer, the address dialled). Before this, such a caller was served as the
pod, its SPIFFE ID stamped on the request: a confused deputy.

Twin selection: the route's `MatcherClusterSpecifier` reads the stamped identity (`FilterStateInput`) and maps
each local SPIFFE ID to its twin `quic:<ns>/<svc>@<sa>` (`@<sa-ns>/<sa>` for a source in another namespace); no
match (or QUIC off) goes to `h2:<ns>/<svc>`. The identity is stamped by a *network* filter on the new connection, so it exists before the route is resolved
(an HTTP set_filter_state would need `clear_route_cache`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from aether.api.naming import h2_cluster, mesh_host, quic_sni, quic_twin
from aether.netns.contract import HTTP_OUTBOUND_PORT
from aether.xds.identity.sds import ADS
from aether.xds.identity.svid import parse_spiffe_id
from aether.xds.resources import TYPE_URL_PREFIX, seconds
from aether.xds.translate.eastwest.inbound import HCM_NAME, HCM_TYPE, ROUTER, STDOUT_LOG_TYPE, file_access_logs
from aether.xds.translate.eastwest.plan import Destination, EastWestOptions, LocalPod
from aether.xds.translate.eastwest.rbac import RBAC_TYPE
from aether.xds.translate.eastwest.tls import IDENTITY_KEY, h2_upstream_socket, quic_upstream_socket

SET_FILTER_STATE: Final = "envoy.filters.network.set_filter_state"
SET_FILTER_STATE_TYPE: Final = TYPE_URL_PREFIX + "envoy.extensions.filters.network.set_filter_state.v3.Config"
ON_DEMAND_TYPE: Final = TYPE_URL_PREFIX + "envoy.extensions.filters.http.on_demand.v3.OnDemand"
MATCHER_SPECIFIER: Final = "envoy.router.cluster_specifier_plugin.matcher"
MATCHER_SPECIFIER_TYPE: Final = (
    TYPE_URL_PREFIX + "envoy.extensions.router.cluster_specifiers.matcher.v3.MatcherClusterSpecifier"
)
CLUSTER_ACTION_TYPE: Final = TYPE_URL_PREFIX + "envoy.extensions.router.cluster_specifiers.matcher.v3.ClusterAction"
FILTER_STATE_INPUT_TYPE: Final = TYPE_URL_PREFIX + "envoy.extensions.matching.common_inputs.network.v3.FilterStateInput"
HTTP_OPTIONS: Final = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
FOREIGN_CHAIN: Final = "foreign-source"
FOREIGN_STATS: Final = "http_outbound_foreign_source"  # -> http.http_outbound_foreign_source.rbac.denied
FOREIGN_POLICY: Final = "aether:not-this-pods-traffic"
LOOPBACK: Final = ({"address_prefix": "127.0.0.0", "prefix_len": 8}, {"address_prefix": "::1", "prefix_len": 128})


def listener_name(pod: LocalPod, ipv6: bool = False) -> str:
    return f"http-outbound{'6' if ipv6 else ''}:{pod.namespace}/{pod.name}"


def listeners(pod: LocalPod, options: EastWestOptions) -> dict[str, dict[str, Any]]:
    """The pod's outbound listener on 0.0.0.0:18080 (always: `127.0.0.1:18080` is a spelling every pod has), and when
    the pod has an IPv6 address a second one on [::]:18080 (IPv6 only) for what it dials at IPv6 VIPs."""
    has_v6 = any(":" in a for a in pod.addresses)
    out = {}
    for ipv6 in (False, True):
        if has_v6 or not ipv6:
            one = listener(pod, options, "::" if ipv6 else "0.0.0.0")
            one["name"] = listener_name(pod, ipv6)
            out[one["name"]] = one
    return out


def _cs(options: EastWestOptions) -> dict[str, Any]:
    return dict(options.config_source) if options.config_source else dict(ADS)


def _tls_cs(options: EastWestOptions) -> dict[str, Any] | None:
    return dict(options.config_source) if options.config_source else None


def stamp_identity(identity: str, factory: str) -> dict[str, Any]:
    return {
        "name": SET_FILTER_STATE,
        "typed_config": {
            "@type": SET_FILTER_STATE_TYPE,
            "on_new_connection": [
                {
                    "object_key": IDENTITY_KEY,
                    "factory_key": factory,
                    "format_string": {"text_format_source": {"inline_string": identity}},
                    "shared_with_upstream": "ONCE",
                }
            ],
        },
    }


def on_demand_filter(options: EastWestOptions) -> dict[str, Any]:
    """The `on_demand` HTTP filter the outbound runs before the router: a route's cluster Envoy lacks is fetched over
    on-demand CDS on the ADS stream (no `resources_locator`), waiting at most `odcds_timeout_s`."""
    on_demand: dict[str, Any] = {"@type": ON_DEMAND_TYPE}
    if options.config_source is None or "ads" in options.config_source:
        on_demand["odcds"] = {"source": _cs(options), "timeout": seconds(options.odcds_timeout_s)}
    return {"name": "envoy.filters.http.on_demand", "typed_config": on_demand}


def own_traffic(pod: LocalPod) -> dict[str, Any]:
    """The filter chain match of the pod's own connections: direct source one of the pod's IPs or loopback."""
    own = [{"address_prefix": ip, "prefix_len": 128 if ":" in ip else 32} for ip in pod.addresses]
    return {"direct_source_prefix_ranges": [*own, *LOOPBACK]}


def foreign_source_chain(pod: LocalPod) -> dict[str, Any]:
    """The listener's default chain: whatever is not the pod's own traffic meets a deny-all RBAC filter (403
    `rbac_access_denied_matched_policy[aether:not-this-pods-traffic]`), counted in
    `http.http_outbound_foreign_source.rbac.denied` and logged; nothing is forwarded, no identity stamped."""
    deny = {"permissions": [{"any": True}], "principals": [{"any": True}]}
    rbac = {"@type": RBAC_TYPE, "rules": {"action": "DENY", "policies": {FOREIGN_POLICY: deny}}}
    refuse = {"match": {"prefix": "/"}, "direct_response": {"status": 403}}
    hcm = {
        "@type": HCM_TYPE,
        "stat_prefix": FOREIGN_STATS,
        "codec_type": "AUTO",
        "route_config": {
            "name": FOREIGN_CHAIN,
            "virtual_hosts": [{"name": "refuse", "domains": ["*"], "routes": [refuse]}],
        },
        "http_filters": [{"name": "envoy.filters.http.rbac", "typed_config": rbac}, ROUTER],
        "access_log": [refused_log(pod)],
    }
    return {"name": FOREIGN_CHAIN, "filters": [{"name": HCM_NAME, "typed_config": hcm}]}


def refused_log(pod: LocalPod) -> dict[str, Any]:
    """One JSON line on Envoy's stdout per refused request: the pod whose listener it reached, the peer."""
    fmt = {
        "log": "aether-outbound-refused",
        "time": "%START_TIME%",
        "pod": f"{pod.namespace}/{pod.name}",
        "peer": "%DOWNSTREAM_DIRECT_REMOTE_ADDRESS%",
        "local": "%DOWNSTREAM_LOCAL_ADDRESS%",
        "authority": "%REQ(:AUTHORITY)%",
        "status": "%RESPONSE_CODE%",
        "responseCodeDetails": "%RESPONSE_CODE_DETAILS%",
    }
    return {
        "name": "envoy.access_loggers.stdout",
        "typed_config": {"@type": STDOUT_LOG_TYPE, "log_format": {"json_format": fmt}},
    }


def listener(pod: LocalPod, options: EastWestOptions, address: str = "0.0.0.0") -> dict[str, Any]:
    hcm = {
        "@type": HCM_TYPE,
        "stat_prefix": "http_outbound",
        "codec_type": "AUTO",
        "strip_any_host_port": True,
        "rds": {"route_config_name": options.http_outbound_route, "config_source": _cs(options)},
        "http_filters": [on_demand_filter(options), ROUTER],
        "access_log": file_access_logs(options.access_log_path),
    }
    return {
        "name": listener_name(pod),
        "address": {
            "socket_address": {
                "address": address,
                "port_value": HTTP_OUTBOUND_PORT,
                "network_namespace_filepath": pod.netns,
            }
        },
        "transparent": True,
        "default_filter_chain": foreign_source_chain(pod),
        "filter_chains": [
            {
                "name": "http-outbound",
                "filter_chain_match": own_traffic(pod),
                "filters": [
                    stamp_identity(pod.identity, options.identity_factory),
                    {"name": HCM_NAME, "typed_config": hcm},
                ],
            }
        ],
    }


def _action(cluster: str) -> dict[str, Any]:
    return {"action": {"name": "cluster", "typed_config": {"@type": CLUSTER_ACTION_TYPE, "cluster": cluster}}}


def twin_name(dest: Destination, source: str) -> str:
    """The twin of `dest` for the source SPIFFE ID `source` (aether.api.naming.quic_twin)."""
    sid = parse_spiffe_id(source)
    return quic_twin(dest.namespace, dest.service, sid.service_account, sid.namespace)


def route_action(dest: Destination, sources: list[str], quic: bool) -> dict[str, Any]:
    h2 = h2_cluster(dest.namespace, dest.service)
    if not quic or not sources:
        return {"cluster": h2}
    arms = {sid: _action(twin_name(dest, sid)) for sid in sources}
    return {
        "inline_cluster_specifier_plugin": {
            "extension": {
                "name": MATCHER_SPECIFIER,
                "typed_config": {
                    "@type": MATCHER_SPECIFIER_TYPE,
                    "cluster_matcher": {
                        "matcher_tree": {
                            "input": {
                                "name": "source-identity",
                                "typed_config": {"@type": FILTER_STATE_INPUT_TYPE, "key": IDENTITY_KEY},
                            },
                            "exact_match_map": {"map": arms},
                        },
                        "on_no_match": _action(h2),
                    },
                },
            }
        }
    }


def quic(dest: Destination, options: EastWestOptions) -> bool:
    """Whether `dest`'s route selects twins: QUIC on. A remote Service's twins dial its cluster's gateway on UDP
    18009 (the QUIC passthrough), as its h2 cluster dials TCP 18009, with the same SNI, pinned SPIFFE ID and
    per-source SVID; a remote Service whose gateways offer h2 only (`Destination.h3` False) is routed over h2 on
    TCP 18009 with the source's own SVID, as every Service is with QUIC off."""
    return options.quic and dest.h3


def route_config(
    dests: list[Destination], sources: list[str], mesh_domain: str, options: EastWestOptions
) -> dict[str, Any]:
    vhosts = []
    for d in dests:
        domains = [f"{d.service}.{d.namespace}", mesh_host(d.namespace, d.service, mesh_domain)]
        if d.vip:
            domains.append(d.vip)
        vhosts.append(
            {
                "name": f"{d.namespace}/{d.service}",
                "domains": domains,
                "routes": [{"match": {"prefix": "/"}, "route": route_action(d, sources, quic(d, options))}],
            }
        )
    return {"name": options.http_outbound_route, "validate_clusters": False, "virtual_hosts": vhosts}


def eds_cluster(name: str, connect_timeout_s: float, config_source: Mapping[str, Any] | None) -> dict[str, Any]:
    """An EDS cluster whose load assignment has the cluster's name, from `config_source` (ADS when None)."""
    return {
        "name": name,
        "type": "EDS",
        "eds_cluster_config": {"service_name": name, "eds_config": dict(config_source) if config_source else dict(ADS)},
        "connect_timeout": seconds(connect_timeout_s),
    }


def _eds_cluster(name: str, options: EastWestOptions) -> dict[str, Any]:
    return eds_cluster(name, options.connect_timeout_s, options.config_source)


def http_options(protocol: str, options: EastWestOptions) -> dict[str, Any]:
    """The upstream HTTP options of an h2 cluster or a twin: the one protocol, and the idle timeout after which a
    connection with no request closes. An h2 cluster pools per source identity, so without it a ServiceAccount's
    connections (and the destination's side of them) stayed up to Envoy's default hour after its last pod left."""
    return {
        "@type": TYPE_URL_PREFIX + HTTP_OPTIONS,
        "common_http_protocol_options": {"idle_timeout": seconds(options.idle_timeout_s)},
        "explicit_http_config": {protocol: {}},
    }


def h2_cluster_resource(
    dest: Destination, trust_domain: str, mesh_domain: str, options: EastWestOptions
) -> dict[str, Any]:
    name = h2_cluster(dest.namespace, dest.service)
    sni = quic_sni(dest.primary_port, dest.service_account, dest.namespace, mesh_domain)
    return {
        **_eds_cluster(name, options),
        "transport_socket": h2_upstream_socket(sni, dest.identity, trust_domain, _tls_cs(options)),
        "typed_extension_protocol_options": {HTTP_OPTIONS: http_options("http2_protocol_options", options)},
    }


def twin_resource(
    dest: Destination, source: str, trust_domain: str, mesh_domain: str, options: EastWestOptions
) -> dict[str, Any]:
    name = twin_name(dest, source)
    sni = quic_sni(dest.primary_port, dest.service_account, dest.namespace, mesh_domain)
    return {
        **_eds_cluster(name, options),
        "connection_pool_per_downstream_connection": False,
        "transport_socket": quic_upstream_socket(sni, source, dest.identity, trust_domain, _tls_cs(options)),
        "typed_extension_protocol_options": {HTTP_OPTIONS: http_options("http3_protocol_options", options)},
    }


def endpoints_assignment(name: str, endpoints: Iterable[tuple[str, int]]) -> dict[str, Any]:
    """The load assignment of cluster `name`: one locality, one lbEndpoint per (ip, port), in order."""
    lb = [{"endpoint": {"address": {"socket_address": {"address": ip, "port_value": port}}}} for ip, port in endpoints]
    return {"cluster_name": name, "endpoints": [{"lb_endpoints": lb}]}


def load_assignment(name: str, dest: Destination) -> dict[str, Any]:
    return endpoints_assignment(name, dest.endpoints)
