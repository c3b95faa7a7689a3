"""deploy/ on the real control plane (kube-apiserver 1.35.4): the kustomize tree is accepted by the server's own
validation, the operator converges under exactly `deploy/rbac/operator.yaml` (a token of its ServiceAccount from the
TokenRequest API), a verb taken out of that role makes convergence fail (the negative control), and the node
ValidatingAdmissionPolicy is enforced by the server on a sidecar whose token is bound to a Pod on its node: its own
fields of its own MeshNode pass, another node's MeshNode and an operator-owned field are refused with the policy's
message, and the cross-node write is accepted once the policy's binding is gone (the negative control)."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from aether.api.meshnode import API_GROUP, API_VERSION, PLURAL, Condition
from aether.testing import controlplane
from aether.testing.apiserver import Kind
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, operator_subprocess, unique
from aether.testing.controlplane.binaries import repository_root
from aether.testing.controlplane.deployed import NS, a_route, converged, denied, kustomize, role_without
from aether.testing.controlplane.identities import token, token_kubeconfig
from aether.testing.wait import wait_for
from aether.xds.sidecar.kube_source import KubeStatusSink

EVIL_POD = {"uid": "u-1", "namespace": "evil", "name": "p", "ip": "10.77.9.10", "serviceAccount": "x"}


@pytest.fixture(scope="module")
def cp(api_kind: Kind) -> Iterator[controlplane.ControlPlane]:
    if api_kind != "real":
        pytest.skip("AETHER_CONTROL_PLANE=emulated: RBAC and admission are the real server's")
    plane = controlplane.start()
    try:
        yield plane
    finally:
        plane.stop()


def test_the_kustomize_tree_is_accepted_by_the_server(cp: controlplane.ControlPlane) -> None:
    dry = kustomize(cp, "--dry-run=server")  # on a new cluster: nothing namespaced can be checked before its
    assert dry.returncode != 0 and 'namespaces "aether-system" not found' in dry.stderr  # namespace exists
    cp.kubectl("apply", "--server-side", "-f", str(repository_root() / "deploy" / "namespace.yaml"))
    dry = kustomize(cp, "--dry-run=server")
    assert dry.returncode == 0, dry.stderr
    out = kustomize(cp)
    assert out.returncode == 0, out.stderr
    applied = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    assert "deployment.apps/aether-operator" in applied and "daemonset.apps/aether-node" in applied, applied
    policy = json.loads(cp.kubectl("get", "validatingadmissionpolicy", "aether-node-own-meshnode", "-o", "json").stdout)
    assert (policy.get("status") or {}).get("typeChecking", {}).get("expressionWarnings") in (None, []), policy


@pytest.mark.parametrize("missing", [None, ("patch", "udproutes/status")], ids=["full-role", "role-minus-a-verb"])
def test_the_operator_converges_under_its_own_rbac_only(
    cp: controlplane.ControlPlane, tmp_path: Path, missing: tuple[str, str] | None
) -> None:
    assert kustomize(cp).returncode == 0
    admin = Cluster(str(cp.kubeconfig_path), None)
    kubeconfig = token_kubeconfig(cp, tmp_path / "operator.kubeconfig", token(cp, NS, "aether-operator"))
    with contextlib.ExitStack() as stack:
        if missing is not None:
            stack.enter_context(role_without(cp, *missing))
        proc = stack.enter_context(operator_subprocess(str(kubeconfig)))
        ns, node = a_route(admin)
        if missing is None:
            wait_for(
                lambda: converged(admin, ns, node),
                timeout=60,
                what="convergence under deploy/rbac/operator.yaml",
                ignore=READ_ERRORS,
            )
            return
        with pytest.raises(TimeoutError):
            wait_for(
                lambda: converged(admin, ns, node), timeout=15, what="convergence without the verb", ignore=READ_ERRORS
            )
        assert proc.poll() is None or proc.returncode is not None
    assert denied(cp, "udproutes", "status"), (
        "the missing verb was never asked for: the negative control proves nothing"
    )


def sidecar_token(cp: controlplane.ControlPlane, admin: Cluster, node: str) -> str:
    """The token of an aether-node pod on `node` (its kubelet here is the test: the Pod is created bound)."""
    pod = unique("aether-node")
    body = o.pod(NS, pod, node, "aether-node")
    admin.apply(body, status=o.pod_status("10.77.9.9"))
    uid = (admin.get("v1", "Pod", pod, NS) or {})["metadata"]["uid"]
    return token(cp, NS, "aether-node", (pod, uid))


def status_patch(kubeconfig: Path, node: str, status: dict[str, Any]) -> None:
    sink = KubeStatusSink(node, str(kubeconfig))
    sink.api.patch_cluster_custom_object_status(
        API_GROUP, API_VERSION, PLURAL, node, {"status": status}, _content_type="application/merge-patch+json"
    )


def test_the_node_admission_policy_is_enforced_by_the_server(cp: controlplane.ControlPlane, tmp_path: Path) -> None:
    assert kustomize(cp).returncode == 0
    admin = Cluster(str(cp.kubeconfig_path), None)
    op_config = token_kubeconfig(cp, tmp_path / "operator.kubeconfig", token(cp, NS, "aether-operator"))
    mine, other = unique("node-a"), unique("node-b")
    with operator_subprocess(str(op_config)):
        for n in (mine, other):
            admin.apply(o.node(n))
        for n in (mine, other):
            wait_for(functools.partial(has_status, admin, n), timeout=60, what=f"MeshNode {n}")
    kubeconfig = token_kubeconfig(cp, tmp_path / "node.kubeconfig", sidecar_token(cp, admin, mine))
    sink = KubeStatusSink(mine, str(kubeconfig))
    sink.publish(mine, [Condition(type="Programmed", status="True", reason="Accepted")])
    sink.publish_pairs(mine, [], [])
    assert "Programmed" in {c["type"] for c in (admin.meshnode(mine) or {})["status"]["conditions"]}
    refusals: dict[str, tuple[str, dict[str, Any], str]] = {
        "another node's MeshNode": (other, {"quic": {"pairs": [], "pairCount": 0}}, f"may write only MeshNode {mine}"),
        "an operator-owned field": (mine, {"pods": [EVIL_POD]}, "may not change operator-owned"),
    }
    for what, (target, status, message) in refusals.items():
        with pytest.raises(ApiException) as refused:
            status_patch(kubeconfig, target, status)
        assert refused.value.status in (403, 422) and message in str(refused.value.body), (what, refused.value.body)
    # the negative control: without the policy's binding the server lets the cross-node write through
    cp.kubectl("delete", "validatingadmissionpolicybinding", "aether-node-own-meshnode")
    try:
        wait_for(lambda: _accepted(kubeconfig, other), timeout=30, what="the cross-node write without the binding")
    finally:
        assert kustomize(cp).returncode == 0


def has_status(k: Cluster, node: str) -> bool:
    return bool((k.meshnode(node) or {}).get("status"))


def _accepted(kubeconfig: Path, node: str) -> bool:
    try:
        status_patch(kubeconfig, node, {"quic": {"pairs": [], "pairCount": 0}})
    except ApiException:
        return False
    return True
