"""Builders for the raw objects tests and the demo apply: namespaces, nodes, pods, Services, EndpointSlices,
UDPRoutes, ReferenceGrants, MeshAuthorizationPolicies, ServiceExports, ServiceImports, MeshPeers. Plain dicts in API
shape, so they work with any client and any cluster."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal

from aether.operator.reconcile.views import EGRESS_ANNOTATION, GATEWAY_GROUP, MESH_LABEL, SERVICE_NAME_LABEL

Obj = dict[str, Any]
Port = tuple[str, int, str]  # (name, port, protocol)


def namespace(name: str, meshed: bool = True, egress: str | None = None) -> Obj:
    meta: Obj = {"name": name, "labels": {MESH_LABEL: "true"} if meshed else {}}
    if egress is not None:
        meta["annotations"] = {EGRESS_ANNOTATION: egress}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def node(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def node_status(*internal_ips: str) -> Obj:
    """What a kubelet reports of its node's addresses: one InternalIP per family (a dual-stack node has two)."""
    return {"status": {"addresses": [{"type": "InternalIP", "address": a} for a in internal_ips]}}


def pod(ns: str, name: str, node_name: str, sa: str = "default") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"nodeName": node_name, "serviceAccountName": sa, "containers": [{"name": "app", "image": "app"}]},
    }


def pod_status(ip: str, phase: str = "Running", ready: bool = True, also: Sequence[str] = ()) -> Obj:
    """What a kubelet reports for a started pod: phase, addresses and the Ready condition (which the EndpointSlice
    controller of a real control plane reads). `also`: the pod's addresses of its other family (a dual-stack pod's
    podIPs list one per family, podIP first)."""
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    ips = [{"ip": a} for a in (ip, *also)]
    return {"status": {"phase": phase, "podIP": ip, "podIPs": ips, "conditions": conditions}}


def service(
    ns: str, name: str, cluster_ip: str | None, ports: Sequence[Port], selector: dict[str, str] | None = None
) -> Obj:
    """A selector-less Service unless `selector` (pod labels); `cluster_ip` None leaves the ClusterIP to the server's
    allocator."""
    spec: Obj = {"ports": [{"name": n, "port": p, "protocol": proto} for n, p, proto in ports]}
    if cluster_ip is not None:
        spec = {"clusterIP": cluster_ip, **spec}
    if selector:
        spec["selector"] = dict(selector)
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns}, "spec": spec}


# an endpoint's state besides ready (True) and not ready (False), as the EndpointSlice controller writes it for a pod
# being deleted: still answering within its grace period, or no longer
SERVING_TERMINATING: Final = "serving-terminating"
TERMINATING: Final = "terminating"
EndpointState = bool | Literal["serving-terminating", "terminating"]


def _conditions(state: EndpointState) -> Obj:
    if state == SERVING_TERMINATING:
        return {"ready": False, "serving": True, "terminating": True}
    if state == TERMINATING:
        return {"ready": False, "serving": False, "terminating": True}
    return {"ready": state}


def endpoint_slice(
    ns: str,
    svc: str,
    ports: Sequence[Port],
    endpoints: Sequence[tuple[str, EndpointState, str | None]],
    name: str | None = None,
) -> Obj:
    """endpoints: (ip, ready or a terminating state, pod name or None)."""
    eps = []
    for ip, state, pod_name in endpoints:
        ep: Obj = {"addresses": [ip], "conditions": _conditions(state)}
        if pod_name:
            ep["targetRef"] = {"kind": "Pod", "name": pod_name, "namespace": ns}
        eps.append(ep)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name or f"{svc}-1", "namespace": ns, "labels": {SERVICE_NAME_LABEL: svc}},
        "addressType": "IPv6" if endpoints and ":" in endpoints[0][0] else "IPv4",  # one family per slice
        "ports": [{"name": n, "port": p, "protocol": proto} for n, p, proto in ports],
        "endpoints": eps,
    }


def backend(name: str, port: int, weight: int | None = None, namespace: str | None = None) -> Obj:
    ref: Obj = {"name": name, "port": port}
    if weight is not None:
        ref["weight"] = weight
    if namespace is not None:
        ref["namespace"] = namespace
    return ref


def udproute(
    ns: str, name: str, parent: str, backends: list[Obj], parent_port: int | None = None, version: str = "v1alpha2"
) -> Obj:
    parent_ref: Obj = {"group": "", "kind": "Service", "name": parent}
    if parent_port is not None:
        parent_ref["port"] = parent_port
    return {
        "apiVersion": f"{GATEWAY_GROUP}/{version}",
        "kind": "UDPRoute",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"parentRefs": [parent_ref], "rules": [{"backendRefs": backends}]},
    }


def reference_grant(ns: str, name: str, from_namespace: str, service: str | None = None) -> Obj:
    to: Obj = {"group": "", "kind": "Service"}
    if service is not None:
        to["name"] = service
    return {
        "apiVersion": f"{GATEWAY_GROUP}/v1beta1",
        "kind": "ReferenceGrant",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"from": [{"group": GATEWAY_GROUP, "kind": "UDPRoute", "namespace": from_namespace}], "to": [to]},
    }


def authorization_policy(ns: str, name: str, targets: Sequence[str], rules: Sequence[Obj] | None = None) -> Obj:
    """A MeshAuthorizationPolicy: `targets` Service names of `ns`, `rules` as `[{"from": [...], "ports": [...]}]`."""
    spec: Obj = {"targetRefs": [{"kind": "Service", "name": t} for t in targets]}
    if rules is not None:
        spec["rules"] = list(rules)
    return {
        "apiVersion": "mesh.aether.dev/v1alpha1",
        "kind": "MeshAuthorizationPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


MCS: Final = "multicluster.x-k8s.io/v1beta1"


def service_export(ns: str, name: str) -> Obj:
    """A ServiceExport (KEP-1645): exports the Service of the same namespace and name."""
    return {"apiVersion": MCS, "kind": "ServiceExport", "metadata": {"name": name, "namespace": ns}}


def service_import(
    ns: str,
    name: str,
    ports: Sequence[Port],
    peer: str | None,
    service_account: str | None,
    type_: str = "ClusterSetIP",
) -> Obj:
    """A ServiceImport as a user (or automation) applies it in the importing cluster: upstream's spec, our two
    annotations naming the MeshPeer and the exported Service's ServiceAccount (docs/architecture.md)."""
    notes = (("mesh.aether.dev/peer", peer), ("mesh.aether.dev/service-account", service_account))
    meta: Obj = {"name": name, "namespace": ns, "annotations": {k: v for k, v in notes if v is not None}}
    spec = {"type": type_, "ports": [{"name": n, "port": p, "protocol": proto} for n, p, proto in ports]}
    return {"apiVersion": MCS, "kind": "ServiceImport", "metadata": meta, "spec": spec}


def mesh_peer(
    name: str, gateways: Sequence[str], trust_domain: str | None = None, transports: Sequence[str] | None = None
) -> Obj:
    """`transports`: spec.transports (what the gateways offer; None leaves it out: both)."""
    spec: Obj = {"gateways": list(gateways)}
    if trust_domain is not None:
        spec["trustDomain"] = trust_domain
    if transports is not None:
        spec["transports"] = list(transports)
    return {"apiVersion": "mesh.aether.dev/v1alpha1", "kind": "MeshPeer", "metadata": {"name": name}, "spec": spec}
