"""Lifecycle steps on a running `aether.e2e.harness.Mesh`: restart a node's sidecar, its Envoy or the operator,
delete a pod (the kubelet's CNI DEL and the API object), add a raw TCP floor Service, re-list a Service's endpoints,
and read a node's QUIC pair state as a user would (`kubectl get meshnodes`, the MeshNode status).

Restarts reuse the node's sockets and directories: a restarted sidecar listens on the same unix socket (Envoy
reconnects with its own backoff), a restarted Envoy is a new process (a new generation: it holds nothing).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

from aether.e2e import cni_runtime
from aether.e2e.harness import BACKEND_PORT, HTTP_APP_PORT, Mesh
from aether.e2e.node_proxy import MeshNodeProxy, connected
from aether.netns.contract import INBOUND_ANNOTATION, L4_OUTBOUND_PORT
from aether.testing.wait import wait_for
from aether.xds.sidecar.bootstrap import XDS_CLUSTER

STREAMS = f"cluster.{XDS_CLUSTER}.upstream_rq_total"  # one per ADS stream Envoy opened


@dataclass(frozen=True)
class PairView:
    """One entry of status.quic.pairs / dormantPairs, as `kubectl get mn -o yaml` shows it."""

    source: str
    destination: str
    twin: str
    since: str | None
    evidence: str | None
    last_kind: str | None
    last_time: str | None


def _view(p: dict[str, Any]) -> PairView:
    last = p.get("lastEvidence") or {}
    return PairView(
        p["source"], p["destination"], p["twin"], p.get("since"), p.get("evidence"), last.get("kind"), last.get("time")
    )


def pair_state(mesh: Mesh, node: MeshNodeProxy) -> tuple[dict[str, PairView], dict[str, PairView], dict[str, Any]]:
    """(pairs by twin, dormant pairs by twin, the whole status.quic) of MeshNode `node`."""
    quic = ((mesh.kube.meshnode(node.name) or {}).get("status") or {}).get("quic") or {}
    pairs = {p["twin"]: _view(p) for p in quic.get("pairs") or []}
    dormant = {p["twin"]: _view(p) for p in quic.get("dormantPairs") or []}
    return pairs, dormant, quic


def wait_pairs(mesh: Mesh, node: MeshNodeProxy, pairs: set[str], dormant: set[str], timeout: float = 30.0) -> None:
    """Until status.quic lists exactly these pairs and dormant pairs, with counts that match."""

    def ok() -> bool:
        p, d, quic = pair_state(mesh, node)
        counts = (quic.get("pairCount"), quic.get("dormantPairCount")) == (len(p), len(d))
        return set(p) == pairs and set(d) == dormant and counts

    wait_for(ok, timeout, f"{node.name} pairs {sorted(pairs)} dormant {sorted(dormant)}", diagnose=mesh.diagnostics)


def printer_columns(mesh: Mesh, node: MeshNodeProxy) -> dict[str, str] | None:
    """`kubectl get meshnodes` for `node`: column header -> value (None without kubectl)."""
    out = mesh.kubectl("get", "meshnodes")
    if out is None:
        return None
    lines = out.splitlines()
    header = lines[0]
    # kubectl pads columns with at least 3 spaces; a header may hold one ("QUIC PAIRS")
    starts = [0, *(m.end() for m in re.finditer(r" {2,}", header))]
    names = [header[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
    for line in lines[1:]:
        if line.split()[0] == node.name:
            cells = [line[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
            return dict(zip(names, cells, strict=True))
    return None


def restart_sidecar(mesh: Mesh, node: MeshNodeProxy, timeout: float = 60.0) -> None:
    """Stop the node's sidecar (SIGTERM) and start a new one; wait until Envoy opened a new stream to it."""
    streams = node.stat(STREAMS)
    stop_sidecar(mesh, node)
    start_sidecar(mesh, node, streams, timeout)


def start_sidecar(mesh: Mesh, node: MeshNodeProxy, streams_before: int, timeout: float = 60.0) -> None:
    mesh._start_sidecar(node)
    wait_for(
        lambda: connected(node)() and node.stat(STREAMS) > streams_before,
        timeout,
        f"{node.name} ADS stream to the new sidecar",
        diagnose=node.log_tail,
    )


def stop_sidecar(mesh: Mesh, node: MeshNodeProxy) -> None:
    if node.sidecar is not None:
        mesh.lab.stop(node.sidecar)
        node.sidecar = None


def restart_envoy(mesh: Mesh, node: MeshNodeProxy, timeout: float = 60.0) -> None:
    """A new Envoy process for the node (no hot restart: the new generation holds no subscriptions)."""
    if node.envoy is not None:
        node.envoy.stop()
    mesh._start_envoy(node)
    wait_for(connected(node), timeout, f"{node.name} ADS stream of the new Envoy", diagnose=node.log_tail)


def delete_pod(mesh: Mesh, name: str) -> None:
    """What deleting a pod does: the user's graceful delete marks the API object, the kubelet stops the pod's
    containers and runs CNI DEL (the pod record goes), then removes the object (grace period 0)."""
    pod = mesh.pods.pop(name)
    mesh.kube.pod_deleting(pod.namespace, name)
    for proc in mesh.apps.pop(name, []):
        mesh.lab.stop(proc)
    annotations = ((INBOUND_ANNOTATION, mesh.inbound),) if mesh.inbound else ()
    sandbox = cni_runtime.PodSandbox(
        pod.namespace, name, pod.uid, pod.netns_path, pod.ip, f"ctr-{mesh.tag}-{name}", annotations
    )
    with contextlib.suppress(cni_runtime.CniFailed):
        cni_runtime.delete(sandbox, pod.node.records)
    mesh.kube.pod_gone(pod.namespace, name, pod.uid)


def set_http_endpoints(mesh: Mesh, service: str, backends: list[str]) -> None:
    """The EndpointSlice controller's part for an HTTP Service: ready endpoints are exactly these pods."""
    ready = [(mesh.pods[b].ip, b) for b in backends]
    mesh.kube.endpoint_slice(mesh.namespace, service, HTTP_APP_PORT, ready, "TCP")


def restart_operator(mesh: Mesh) -> None:
    """Stop the operator (SIGTERM: kopf's shutdown) and start a new one on the same API."""
    if mesh.operator is not None:
        mesh.lab.stop(mesh.operator, timeout=15.0)
    mesh.start_operator()


def add_tcp_floor_service(mesh: Mesh, name: str, backends: list[str]) -> str:
    """A TCP Service on the raw TCP floor (18082) with a VIP, its ready endpoints the pods' BACKEND_PORT."""
    vip, _ = next(mesh._vips)  # the TCP floor's IPv4 VIP
    mesh.kube.service(mesh.namespace, name, vip, L4_OUTBOUND_PORT, "TCP")
    mesh.services[name] = vip
    mesh.kube.endpoint_slice(mesh.namespace, name, BACKEND_PORT, [(mesh.pods[b].ip, b) for b in backends], "TCP")
    return vip


def route_condition(mesh: Mesh, name: str, kind: str, timeout: float = 30.0) -> str | None:
    """The status ("True"/"False") of condition `kind` the operator wrote on UDPRoute `name` (waits for it)."""

    def status() -> str | None:
        parents = mesh.kube.udproute_status(mesh.namespace, name).get("parents") or []
        conds = [c for p in parents for c in p.get("conditions") or [] if c["type"] == kind]
        return str(conds[0]["status"]) if conds else None

    with contextlib.suppress(TimeoutError):
        return wait_for(status, timeout, f"UDPRoute {name} condition {kind}")
    return None
