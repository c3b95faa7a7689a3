"""Pieces the L4 builders (UDP and the raw TCP floor) share: local pods, EDS clusters, load assignments.

Builders reuse their resource dicts for the inputs that shape them (`aether.xds.memo.lru` for inputs from a small
set, such as a cluster name; the last translation's own resources for what churns: endpoint sets, pods' listeners),
so an unchanged resource is the *same object* from one translation to the next and the snapshot skips
re-versioning and re-encoding it (bench/xds_translate.py). Resource dicts are therefore shared: treat them as immutable
(copy.deepcopy before editing one, as tests that build bad inputs do).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from aether.api.meshnode import MeshNode, MeshPod, ServiceArm
from aether.netns.records import PodRecord
from aether.xds.memo import lru
from aether.xds.resources import ResourceDict, TranslateOptions, seconds

Arms = tuple[tuple[str, str], ...]  # ((vip, cluster), ...) in matcher order
EndpointKey = tuple[tuple[str, int, bool], ...]  # (ip, port, draining) per endpoint


def local_pods(node: MeshNode, records: Mapping[str, PodRecord]) -> list[tuple[MeshPod, PodRecord]]:
    """Pods the MeshNode lists AND the CNI has a record for (both are needed to bind listeners), sorted."""
    out = [(pod, records[pod.uid]) for pod in node.status.pods if pod.uid in records]
    return sorted(out, key=lambda pr: (pr[0].namespace, pr[0].name, pr[0].uid))


class ClusterShape(NamedTuple):
    """What an L4 EDS cluster carries besides its name (hashable: the constructors below are memoized on it).

    `max_connections`: the DEFAULT-priority circuit breaker. udp_proxy counts every session (one client
    address and port) as an upstream connection, so for UDP this is the number of concurrent flows per
    Service; None leaves Envoy's default (1,024)."""

    connect_timeout_s: float
    max_connections: int | None = None


def eds_cluster(name: str, options: TranslateOptions) -> ResourceDict:
    """An EDS cluster whose load assignment has its own EDS name (the cluster name)."""
    return eds_cluster_for(name, ClusterShape(options.cluster_connect_timeout_s))


@lru(maxsize=1 << 16)
def eds_cluster_for(name: str, shape: ClusterShape) -> ResourceDict:
    cluster: ResourceDict = {
        "name": name,
        "type": "EDS",
        "edsClusterConfig": {"edsConfig": {"ads": {}, "resourceApiVersion": "V3"}, "serviceName": name},
        "connectTimeout": seconds(shape.connect_timeout_s),
    }
    if shape.max_connections is not None:
        # track_remaining: the `remaining_cx` gauge shows how close a Service is to refusing new flows
        cluster["circuitBreakers"] = {
            "thresholds": [{"priority": "DEFAULT", "maxConnections": shape.max_connections, "trackRemaining": True}]
        }
    return cluster


def lb_endpoints(endpoints: EndpointKey) -> list[ResourceDict]:
    """One lbEndpoint per address, in order; a draining one (terminating, still serving) is DRAINING. Envoy excludes
    such a host from load balancing (it counts neither as healthy nor as a host, so many draining hosts do not
    tip the cluster into panic mode): no new session picks it, and a udp_proxy session on it, whose host is now
    unhealthy, moves to a healthy one at its next datagram, while the replies already on their way still come back
    (a host that leaves the cluster ends its sessions at once). An address listed both ways is ready."""
    drains: dict[tuple[str, int], bool] = {}  # first-seen order
    for ip, port, draining in endpoints:
        drains[(ip, port)] = drains.get((ip, port), True) and draining
    out: list[ResourceDict] = []
    for (ip, port), draining in drains.items():
        lb: ResourceDict = {"endpoint": {"address": {"socketAddress": {"address": ip, "portValue": port}}}}
        if draining:
            lb["healthStatus"] = "DRAINING"
        out.append(lb)
    return out


def load_assignment(name: str, endpoints: EndpointKey) -> ResourceDict:
    """Not memoized here: an endpoint set churns (every pod roll makes a new one), so its callers reuse the last
    translation's assignment instead (`aether.xds.translate.l4.memo`, the TCP builder's `LiveMemo`)."""
    cla: ResourceDict = {"clusterName": name}
    if endpoints:
        cla["endpoints"] = [{"lbEndpoints": lb_endpoints(endpoints)}]
    return cla


def endpoints_by_cluster(arms: Iterable[ServiceArm], skip: str) -> dict[str, EndpointKey]:
    """Each cluster the arms name (several VIPs may name one backend's cluster) -> its sorted unique endpoints."""
    groups: dict[str, set[tuple[str, int, bool]]] = {}
    for arm in arms:
        if arm.cluster != skip:
            group = groups.setdefault(arm.cluster, set())
            for ep in arm.endpoints:
                group.add((ep.ip, ep.port, ep.draining))
    return {name: tuple(eps) if len(eps) < 2 else tuple(sorted(eps)) for name, eps in groups.items()}


def arms_key(arms: Iterable[ServiceArm]) -> Arms:
    """The matcher's content: (vip, cluster) per arm, sorted by VIP then service."""
    return tuple((a.vip, a.cluster) for a in sorted(arms, key=lambda a: (a.vip, a.service)))


def is_ipv6(address: str) -> bool:
    """An IPv6 address (the API writes them RFC 5952 style; an IPv4 address never has a colon)."""
    return ":" in address


def match_key(address: str) -> str:
    """The address as Envoy's `DestinationIPInput` prints a datagram's destination: IPv4 as is, IPv6 in its
    canonical compressed form (RFC 5952, what inet_ntop writes), so `FD00:96:0::A` still matches."""
    return ipaddress.ip_address(address).compressed if is_ipv6(address) else address


def families(arms: Arms) -> tuple[bool, bool]:
    """(any IPv4 VIP, any IPv6 VIP) in the arms: which capture listeners a pod needs."""
    v6 = sum(1 for vip, _cluster in arms if is_ipv6(vip))
    return v6 < len(arms), v6 > 0


def stat_name(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in text)
