"""The raw TCP floor on TCP 18082: one transparent listener per local pod, a filter chain per VIP.

Each arm of `status.tcp.services` becomes a filter chain matching the original destination (`prefix_ranges`
VIP/32, or /128 for an IPv6 VIP, kept by the mark-and-divert capture) whose `tcp_proxy` goes to the arm's `tcp:<ns>/<svc>` EDS cluster.
IPv4 VIPs' chains sit on a listener on 0.0.0.0:18082,
IPv6 VIPs' on a second one on [::]:18082 (IPv6 only). A pod gets each listener only when the node has TCP arms of
that family (Envoy rejects a listener without filter chains);
a connection to an unknown VIP matches no chain and is closed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from aether.api.meshnode import MeshNode
from aether.api.naming import BLACKHOLE_CLUSTER
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.netns.records import PodRecord
from aether.xds.memo import LiveMemo, register
from aether.xds.resources import CLUSTER, ENDPOINT, LISTENER, ResourceDict, Resources, TranslateOptions
from aether.xds.translate.l4.common import (
    Arms,
    arms_key,
    eds_cluster,
    endpoints_by_cluster,
    is_ipv6,
    load_assignment,
    local_pods,
    stat_name,
)

TCP_PROXY_FILTER: Final = "envoy.filters.network.tcp_proxy"
TCP_PROXY_CONFIG: Final = "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"
LISTENER_PREFIX: Final = "capture-tcp:"
LISTENER6_PREFIX: Final = "capture-tcp6:"


def listener_name(namespace: str, pod: str, ipv6: bool = False) -> str:
    return f"{LISTENER6_PREFIX if ipv6 else LISTENER_PREFIX}{namespace}/{pod}"


def _chain(vip: str, cluster: str, stat_prefix: str) -> ResourceDict:
    return {
        "name": f"{vip}/{cluster}",
        "filterChainMatch": {"prefixRanges": [{"addressPrefix": vip, "prefixLen": 128 if is_ipv6(vip) else 32}]},
        "filters": [
            {
                "name": TCP_PROXY_FILTER,
                "typedConfig": {"@type": TCP_PROXY_CONFIG, "statPrefix": stat_prefix, "cluster": cluster},
            }
        ],
    }


# this node's listeners and load assignments that its last translation served, keyed by everything that shapes them
_MEMO: LiveMemo[tuple[object, ...], ResourceDict] = register(LiveMemo())


def capture_listener(name: str, netns: str, arms: Arms, stat_prefix: str, address: str = "0.0.0.0") -> ResourceDict:
    return {
        "name": name,
        "address": {
            "socketAddress": {"address": address, "portValue": L4_OUTBOUND_PORT, "networkNamespaceFilepath": netns}
        },
        "transparent": True,
        "filterChains": [_chain(vip, cluster, stat_prefix) for vip, cluster in arms],
    }


def build(node: MeshNode, records: Mapping[str, PodRecord], options: TranslateOptions) -> Resources:
    """The TCP-floor builder (contract in aether.xds.resources). What the node's last translation built for the same
    inputs is reused as the same object (the snapshot keeps its bytes), and only that is kept (`LiveMemo`)."""
    arms = node.status.tcp.services
    listeners: dict[str, ResourceDict] = {}
    clusters: dict[str, ResourceDict] = {}
    assignments: dict[str, ResourceDict] = {}
    with _MEMO.build(node.metadata.name) as built:
        if arms:
            key = arms_key(arms)
            by_family = (
                (False, "0.0.0.0", tuple(a for a in key if not is_ipv6(a[0]))),
                (True, "::", tuple(a for a in key if is_ipv6(a[0]))),
            )
            for pod, record in local_pods(node, records):
                for v6, address, family_arms in by_family:
                    if family_arms:  # Envoy refuses a listener without filter chains
                        name = listener_name(pod.namespace, pod.name, v6)
                        stat = stat_name(f"tcp_capture{'6' if v6 else ''}_{pod.namespace}_{pod.name}")
                        args = (name, record.netns, family_arms, stat, address)
                        listeners[name] = built.get(args, capture_listener, *args)
        for cluster, endpoints in sorted(endpoints_by_cluster(arms, skip=BLACKHOLE_CLUSTER).items()):
            clusters[cluster] = eds_cluster(cluster, options)
            assignments[cluster] = built.get((cluster, endpoints), load_assignment, cluster, endpoints)
    return {LISTENER: listeners, CLUSTER: clusters, ENDPOINT: assignments}
