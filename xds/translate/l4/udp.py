"""Per-service plaintext UDP (R1): one transparent UDP listener per local pod, a destination-IP matcher.

For each local pod (MeshNode lists it and the CNI wrote its record) one listener on UDP 0.0.0.0:18082 (and, when
any arm has an IPv6 VIP, a second one on [::]:18082, IPv6 only, with the same matcher) bound into the pod netns (`network_namespace_filepath`, `transparent: true`), whose `udp_proxy` matcher maps every
arm's VIP (`DestinationIPInput`, exact) to the arm's `udp:<ns>/<svc>` cluster, `on_no_match` -> blackhole.
One EDS cluster per UDP service (EDS name = cluster name) with endpoints at the backend's application port.
Listener count scales with local pods, never with services, with one exception: a Service with its own session
idle timeout (`ServiceArm.idle_timeout_seconds`, from its annotation) gets one more listener per pod, bound to
`<VIP>:18082` in the same netns with that timeout (udp_proxy's idle timeout is per listener). The kernel hands a
datagram to the most specific bound socket, so the VIP's flows land there and the wildcard listener sees the rest.
A weighted arm (a UDPRoute split) names its own cluster, one locality per backend (`aether.xds.translate.l4.split`).

Every datagram a UDP socket can carry (to 65,507 bytes over IPv4, 65,527 over IPv6) passes both ways: both the capture listener and
udp_proxy's upstream sockets set `max_rx_datagram_size` (Envoy's default, 1,500, drops anything larger as soon
as GRO is off), and replies leave through Envoy's default writer. The GSO batch writer is opt-in only: it is
QUIC's writer and refuses any reply over 1,452 bytes with EMSGSIZE, so a DNS answer of 1.5-4 KB would be lost,
not truncated (docs/performance.md). Each udp_proxy session (one client address and port) counts as an
upstream connection against the cluster's circuit breaker, so the udp clusters size `max_connections` for
sessions (`udp_max_sessions`, default 100,000) instead of Envoy's 1,024.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from aether.api.meshnode import MeshNode
from aether.api.naming import BLACKHOLE_CLUSTER
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.netns.records import PodRecord
from aether.xds.memo import LiveBuild, LiveMemo, lru, register
from aether.xds.resources import CLUSTER, ENDPOINT, LISTENER, ResourceDict, Resources, Shared, TranslateOptions, seconds
from aether.xds.translate.l4.common import Arms, ClusterShape, families, local_pods, match_key, stat_name
from aether.xds.translate.l4.memo import DigestMemo
from aether.xds.translate.l4.split import split_resources

UDP_PROXY_FILTER: Final = "envoy.filters.udp_listener.udp_proxy"
UDP_PROXY_CONFIG: Final = "type.googleapis.com/envoy.extensions.filters.udp.udp_proxy.v3.UdpProxyConfig"
UDP_ROUTE: Final = "type.googleapis.com/envoy.extensions.filters.udp.udp_proxy.v3.Route"
DESTINATION_IP_INPUT: Final = (
    "type.googleapis.com/envoy.extensions.matching.common_inputs.network.v3.DestinationIPInput"
)
LISTENER_PREFIX: Final = "capture-udp:"
LISTENER6_PREFIX: Final = "capture-udp6:"
GSO_WRITER: Final = "envoy.udp_packet_writer.gso"
GSO_WRITER_CONFIG: Final = "type.googleapis.com/envoy.extensions.udp_packet_writer.v3.UdpGsoBatchWriterFactory"
# the receive buffer per datagram on both sides: the largest UDP payload (65,507 on IPv4, 65,527 on IPv6) fits
MAX_RX_DATAGRAM_SIZE: Final = 65_535


# An IPv6 UDP listener's socket comes from Envoy with path-MTU discovery forced on (no local fragmentation): a reply
# larger than the pod's loopback takes whole (65,536 - 48 = 65,488 B of payload) fails with EMSGSIZE, counted in
# `downstream_sess_tx_errors`, though IPv6 carries 65,527 B (seen: 65,507 B lost so, 65,000 B passed). Set back to
# IPV6_PMTUDISC_WANT once the socket is bound (after Envoy's own options): the reply is then fragmented on the pod's
# loopback as the client's request was. IPv4's largest datagram (65,535 B with headers) fits loopback whole.
_FRAGMENT_V6: Final = (
    {"description": "IPV6_MTU_DISCOVER want", "level": 41, "name": 23, "intValue": "1", "state": "STATE_BOUND"},
)


def listener_name(namespace: str, pod: str) -> str:
    return f"{LISTENER_PREFIX}{namespace}/{pod}"


@lru(maxsize=1 << 16)
def _route(cluster: str) -> ResourceDict:
    return Shared(action={"name": "route", "typedConfig": {"@type": UDP_ROUTE, "cluster": cluster}})


def matcher(arms: Arms) -> ResourceDict:
    """VIP -> cluster, exact on the datagram's destination IP; everything else to the blackhole."""
    out: ResourceDict = Shared(onNoMatch=_route(BLACKHOLE_CLUSTER))
    if arms:
        out["matcherTree"] = {
            "input": {"name": "destination-ip", "typedConfig": {"@type": DESTINATION_IP_INPUT}},
            "exactMatchMap": {"map": {match_key(vip): _route(cluster) for vip, cluster in arms}},
        }
    return out


def listener6_name(namespace: str, pod: str) -> str:
    return f"{LISTENER6_PREFIX}{namespace}/{pod}"


def vip_listener_name(namespace: str, pod: str, vip: str) -> str:
    return f"{LISTENER_PREFIX}{namespace}/{pod}@{vip}"


def capture_listener(
    name: str,
    netns: str,
    match: ResourceDict,
    options: TranslateOptions,
    stat_prefix: str,
    address: str = "0.0.0.0",
    idle_s: float | None = None,
) -> ResourceDict:
    """A capture listener with the `matcher` of its arms: the pod's wildcard one (every arm), or one bound to a
    single VIP (`address`) for a Service with its own session idle timeout (`idle_s`; None: the node's default)."""
    listener: ResourceDict = {
        "name": name,
        "statPrefix": stat_prefix,  # listener.<pod>.* rather than one listener.0.0.0.0_18082.* for every pod
        "address": {
            "socketAddress": {
                "protocol": "UDP",
                "address": address,
                "portValue": L4_OUTBOUND_PORT,
                "networkNamespaceFilepath": netns,
            }
        },
        "transparent": True,
        "listenerFilters": [
            {
                "name": UDP_PROXY_FILTER,
                "typedConfig": {
                    "@type": UDP_PROXY_CONFIG,
                    "statPrefix": stat_prefix,
                    "idleTimeout": seconds(options.udp_session_idle_s if idle_s is None else idle_s),
                    "matcher": match,
                },
            }
        ],
    }
    downstream: ResourceDict = {"maxRxDatagramSize": options.udp_max_rx_datagram_size}
    if options.udp_prefer_gro:
        downstream["preferGro"] = True
    udp_config: ResourceDict = {"downstreamSocketConfig": downstream}
    if options.udp_gso_writer:
        # opt-in (see the module docstring): replies read in one pass leave in one sendmsg (UDP_SEGMENT), but
        # any reply over 1,452 bytes is dropped
        udp_config["udpPacketPacketWriterConfig"] = {"name": GSO_WRITER, "typedConfig": {"@type": GSO_WRITER_CONFIG}}
    listener["udpListenerConfig"] = udp_config
    if ":" in address:
        listener["socketOptions"] = list(_FRAGMENT_V6)
    upstream: ResourceDict = {"maxRxDatagramSize": options.udp_max_rx_datagram_size}
    if options.udp_upstream_prefer_gro is not None:
        upstream["preferGro"] = options.udp_upstream_prefer_gro
    proxy: ResourceDict = listener["listenerFilters"][0]["typedConfig"]
    proxy["upstreamSocketConfig"] = upstream
    if options.udp_preserve_source:
        proxy["useOriginalSrcIp"] = True  # the replies come back through aether.netns.node_return
    return listener


@lru(maxsize=64)
def blackhole_cluster(options: TranslateOptions) -> ResourceDict:
    return {
        "name": BLACKHOLE_CLUSTER,
        "type": "STATIC",
        "connectTimeout": seconds(options.cluster_connect_timeout_s),
        "loadAssignment": {"clusterName": BLACKHOLE_CLUSTER},
    }


MEMO = register(DigestMemo())
# per node, the matchers and capture listeners its last translation served, for the digest's matcher key (the tag:
# every listener carries the whole matcher, so a new key is new listeners); keyed by what else shapes them
LISTENERS: LiveMemo[tuple[object, ...], ResourceDict] = register(LiveMemo())


def _listeners(
    built: LiveBuild[tuple[object, ...], ResourceDict],
    node: MeshNode,
    records: Mapping[str, PodRecord],
    options: TranslateOptions,
    key: Arms,
    timed: list[tuple[str, str, float]],
) -> dict[str, ResourceDict]:
    """Each local pod's capture listeners: the wildcard one, its IPv6 twin when a VIP is IPv6, one per timed VIP."""
    listeners: dict[str, ResourceDict] = {}
    has_ipv6 = families(key)[1]
    match = built.get(("matcher",), matcher, key)  # one object for every pod: encoded once (codec.fastfill)
    for pod, record in local_pods(node, records):
        name = listener_name(pod.namespace, pod.name)
        stat = stat_name(f"udp_capture_{pod.namespace}_{pod.name}")
        listeners[name] = built.get(
            (name, record.netns, stat, options), capture_listener, name, record.netns, match, options, stat
        )
        if has_ipv6:
            # IPv6 VIPs: the same matcher on an IPv6-only socket on [::]:18082 (two sockets, not one dual-stack
            # one: the IPv4 listener stays exactly as it was, and each socket reads its own family's PKTINFO)
            name6 = listener6_name(pod.namespace, pod.name)
            stat6 = stat_name(f"udp_capture6_{pod.namespace}_{pod.name}")
            args6 = (name6, record.netns, match, options, stat6, "::")
            listeners[name6] = built.get((name6, record.netns, stat6, options), capture_listener, *args6)
        for vip, cluster, idle in timed:
            # the Service's own idle timeout: a listener bound to its VIP in the same pod netns. The kernel
            # delivers a datagram to the most specific bound socket, so this VIP's flows land here and every
            # other VIP's on the wildcard listener (docs/operations.md)
            vname = vip_listener_name(pod.namespace, pod.name, vip)
            vstat = stat_name(f"udp_capture_{pod.namespace}_{pod.name}_{vip}")
            vmatch = built.get(("matcher", vip, cluster), matcher, ((vip, cluster),))
            vargs = (vname, record.netns, vmatch, options, vstat, vip, idle)
            listeners[vname] = built.get((vname, record.netns, vstat, options, cluster, idle), capture_listener, *vargs)
    return listeners


def build(node: MeshNode, records: Mapping[str, PodRecord], options: TranslateOptions) -> Resources:
    """The UDP builder (contract in aether.xds.resources). Incremental: diffs the arms against the node's last
    translation (`aether.xds.translate.l4.memo`), so one changed service costs what it changed plus one read of the arms."""
    shape = ClusterShape(options.cluster_connect_timeout_s, options.udp_max_sessions)
    dig = MEMO.digest(node.metadata.name, "udp", node.status.udp.services, BLACKHOLE_CLUSTER, shape)
    key = dig.key
    # the few arms that need more than the digest: a weighted split or a Service's own idle timeout (one pass)
    special = [a for a in node.status.udp.services if a.backends or a.idle_timeout_seconds is not None]
    timed = sorted({(a.vip, a.cluster, a.idle_timeout_seconds or 0.0) for a in special if a.idle_timeout_seconds})
    with LISTENERS.build(node.metadata.name, tag=key) as built:
        listeners = _listeners(built, node, records, options, key, timed)
    clusters: dict[str, ResourceDict] = {BLACKHOLE_CLUSTER: blackhole_cluster(options)}
    clusters.update(dig.clusters)  # arm order: deterministic for one input
    assignments = dict(dig.assignments)
    if special:
        split_clusters, split_assignments = split_resources(special, shape, node.metadata.name)
        clusters.update(split_clusters)  # the weighted arms' own clusters replace the plain EDS shape
        assignments.update(split_assignments)
    return {LISTENER: listeners, CLUSTER: clusters, ENDPOINT: assignments}
