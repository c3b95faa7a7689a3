"""docs/operations.md's "Install" block is what a user types: each of its commands is run here, as written, against
kube-apiserver 1.35.4 (a control plane started without any CRD, so the block's own commands install them), with the
fixture's kubeconfig and the pinned kubectl first on PATH, in a directory holding a copy of deploy/ (the overlay the
block writes lands there, not in the checkout). The commands that cannot run here are listed in NOT_RUN with the
reason (the doc says the same under the block); a command neither run nor listed fails the test. The block's Helm
sibling ("Install with Helm") is run by test_deploy_helm.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aether.testing import controlplane, images
from aether.testing.apiserver import Kind
from aether.testing.apitestbed.harness import unique
from aether.testing.controlplane import binaries

REPO = binaries.repository_root()
GATEWAY_API_VERSION = (REPO / "crds" / "gateway-api" / "VERSION").read_text().strip()
GATEWAY_API_URL = (
    f"https://github.com/kubernetes-sigs/gateway-api/releases/download/{GATEWAY_API_VERSION}/standard-install.yaml"
)
VERSION = images.names()["operator"].rpartition(":")[2]  # the overlay keeps deploy/'s tags
# command prefix -> why it is not run here
NOT_RUN = {
    "make images": "`make test` runs it (its test-images set-up) before the tests",
    "deploy/image/podman.sh push ": "no container registry is reachable here",
    "kubectl -n aether-system rollout status ": "needs nodes with a kubelet and a container runtime (none here)",
}
NOT_RUN_COUNT = 5  # make images, two pushes, two rollouts: a new command must be run or listed


def install_block(text: str) -> str:
    section = text.split("\n## Install\n", 1)[1].split("\n### Install with Helm\n", 1)[0]
    return section.split("```sh\n", 1)[1].split("```", 1)[0]


def commands(block: str) -> list[str]:
    """The block's shell commands: comment-only and blank lines left out, continued lines joined, a here-document
    kept with the command that reads it."""
    out: list[str] = []
    lines = iter(block.replace("\\\n", " ").splitlines())
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if "<<'" in line:
            marker = line.split("<<'", 1)[1].split("'", 1)[0]
            body = []
            for more in lines:
                body.append(more)
                if more == marker:
                    break
            line = "\n".join([line, *body])
        out.append(line)
    return out


def not_run(command: str) -> str | None:
    return next((why for prefix, why in NOT_RUN.items() if command.startswith(prefix)), None)


def runnable(command: str, namespace: str) -> str:
    """The command as it runs here: the Gateway API release URL replaced by the vendored copy of its channel's
    CRDs (no internet here), `<ns>` by a namespace the test made."""
    if GATEWAY_API_URL in command:
        command = command.replace(GATEWAY_API_URL, str(REPO / "crds" / "gateway-api" / "standard"))
    return command.replace("<ns>", namespace)


def test_the_block_parses_into_commands() -> None:
    """Pure: the parse keeps the here-document whole and every command is either run or listed as not run."""
    found = commands(install_block((REPO / "docs" / "operations.md").read_text()))
    heredoc = [c for c in found if "<<'EOF'" in c]
    assert len(heredoc) == 1 and heredoc[0].endswith("\nEOF") and "resources: [../deploy]" in heredoc[0]
    assert sum(not_run(c) is not None for c in found) == NOT_RUN_COUNT, found
    assert any(GATEWAY_API_URL in c for c in found), f"the block names Gateway API {GATEWAY_API_VERSION}"


@pytest.fixture(scope="module")
def cp(api_kind: Kind) -> Iterator[controlplane.ControlPlane]:
    if api_kind != "real":
        pytest.skip("AETHER_CONTROL_PLANE=emulated: the doc's commands are for a real API server")
    plane = controlplane.start(crds=False)
    try:
        yield plane
    finally:
        plane.stop()


def test_the_documented_install_commands_run(cp: controlplane.ControlPlane, tmp_path: Path) -> None:
    shutil.copytree(REPO / "deploy", tmp_path / "deploy")
    env = dict(os.environ, KUBECONFIG=str(cp.kubeconfig_path), PATH=f"{binaries.bin_dir()}:{os.environ['PATH']}")
    namespace = unique("meshed")
    cp.kubectl("create", "namespace", namespace)
    ran = []
    for command in commands(install_block((REPO / "docs" / "operations.md").read_text())):
        if not_run(command) is not None:
            continue
        line = runnable(command, namespace)
        out = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, f"{line}\n{out.stderr}{out.stdout}"
        ran.append(command.split()[:3])
    assert len(ran) >= 5, ran

    def get(*args: str) -> Any:
        return json.loads(cp.kubectl("get", *args, "-o", "json").stdout)

    route_crd = get("crd", "udproutes.gateway.networking.k8s.io")
    assert [v["name"] for v in route_crd["spec"]["versions"] if v["served"]] == ["v1"]  # the standard channel
    for crd in ("meshnodes", "meshserviceslices", "meshauthorizationpolicies", "meshpeers"):
        get("crd", f"{crd}.mesh.aether.dev")
    pods = {
        "deployment/aether-operator": {f"registry.example/aether-operator:{VERSION}"},
        "daemonset/aether-node": {f"registry.example/aether-node:{VERSION}"},
    }
    for workload, refs in pods.items():
        spec = get(workload, "-n", "aether-system")["spec"]["template"]["spec"]
        containers = [*spec.get("initContainers", []), *spec["containers"]]
        assert {c["image"] for c in containers} == refs, workload
    labels = get("namespace", namespace)["metadata"]["labels"]
    assert labels["mesh.aether.dev/enabled"] == "true"
