"""Sample desired states for tests, benchmarks and the demo: MeshNodes with N UDP services and their records."""

from __future__ import annotations

from typing import Any

from aether.api.meshnode import Endpoint, MeshNode, MeshPod, ServiceArm
from aether.netns.records import PodRecord


def vip(i: int) -> str:
    return f"10.96.{i // 250}.{i % 250 + 1}"


def udp_arm(i: int, endpoint_ip: str | None = None, port: int = 5353, namespace: str = "default") -> ServiceArm:
    return ServiceArm(
        service=f"{namespace}/svc-{i}",
        vip=vip(i),
        cluster=f"udp:{namespace}/svc-{i}",
        backend=f"{namespace}/svc-{i}",
        endpoints=[Endpoint(ip=endpoint_ip or f"10.200.{i // 250}.{i % 250 + 1}", port=port)],
    )


def node_with(n_services: int, n_pods: int = 2, name: str = "node-a") -> MeshNode:
    """A MeshNode with `n_services` UDP services (one endpoint each) and `n_pods` local pods."""
    node = MeshNode.model_validate({"metadata": {"name": name}})
    node.status.pods = [MeshPod(uid=f"u{i}", namespace="default", name=f"client-{i}") for i in range(n_pods)]
    node.status.udp.services = [udp_arm(i) for i in range(n_services)]
    return node


def as_slices(node: MeshNode, count: int = 2, namespace: str = "default") -> dict[str, Any]:
    """`node` as the operator stores it: a `kind: List` (what `kubectl get mn,mss -o yaml` prints) of the MeshNode,
    its UDP arms moved into `count` MeshServiceSlices of `namespace` (by the operator's hash) that it names."""
    from aether.api.slices import slice_index, slice_name

    parts: list[list[dict[str, Any]]] = [[] for _ in range(count)]
    for arm in node.status.udp.services:
        parts[slice_index(arm.service.split("/", 1)[1], count)].append(arm.wire())
    names = [slice_name(namespace, k) for k in range(count)]
    bare = node.wire()
    bare["status"]["udp"]["services"] = []
    bare["status"]["serviceSlices"] = {"selector": "x", "namespaces": [namespace], "names": names}
    slices = [
        {
            "apiVersion": "mesh.aether.dev/v1alpha1",
            "kind": "MeshServiceSlice",
            "metadata": {"name": name},
            "spec": {
                "namespace": namespace,
                "index": k,
                "count": count,
                "services": len(arms),
                "udp": {"services": arms},
            },
        }
        for k, (name, arms) in enumerate(zip(names, parts, strict=True))
    ]
    return {"apiVersion": "v1", "kind": "List", "items": [bare, *slices]}


def records_for(node: MeshNode, netns_prefix: str = "/run/netns/test") -> dict[str, PodRecord]:
    """A record per pod, netns path `<prefix>-<pod name>`."""
    return {
        p.uid: PodRecord(uid=p.uid, namespace=p.namespace, name=p.name, netns=f"{netns_prefix}-{p.name}")
        for p in node.status.pods
    }


QUIC_DOWNSTREAM = "type.googleapis.com/envoy.extensions.transport_sockets.quic.v3.QuicDownstreamTransport"


def quic_listener(**quic: object) -> dict[str, object]:
    """A hand-written inbound QUIC listener with `quic` set on its QuicDownstreamTransport (codec tests)."""
    return {
        "name": "q",
        "filterChains": [
            {
                "transportSocket": {
                    "name": "envoy.transport_sockets.quic",
                    "typedConfig": {"@type": QUIC_DOWNSTREAM, "downstreamTlsContext": {}, **quic},
                }
            }
        ],
    }
