"""`aether demo --ip-family ipv4|ipv6|dual`: which families the demo can show, and its dual-stack rows.

ipv4 (the default) is the demo as it always was. dual starts the real control plane with both service CIDRs, gives
every pod an IPv6 ULA beside its IPv4 address (the netns lab's `ip6`; podIPs of both families in the API) and every
UDP Service an IPv6 ClusterIP beside its IPv4 one, and shows per-service selection and the route re-point on the
IPv6 VIPs as well (the east-west sections stay on IPv4). ipv6 starts the control plane with the IPv6 service CIDR
alone and gives pods and Services IPv6 addresses only: every section, east-west included, runs over IPv6."""

from __future__ import annotations

from collections.abc import Mapping

from aether.api.naming import in_family
from aether.e2e.demo_report import Row
from aether.e2e.harness import Mesh, MeshPod
from aether.e2e.node_proxy import MeshNodeProxy
from aether.testing.apiserver import Kind
from aether.testing.controlplane.families import IP_FAMILIES, IpFamily
from aether.testing.probe import wait_answer, who_answers

__all__ = [
    "IP_FAMILIES",
    "capture_listeners",
    "directly",
    "family_problem",
    "ipv6_rows",
    "primary_cluster",
    "wait_ipv6",
]


def family_problem(family: IpFamily, control_plane: Kind) -> str | None:
    """Why the demo cannot run on `family` here, or None."""
    if family != "ipv4" and control_plane != "real":
        return f"--ip-family {family} needs the real control plane (the API test bed allocates no IPv6 ClusterIP)"
    return None


def primary_cluster(mesh: Mesh, cluster: str) -> str:
    """The cluster of `cluster`'s arm on the mesh's primary VIPs (`mesh.services`): IPv6's on an IPv6-only mesh."""
    return in_family(cluster, "IPv6" if mesh.ip_family == "ipv6" else "IPv4")


def capture_listeners(family: IpFamily) -> str:
    """Section 1's words for the client's capture listeners: one per family the pod has (xds/translate/l4/udp.py)."""
    return {"ipv4": "0.0.0.0:18082", "dual": "0.0.0.0:18082 (and [::]:18082)", "ipv6": "[::]:18082"}[family]


def directly(ip: str, port: int) -> str:
    """Section 7's words for a call to a pod's address around the mesh."""
    return f"[{ip}]:{port} directly" if ":" in ip else f"{ip}:{port} directly"


def wait_ipv6(mesh: Mesh, node: MeshNodeProxy, client: MeshPod, namespace: str, backends: Mapping[str, str]) -> str:
    """Until the node's MeshNode has each Service's IPv6 arm and each IPv6 VIP answers with its backend (30 s
    each at most); -> what happened, in words (the selection table shows each answer)."""
    mesh.wait_arms(node, {mesh.services6[s]: in_family(f"udp:{namespace}/{s}", "IPv6") for s in backends})
    silent = [
        f"{s} ({mesh.services6[s]})"
        for s, backend in backends.items()
        if wait_answer(client.netns_path, mesh.services6[s], backend).backend != backend
    ]
    if silent:
        return f"dual-stack: no answer on the IPv6 VIP of {', '.join(silent)}"
    return f"dual-stack: each Service also answers on its IPv6 VIP ({', '.join(mesh.services6.values())})"


def ipv6_rows(mesh: Mesh, client: MeshPod, namespace: str, expect: Mapping[str, str]) -> list[Row]:
    """The selection table's rows on the Services' IPv6 VIPs (none on an IPv4 mesh)."""
    return [
        Row(f"{namespace}/{client.name}", f"{namespace}/{s}", who_answers(client.netns_path, mesh.services6[s]), b)
        for s, b in expect.items()
        if s in mesh.services6
    ]
