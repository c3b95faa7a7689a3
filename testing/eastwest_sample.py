"""A small, concrete east-west state (one node, local pods, remote destinations) for tests, benchmarks and docs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aether.api.meshnode import MeshNode, parse_meshnode
from aether.api.naming import quic_twin, spiffe_id
from aether.netns.contract import INBOUND_PORT
from aether.netns.records import PodRecord


@dataclass(frozen=True)
class SamplePod:
    uid: str
    name: str
    ip: str
    service_account: str
    netns: str
    namespace: str = "default"


@dataclass(frozen=True)
class SampleDestination:
    service: str  # <ns>/<name>
    service_account: str
    ports: tuple[int, ...]
    endpoint_ips: tuple[str, ...]
    vip: str | None = None


def dialled_pairs(pods: Sequence[SamplePod], dests: Sequence[SampleDestination]) -> list[dict[str, str]]:
    """`status.quic.pairs` as if every local ServiceAccount had dialled every destination (twins for all)."""
    out: dict[str, dict[str, str]] = {}
    for p in pods:
        for d in dests:
            ns, _, svc = d.service.partition("/")
            twin = quic_twin(ns, svc, p.service_account, p.namespace)
            out[twin] = {"source": spiffe_id(p.namespace, p.service_account), "destination": d.service, "twin": twin}
    return [out[t] for t in sorted(out)]


def sample_node(
    name: str, pods: Sequence[SamplePod], dests: Sequence[SampleDestination], dialled: bool = True
) -> tuple[MeshNode, dict[str, PodRecord]]:
    """The node's MeshNode and pod records; `dialled`: its status lists every pair (`dialled_pairs`), so the
    builders make every twin, as on a node whose every source has dialled every destination."""
    status = {
        "pods": [
            {"uid": p.uid, "namespace": p.namespace, "name": p.name, "ip": p.ip, "serviceAccount": p.service_account}
            for p in pods
        ],
        "tcp": {
            "services": [
                {"service": d.service, "vip": d.vip, "cluster": "tcp:" + d.service} for d in dests if d.vip is not None
            ]
        },
        "quic": {
            "destinations": [
                {
                    "service": d.service,
                    "serviceAccount": d.service_account,
                    "ports": list(d.ports),
                    "endpoints": [{"ip": ip, "port": INBOUND_PORT} for ip in d.endpoint_ips],
                }
                for d in dests
            ],
            "pairs": dialled_pairs(pods, dests) if dialled else [],
        },
    }
    node = parse_meshnode({"metadata": {"name": name}, "status": status})
    records = {p.uid: PodRecord(uid=p.uid, namespace=p.namespace, name=p.name, netns=p.netns, ips=[p.ip]) for p in pods}
    return node, records


def two_sources_one_destination(netns_prefix: str = "/run/netns/sample") -> tuple[MeshNode, dict[str, PodRecord]]:
    """Node A: pods `client-0` (SA client) and `other-0` (SA other); destination default/web (SA web-sa)."""
    return sample_node(
        "node-a",
        [
            SamplePod("u-client", "client-0", "10.200.1.2", "client", f"{netns_prefix}-client"),
            SamplePod("u-other", "other-0", "10.200.1.3", "other", f"{netns_prefix}-other"),
        ],
        [SampleDestination("default/web", "web-sa", (8080, 9090), ("10.200.2.7",), vip="10.96.0.20")],
    )
