"""The node's sidecar from the node image on the real control plane (kube-apiserver 1.35.4), configured in-cluster as a
kubelet configures the DaemonSet's pod on a node: `deploy/` applied server-side; the DaemonSet's xds container (its
image, command and arguments with `$(NODE_NAME)` expanded, its environment, mounts, user and securityContext: read-only
root, no capabilities) run with podman in the host network namespace; a TokenRequest token of `aether-node` bound to
a Pod made from the DaemonSet's template on that node (so the token carries the node's name, as a projected token
does), the cluster CA and the namespace mounted at /var/run/secrets/kubernetes.io/serviceaccount,
KUBERNETES_SERVICE_HOST/PORT the server's. The operator (a host process under its own token) writes the MeshNodes.

The sidecar reads its MeshNode and writes its `Programmed` condition there, which `deploy/rbac/node-admission.yaml`
admits; the same container claiming that node with a token bound to a Pod on another node has its writes refused by
the server with the policy's message (the negative control). Needs the images (`make images`): a skip without them,
a failure under AETHER_REQUIRE_IMAGES=1."""

from __future__ import annotations

import contextlib
import functools
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from aether.testing import controlplane, images
from aether.testing.apiserver import Kind
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, operator_subprocess, unique
from aether.testing.controlplane.binaries import repository_root
from aether.testing.controlplane.cluster import free_port
from aether.testing.controlplane.deployed import NS, kustomize, pod_from_template
from aether.testing.controlplane.identities import token, token_kubeconfig
from aether.testing.wait import wait_for

pytestmark = pytest.mark.slow
POLICY_MESSAGE = "may write only MeshNode"  # deploy/rbac/node-admission.yaml's message for another node's MeshNode


@pytest.fixture(scope="module")
def cp(api_kind: Kind) -> Iterator[controlplane.ControlPlane]:
    if api_kind != "real":
        pytest.skip("AETHER_CONTROL_PLANE=emulated: RBAC and admission are the real server's")
    images.needed()
    plane = controlplane.start()
    try:
        plane.kubectl("apply", "--server-side", "-f", str(repository_root() / "deploy" / "namespace.yaml"))
        out = kustomize(plane)
        assert out.returncode == 0, out.stderr
        yield plane
    finally:
        plane.stop()


def manifest_xds() -> tuple[dict[str, Any], dict[str, Any]]:
    """The node DaemonSet's pod securityContext and its xds container, as deploy/ ships them."""
    daemonset = yaml.safe_load((repository_root() / "deploy" / "node" / "daemonset.yaml").read_text())
    spec = daemonset["spec"]["template"]["spec"]
    return spec["securityContext"], next(c for c in spec["containers"] if c["name"] == "xds")


@contextlib.contextmanager
def sidecar_from_its_image(cp: controlplane.ControlPlane, tmp_path: Path, node: str, token_node: str) -> Iterator[str]:
    """The xds container for `node`, its token bound to a DaemonSet Pod on `token_node`; yields the container name."""
    pod_security, container = manifest_xds()
    assert container["image"] == images.names()["node"], "the manifest names the image make images builds"
    args = [a.replace("$(NODE_NAME)", node) for a in container["args"]]
    args[args.index("--metrics") + 1] = f"127.0.0.1:{free_port()}"  # the host's ports are shared
    url = urllib.parse.urlsplit(cp.url)
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env |= {"NODE_NAME": node, "KUBERNETES_SERVICE_HOST": str(url.hostname), "KUBERNETES_SERVICE_PORT": str(url.port)}
    # the pod's volumes on this host: the socket's emptyDir, the host's /run/aether (pod records, SVIDs); /tmp is
    # podman's tmpfs under a read-only root
    host = {"xds-socket": tmp_path / "xds", "aether-run": tmp_path / "run"}
    for sub in ("xds", "run/pods", "run/certs"):
        (tmp_path / sub).mkdir(parents=True)
    volumes = {
        host[m["name"]]: m["mountPath"] + (":ro" if m.get("readOnly") else "")
        for m in container["volumeMounts"]
        if m["name"] in host
    }
    assert set(volumes.values()) == {"/run/aether-xds", "/run/aether:ro"}, volumes
    pod = pod_from_template(cp, "daemonset", "aether-node", token_node)
    account = images.service_account_files(
        tmp_path / "serviceaccount", token(cp, NS, "aether-node", pod), cp.ca_path, NS
    )
    user = f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}"
    assert container["securityContext"]["readOnlyRootFilesystem"] and container["securityContext"]["capabilities"] == {
        "drop": ["ALL"]
    }
    with images.pod_container(container["image"], [*container["command"], *args], env, account, user, volumes) as name:
        yield name


def programmed(k: Cluster, node: str) -> bool:
    conditions = ((k.meshnode(node) or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Programmed" for c in conditions)


def has_status(k: Cluster, node: str) -> bool:
    return bool((k.meshnode(node) or {}).get("status"))


@pytest.mark.parametrize("token_on", ["its-node", "another-node"])
def test_the_node_image_sidecar_writes_only_its_own_meshnode(
    cp: controlplane.ControlPlane, tmp_path: Path, token_on: str
) -> None:
    admin = Cluster(str(cp.kubeconfig_path), None)
    mine, other = unique("node-a"), unique("node-b")
    op_config = token_kubeconfig(cp, tmp_path / "operator.kubeconfig", token(cp, NS, "aether-operator"))
    with operator_subprocess(str(op_config)):
        for n in (mine, other):
            admin.apply(o.node(n))
        for n in (mine, other):
            wait_for(functools.partial(has_status, admin, n), timeout=60, what=f"MeshNode {n}", ignore=READ_ERRORS)
        token_node = mine if token_on == "its-node" else other
        with sidecar_from_its_image(cp, tmp_path, mine, token_node) as name:
            if token_on == "its-node":
                wait_for(
                    lambda: programmed(admin, mine),
                    timeout=90,
                    what=f"the sidecar's Programmed condition on MeshNode {mine}",
                    ignore=READ_ERRORS,
                    diagnose=lambda: images.logs(name)[-3000:],
                )
                assert POLICY_MESSAGE not in images.logs(name)
                return
            wait_for(
                lambda: POLICY_MESSAGE in images.logs(name),
                timeout=90,
                what="the server refusing the sidecar's write with the policy's message",
                diagnose=lambda: images.logs(name)[-3000:],
            )
            assert not programmed(admin, mine), "a token of another node wrote this node's MeshNode"
