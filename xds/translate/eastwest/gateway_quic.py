"""The east-west gateway's QUIC half on UDP `<gateway address>:18009` (pure dicts): SNI passthrough, never
terminating, beside the TCP listener of `gateway.py` and from the same exports.

One UDP listener (`LISTENER_NAME`) on the same address and `EAST_WEST_PORT` (R3: one number per role, both
transports). Its listener filters are our dynamic module `aether_quic_sni` (envoy-modules/, loaded from
`ENVOY_DYNAMIC_MODULES_SEARCH_PATH`), which reads the SNI from each new connection's client Initial (public keys
only) and passes the connection's datagrams on only when that SNI is exported, then `udp_proxy` to one EDS cluster
(`CLUSTER_NAME`) holding every exported SNI's endpoints (the pods' inbound UDP 18008). The cluster's load balancer
is the same module: for the session `udp_proxy` opens, it picks a healthy endpoint whose metadata
(`filter_metadata["aether.quic_sni"]["sni"]`, the SNIs the address serves, comma separated) names the connection's
SNI, never another Service's. The gateway holds no certificate and no key; the QUIC session is the source
proxy's with the destination's inbound.

Counters: `dynamicmodulescustom.quic_sni.quic_sni_{forwarded,unknown,refused,pending}` (the module),
`udp.east_west_gateway_quic.*` (udp_proxy), `cluster.east-west-quic.*`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from aether.netns.contract import EAST_WEST_PORT
from aether.xds.codec import extra_protos  # noqa: F401  (registers the module configs' messages for the codec)
from aether.xds.resources import TYPE_URL_PREFIX
from aether.xds.translate.eastwest.outbound import eds_cluster
from aether.xds.translate.l4.udp import UDP_PROXY_CONFIG, UDP_PROXY_FILTER, UDP_ROUTE

LISTENER_NAME: Final = "east-west-gateway-quic"
CLUSTER_NAME: Final = "east-west-quic"
STAT_PREFIX: Final = "east_west_gateway_quic"
MODULE: Final = "aether_quic_sni"  # lib<MODULE>.so in ENVOY_DYNAMIC_MODULES_SEARCH_PATH
FILTER_NAME: Final = "quic_sni"
LB_NAME: Final = "quic_sni"
METADATA_FILTER: Final = "aether.quic_sni"  # envoy-modules/quic-sni-filter/src/lb.rs reads these two
METADATA_KEY: Final = "sni"
MODULE_FILTER: Final = "envoy.filters.udp_listener.dynamic_modules"
MODULE_FILTER_TYPE: Final = (
    TYPE_URL_PREFIX + "envoy.extensions.filters.udp.dynamic_modules.v3.DynamicModuleUdpListenerFilter"
)
LB_POLICY: Final = "envoy.load_balancing_policies.dynamic_modules"
LB_POLICY_TYPE: Final = (
    TYPE_URL_PREFIX + "envoy.extensions.load_balancing_policies.dynamic_modules.v3.DynamicModulesLoadBalancerConfig"
)
STRING_VALUE: Final = TYPE_URL_PREFIX + "google.protobuf.StringValue"


def listener(snis: list[str], address: str) -> dict[str, Any]:
    """The UDP listener: the module (exporting `snis`) before udp_proxy, whose only route is the gateway cluster."""
    module = {
        "name": MODULE_FILTER,
        "typed_config": {
            "@type": MODULE_FILTER_TYPE,
            "dynamic_module_config": {"name": MODULE},
            "filter_name": FILTER_NAME,
            "filter_config": {"@type": STRING_VALUE, "value": ",".join(snis)},
        },
    }
    route = {"action": {"name": "route", "typed_config": {"@type": UDP_ROUTE, "cluster": CLUSTER_NAME}}}
    proxy = {
        "name": UDP_PROXY_FILTER,
        "typed_config": {"@type": UDP_PROXY_CONFIG, "stat_prefix": STAT_PREFIX, "matcher": {"on_no_match": route}},
    }
    return {
        "name": LISTENER_NAME,
        "stat_prefix": STAT_PREFIX,
        "address": {"socket_address": {"protocol": "UDP", "address": address, "port_value": EAST_WEST_PORT}},
        "listener_filters": [module, proxy],
    }


def cluster(connect_timeout_s: float, config_source: Mapping[str, Any] | None) -> dict[str, Any]:
    """The gateway's one QUIC cluster, EDS, its load balancer the module's."""
    policy = {"@type": LB_POLICY_TYPE, "dynamic_module_config": {"name": MODULE}, "lb_policy_name": LB_NAME}
    return {
        **eds_cluster(CLUSTER_NAME, connect_timeout_s, config_source),
        "load_balancing_policy": {
            "policies": [{"typed_extension_config": {"name": LB_POLICY, "typed_config": policy}}]
        },
    }


def assignment(snis: Mapping[str, list[tuple[str, int]]]) -> dict[str, Any]:
    """One UDP endpoint per address (first seen first), its metadata the SNIs it serves: a pod serving two SNIs
    is one host, not two hosts with one address."""
    by_address: dict[tuple[str, int], list[str]] = {}
    for sni, endpoints in snis.items():
        for ep in endpoints:
            by_address.setdefault(ep, []).append(sni)
    lb = [
        {
            "endpoint": {"address": {"socket_address": {"protocol": "UDP", "address": ip, "port_value": port}}},
            "metadata": {"filter_metadata": {METADATA_FILTER: {METADATA_KEY: ",".join(names)}}},
        }
        for (ip, port), names in by_address.items()
    ]
    return {"cluster_name": CLUSTER_NAME, "endpoints": [{"lb_endpoints": lb}]}
