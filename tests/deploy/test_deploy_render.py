"""deploy/ as the pinned `kubectl kustomize` renders it holds the expected objects, and every object is accepted by
the real API server's own validation (`--dry-run=server`, strict field validation) on the test control plane; the
negative controls show the server refusing each kind of mistake the check exists to catch."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from aether.testing import controlplane
from aether.testing.controlplane.manifests import dry_run, identity, kustomize

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
NS = "aether-system"

EXPECTED = {
    ("v1", "Namespace", "", "aether-system"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", "meshnodes.mesh.aether.dev"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", "meshserviceslices.mesh.aether.dev"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", "meshauthorizationpolicies.mesh.aether.dev"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", "meshpeers.mesh.aether.dev"),
    ("v1", "ServiceAccount", "aether-system", "aether-operator"),
    ("v1", "ServiceAccount", "aether-system", "aether-node"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "", "aether-operator"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "", "aether-node"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "", "aether-operator"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "", "aether-node"),
    # cluster-scoped, but kubectl's kustomize does not know these kinds and stamps the namespace on them, which the
    # API server drops for a cluster-scoped kind
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", "aether-system", "aether-node-own-meshnode"),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        "aether-system",
        "aether-node-own-meshnode",
    ),
    ("apps/v1", "Deployment", "aether-system", "aether-operator"),
    ("apps/v1", "DaemonSet", "aether-system", "aether-node"),
    ("v1", "ConfigMap", "aether-system", "aether-envoy-bootstrap"),
}


def test_renders_the_expected_objects(rendered: list[dict[str, Any]]) -> None:
    ids = [identity(o) for o in rendered]
    assert len(ids) == len(set(ids)), "duplicate objects"
    assert set(ids) == EXPECTED


@pytest.fixture(scope="module")
def server(plane: controlplane.ControlPlane) -> controlplane.ControlPlane:
    """The control plane with deploy/'s namespace (a namespaced object cannot be validated before its namespace)."""
    if plane.kubectl("get", "namespace", NS, check=False).returncode != 0:
        plane.kubectl("create", "namespace", NS)
    return plane


def test_every_object_validates_on_the_server(
    rendered: list[dict[str, Any]], server: controlplane.ControlPlane
) -> None:
    assert dry_run(server, rendered) == ""


def _pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    for obj in objects:
        if obj["kind"] == "DaemonSet":
            spec: dict[str, Any] = obj["spec"]["template"]["spec"]
            return spec
    raise AssertionError("no DaemonSet")


MUTATIONS: list[tuple[Callable[[dict[str, Any]], Any], str]] = [
    (lambda ps: ps.__setitem__("hostNetwrok", True), ".spec.template.spec.hostNetwrok: field not declared in schema"),
    (
        lambda ps: ps.__setitem__("host_network", ps.pop("hostNetwork")),
        ".spec.template.spec.host_network: field not declared in schema",
    ),
    (lambda ps: ps["containers"][0].__setitem__("image", 5), "image: expected string"),
    (lambda ps: ps["containers"][0].pop("name"), "name: Required value"),
    (lambda ps: ps["volumes"][0]["configMap"].__setitem__("defaultMode", "0644"), "defaultMode: expected numeric"),
]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    MUTATIONS,
    ids=["unknown-field", "snake-case-name", "wrong-type", "missing-required", "string-for-int"],
)
def test_the_server_refuses_bad_objects(
    rendered: list[dict[str, Any]], server: controlplane.ControlPlane, mutate: Any, expected: str
) -> None:
    """Negative controls: the schema gate is seen red on each kind of mistake it exists to catch."""
    objects = copy.deepcopy(rendered)
    mutate(_pod_spec(objects))
    ds = next(o for o in objects if o["kind"] == "DaemonSet")
    problems = dry_run(server, [ds])
    assert expected in problems, problems


def test_the_server_refuses_a_kind_under_the_wrong_api_version(server: controlplane.ControlPlane) -> None:
    obj = {"apiVersion": "v1", "kind": "Deployment", "metadata": {"name": "x", "namespace": NS}}
    assert 'no matches for kind "Deployment" in version "v1"' in dry_run(server, [obj])


def test_the_server_checks_crd_schemas(rendered: list[dict[str, Any]], server: controlplane.ControlPlane) -> None:
    crd = copy.deepcopy(next(o for o in rendered if o["kind"] == "CustomResourceDefinition"))
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-preserve-unknwon-fields"] = True
    assert "x-kubernetes-preserve-unknwon-fields: field not declared in schema" in dry_run(server, [crd])


def test_deploy_crd_is_the_generated_one() -> None:
    """deploy/crds/ holds copies of crds/ (kustomize refuses files outside deploy/, even through a symlink).
    Fix a failure with: cp crds/<file> deploy/crds/<file>."""
    copies = sorted((DEPLOY / "crds").glob("*.yaml"))
    assert copies
    for path in copies:
        source = REPO / "crds" / path.name
        assert source.is_file(), f"{path} has no source {source}"
        assert path.read_text() == source.read_text(), f"{path} is stale: cp {source} {path}"


KIND = REPO / "e2e" / "kind"


def test_kind_overlay_renders_deploy_with_the_e2e_image(rendered: list[dict[str, Any]]) -> None:
    overlay = kustomize(KIND)
    assert {identity(o) for o in overlay} == {identity(o) for o in rendered}
    images = {
        c["image"]
        for o in overlay
        for c in [
            *o.get("spec", {}).get("template", {}).get("spec", {}).get("initContainers", []),
            *o.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []),
        ]
    }
    assert images == {"localhost/aether:e2e"}


def test_kind_workloads_validate(server: controlplane.ControlPlane) -> None:
    docs = [d for d in yaml.safe_load_all((KIND / "workloads.yaml").read_text()) if d]
    namespaces = [d for d in docs if d["kind"] == "Namespace"]
    assert dry_run(server, namespaces) == ""
    for ns in namespaces:  # what is namespaced in them is validated in its namespace
        server.kubectl("create", "namespace", ns["metadata"]["name"], check=False)
    assert dry_run(server, docs) == ""
