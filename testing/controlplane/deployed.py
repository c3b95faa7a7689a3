"""deploy/ on the test control plane, for the tests that run the operator under its own RBAC (as a host process or
from its image): the kustomize tree applied, a UDPRoute world to converge, what converged means, and the operator's
ClusterRole with one verb taken out (the negative control)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator

from aether.operator.routestatus import CONTROLLER_NAME
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import Cluster, unique
from aether.testing.controlplane.binaries import repository_root
from aether.testing.controlplane.cluster import ControlPlane

NS = "aether-system"  # deploy/'s namespace
UDP = [("dns", 53, "UDP")]
SLICE_PORTS = [("dns", 5353, "UDP")]


def kustomize(cp: ControlPlane, *extra: str) -> subprocess.CompletedProcess[str]:
    """`kubectl apply --server-side -k deploy/` (with `extra`, e.g. --dry-run=server), not checked."""
    deploy = str(repository_root() / "deploy")
    return cp.kubectl("apply", "--server-side", "--force-conflicts", "-k", deploy, *extra, check=False)


def a_route(k: Cluster) -> tuple[str, str]:
    """A namespace with a client Pod on a new Node and a UDPRoute from Service front to Service back; returns
    (namespace, node)."""
    ns, node = unique("rbac"), unique("rbac-node")
    k.apply(o.namespace(ns))
    k.apply(o.node(node))
    k.apply(o.pod(ns, "client", node, "client"), status=o.pod_status("10.77.0.2"))
    for name, ip in (("front", "10.77.1.1"), ("back", "10.77.1.2")):
        k.apply(o.service(ns, name, None, UDP))
        k.apply(o.endpoint_slice(ns, name, SLICE_PORTS, [(ip, True, None)]))
    k.apply(o.udproute(ns, "r", "front", [o.backend("back", 53)]))
    return ns, node


def converged(k: Cluster, ns: str, node: str) -> bool:
    """a_route's world converged: the route Accepted by our controller, the node's arm for front pointing at back,
    and a MeshServiceSlice written."""
    route = k.route(ns, "r") or {}
    ours = [p for p in (route.get("status") or {}).get("parents") or [] if p.get("controllerName") == CONTROLLER_NAME]
    accepted = any(c["type"] == "Accepted" and c["status"] == "True" for p in ours for c in p["conditions"])
    return accepted and (k.arm(node, f"{ns}/front") or {}).get("cluster") == f"udp:{ns}/back" and bool(k.slices())


@contextlib.contextmanager
def role_without(cp: ControlPlane, verb: str, resource: str) -> Iterator[None]:
    """The operator's ClusterRole with `verb` taken out of the rule naming `resource`, put back after."""
    role = json.loads(cp.kubectl("get", "clusterrole", "aether-operator", "-o", "json").stdout)
    original = json.dumps(role)
    for rule in role["rules"]:
        if resource in rule.get("resources", []) and verb in rule.get("verbs", []):
            rule["verbs"] = [v for v in rule["verbs"] if v != verb]
    role["rules"] = [r for r in role["rules"] if r.get("verbs")]
    role["metadata"] = {"name": "aether-operator"}
    cp.kubectl("replace", "-f", "-", input=json.dumps(role))
    try:
        yield
    finally:
        back = json.loads(original)
        back["metadata"] = {"name": "aether-operator"}
        cp.kubectl("replace", "-f", "-", input=json.dumps(back))


def denied(cp: ControlPlane, resource: str, subresource: str | None = None) -> bool:
    """Whether the audit log holds a 403 for `resource` (`subresource`): the missing verb was asked for."""
    return any(r.code == 403 and r.resource == resource and r.subresource == subresource for r in cp.audit)


def pod_from_template(cp: ControlPlane, kind: str, name: str, node: str | None = None) -> tuple[str, str]:
    """(name, uid) of a Pod made from the applied workload's (`deployment` or `daemonset` `name` in deploy/'s
    namespace) template, as its controller would make it, on `node` when given (a DaemonSet's pods are bound to
    theirs). The test control plane's controller manager runs no workload controllers and no kubelet runs the Pod:
    the test is its kubelet, and a token bound to the Pod is what the kubelet would project into it."""
    workload = json.loads(cp.kubectl("get", kind, name, "-n", NS, "-o", "json").stdout)
    template = workload["spec"]["template"]
    pod_name = f"{name}-{uuid.uuid4().hex[:5]}"
    spec = template["spec"] | ({"nodeName": node} if node is not None else {})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "name": pod_name, "namespace": NS}}
    created = json.loads(cp.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(pod | {"spec": spec})).stdout)
    return pod_name, created["metadata"]["uid"]
