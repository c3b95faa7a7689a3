"""Pieces the L4 builders (UDP and the raw TCP floor) share: local pods, EDS clusters, load assignments."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from aether.netns.records import PodRecord
from aether.operator.meshnode import MeshNode, MeshPod, ServiceArm
from aether.xds.resources import ResourceDict, TranslateOptions


def local_pods(node: MeshNode, records: Mapping[str, PodRecord]) -> list[tuple[MeshPod, PodRecord]]:
    """Pods the MeshNode lists AND the CNI has a record for (both are needed to bind listeners), sorted."""
    out = [(pod, records[pod.uid]) for pod in node.status.pods if pod.uid in records]
    return sorted(out, key=lambda pr: (pr[0].namespace, pr[0].name, pr[0].uid))


def seconds(value: float) -> str:
    """proto3-JSON Duration."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return f"{text}s"


def eds_cluster(name: str, options: TranslateOptions) -> ResourceDict:
    """An EDS cluster whose load assignment has its own EDS name (the cluster name)."""
    return {
        "name": name,
        "type": "EDS",
        "edsClusterConfig": {"edsConfig": {"ads": {}, "resourceApiVersion": "V3"}, "serviceName": name},
        "connectTimeout": seconds(options.cluster_connect_timeout_s),
    }


def load_assignment(name: str, arms: Iterable[ServiceArm]) -> ResourceDict:
    endpoints = sorted({(ep.ip, ep.port) for arm in arms for ep in arm.endpoints})
    cla: ResourceDict = {"clusterName": name}
    if endpoints:
        cla["endpoints"] = [
            {
                "lbEndpoints": [
                    {"endpoint": {"address": {"socketAddress": {"address": ip, "portValue": port}}}}
                    for ip, port in endpoints
                ]
            }
        ]
    return cla


def arms_by_cluster(arms: Iterable[ServiceArm], skip: str) -> dict[str, list[ServiceArm]]:
    """Arms grouped by the cluster they name (several VIPs may name one backend's cluster)."""
    out: dict[str, list[ServiceArm]] = {}
    for arm in arms:
        if arm.cluster != skip:
            out.setdefault(arm.cluster, []).append(arm)
    return out


def sorted_arms(arms: Iterable[ServiceArm]) -> list[ServiceArm]:
    return sorted(arms, key=lambda a: (a.vip, a.service))


def stat_name(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in text)
