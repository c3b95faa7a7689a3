"""The operator from its image on the real control plane (kube-apiserver 1.35.4), configured in-cluster exactly as a
kubelet configures the Deployment's pod: `deploy/` applied with `kubectl apply --server-side -k`, the Deployment's
image, command, arguments, user, environment and securityContext (read-only root, no capabilities) as the manifest
says; a TokenRequest token of the `aether-operator` ServiceAccount bound to the Pod the Deployment's ReplicaSet
would create, the cluster CA and the namespace mounted at /var/run/secrets/kubernetes.io/serviceaccount;
KUBERNETES_SERVICE_HOST/PORT naming the API server. No kubeconfig: the operator (kopf's login and our own client)
finds its credentials where every client library looks. It runs in the host network namespace (podman
`--network host`; its metrics and liveness ports moved to free loopback ports, since the host's are shared).

It converges a UDPRoute's status and a MeshServiceSlice under exactly `deploy/rbac/operator.yaml`; with one verb
taken out of the role it does not, and the server's audit log shows the refused request (the negative control).
Needs the images (`make images`): a skip without them, a failure under AETHER_REQUIRE_IMAGES=1."""

from __future__ import annotations

import contextlib
import dataclasses
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from aether.testing import controlplane, images
from aether.testing.apiserver import Kind
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster
from aether.testing.controlplane.binaries import repository_root
from aether.testing.controlplane.cluster import free_port
from aether.testing.controlplane.deployed import (
    NS,
    a_route,
    converged,
    denied,
    kustomize,
    pod_from_template,
    role_without,
)
from aether.testing.controlplane.identities import token, token_kubeconfig
from aether.testing.wait import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cp(api_kind: Kind) -> Iterator[controlplane.ControlPlane]:
    if api_kind != "real":
        pytest.skip("AETHER_CONTROL_PLANE=emulated: RBAC is the real server's")
    images.needed()
    plane = controlplane.start()
    try:
        cp_apply_deploy(plane)
        yield plane
    finally:
        plane.stop()


def cp_apply_deploy(plane: controlplane.ControlPlane) -> None:
    plane.kubectl("apply", "--server-side", "-f", str(repository_root() / "deploy" / "namespace.yaml"))
    out = kustomize(plane)
    assert out.returncode == 0, out.stderr


def manifest_container() -> tuple[dict[str, Any], dict[str, Any]]:
    """The operator Deployment's pod securityContext and its one container, as deploy/ ships them."""
    deployment = yaml.safe_load((repository_root() / "deploy" / "operator" / "deployment.yaml").read_text())
    spec = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["operator"]
    return spec["securityContext"], spec["containers"][0]


@dataclasses.dataclass(frozen=True)
class Running:
    name: str  # the container's
    liveness: str  # its /healthz URL
    account: Path  # the host directory mounted as its ServiceAccount volume
    pod: tuple[str, str]  # (name, uid) of the Pod its token is bound to


@contextlib.contextmanager
def operator_from_its_image(cp: controlplane.ControlPlane, tmp_path: Path) -> Iterator[Running]:
    """The Deployment's container started from its image with in-cluster configuration."""
    pod_security, container = manifest_container()
    assert container["image"] == images.names()["operator"], "the manifest names the image make images builds"
    metrics, liveness = free_port(), free_port()
    args = list(container["args"])
    args[args.index("--metrics") + 1] = f"127.0.0.1:{metrics}"
    args[args.index("--liveness") + 1] = f"127.0.0.1:{liveness}"
    url = urllib.parse.urlsplit(cp.url)
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    env |= {"KUBERNETES_SERVICE_HOST": str(url.hostname), "KUBERNETES_SERVICE_PORT": str(url.port)}
    pod = pod_from_template(cp, "deployment", "aether-operator")
    account = images.service_account_files(
        tmp_path / "serviceaccount", token(cp, NS, "aether-operator", pod), cp.ca_path, NS
    )
    user = f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}"
    assert container["securityContext"]["readOnlyRootFilesystem"] and container["securityContext"]["capabilities"] == {
        "drop": ["ALL"]
    }
    with images.pod_container(container["image"], [*container["command"], *args], env, account, user) as name:
        yield Running(name, f"http://127.0.0.1:{liveness}/healthz", account, pod)


def live(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return bool(answer.status == 200)


@pytest.mark.parametrize("missing", [None, ("patch", "udproutes/status")], ids=["full-role", "role-minus-a-verb"])
def test_the_operator_image_converges_in_cluster_under_its_rbac_only(
    cp: controlplane.ControlPlane, tmp_path: Path, missing: tuple[str, str] | None
) -> None:
    admin = Cluster(str(cp.kubeconfig_path), None)
    with contextlib.ExitStack() as stack:
        if missing is not None:
            stack.enter_context(role_without(cp, *missing))
        running = stack.enter_context(operator_from_its_image(cp, tmp_path))
        name, liveness = running.name, running.liveness
        ns, node = a_route(admin)
        if missing is None:
            wait_for(
                lambda: converged(admin, ns, node),
                timeout=90,
                what="convergence of the operator image under deploy/rbac/operator.yaml",
                ignore=READ_ERRORS,
                diagnose=lambda: images.logs(name)[-3000:],
            )
            assert wait_for(lambda: live(liveness), timeout=30, what="the liveness endpoint", ignore=(OSError,))
            return
        with pytest.raises(TimeoutError):
            wait_for(
                lambda: converged(admin, ns, node), timeout=20, what="convergence without the verb", ignore=READ_ERRORS
            )
        assert "aether" in images.logs(name), "the container never ran the operator"
    assert denied(cp, "udproutes", "status"), (
        "the missing verb was never asked for: the negative control proves nothing"
    )


def refused(cp: controlplane.ControlPlane, tmp_path: Path, bearer: str) -> bool:
    """Whether the server refuses `bearer` (401): a token bound to a Pod that is gone."""
    kubeconfig = token_kubeconfig(cp, tmp_path / "old-token.kubeconfig", bearer)
    out = cp.kubectl("--kubeconfig", str(kubeconfig), "auth", "whoami", check=False)
    return out.returncode != 0 and "Unauthorized" in out.stderr


def test_the_operator_image_follows_a_rotated_token(cp: controlplane.ControlPlane, tmp_path: Path) -> None:
    """A kubelet rewrites the projected token (before it expires, or for a new Pod) in place, atomically; the old one
    stops working (here: its Pod deleted). The operator keeps converging: its own client re-reads the token file
    (the kubernetes client's in-cluster refresh, once a minute) and kopf logs in again on a 401."""
    admin = Cluster(str(cp.kubeconfig_path), None)
    with operator_from_its_image(cp, tmp_path) as running:
        ns, node = a_route(admin)
        wait_for(lambda: converged(admin, ns, node), timeout=90, what="convergence", ignore=READ_ERRORS)
        old = (running.account / "token").read_text()
        successor = pod_from_template(cp, "deployment", "aether-operator")
        images.rotate_token(running.account, token(cp, NS, "aether-operator", successor))
        cp.kubectl("delete", "pod", running.pod[0], "-n", NS, "--wait=true")
        wait_for(lambda: refused(cp, tmp_path, old), timeout=30, what="the old token refused")
        ns, node = a_route(admin)
        wait_for(
            lambda: converged(admin, ns, node),
            timeout=150,
            what="convergence of a new route after the token rotated",
            ignore=READ_ERRORS,
            diagnose=lambda: images.logs(running.name)[-3000:],
        )
