"""deploy/ renders (without kubectl; compared with `kubectl kustomize` where it exists) and every object
validates against the Kubernetes schemas of the `kubernetes` client's models."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

EXPECTED = {
    ("v1", "Namespace", "", "aether-system"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", "meshnodes.mesh.aether.dev"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", "meshserviceslices.mesh.aether.dev"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", "meshauthorizationpolicies.mesh.aether.dev"),
    ("v1", "ServiceAccount", "aether-system", "aether-operator"),
    ("v1", "ServiceAccount", "aether-system", "aether-node"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "", "aether-operator"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "", "aether-node"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "", "aether-operator"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "", "aether-node"),
    # cluster-scoped, but kustomize (kubectl's, here) does not know these kinds and stamps the namespace on them,
    # which the API server drops for a cluster-scoped kind; kustomize_lite renders as kubectl does
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


def test_renders_the_expected_objects(rendered: list[dict[str, Any]], kustomize_lite: ModuleType) -> None:
    ids = [kustomize_lite.identity(o) for o in rendered]
    assert len(ids) == len(set(ids)), "duplicate objects"
    assert set(ids) == EXPECTED


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl absent: the pure-Python render stands alone")
def test_kustomize_lite_matches_kubectl(rendered: list[dict[str, Any]], kustomize_lite: ModuleType) -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    theirs = {kustomize_lite.identity(o): o for o in yaml.safe_load_all(out) if o}
    ours = {kustomize_lite.identity(o): o for o in rendered}
    assert theirs.keys() == ours.keys()
    for key, obj in ours.items():
        assert obj == theirs[key], f"{key} differs between kustomize_lite and kubectl kustomize"


def test_every_object_validates_against_the_kubernetes_schemas(
    rendered: list[dict[str, Any]], kube_schema: ModuleType
) -> None:
    problems = [p for obj in rendered for p in kube_schema.validate(obj)]
    assert problems == []


def _pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    for obj in objects:
        if obj["kind"] == "DaemonSet":
            spec: dict[str, Any] = obj["spec"]["template"]["spec"]
            return spec
    raise AssertionError("no DaemonSet")


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda ps: ps.__setitem__("hostNetwrok", True), "hostNetwrok: Extra inputs are not permitted"),
        (lambda ps: ps.__setitem__("host_network", ps.pop("hostNetwork")), "host_network: not a field"),
        (lambda ps: ps["containers"][0].__setitem__("image", 5), "Input should be a valid string"),
        (lambda ps: ps["containers"][0].pop("name"), "Field required"),
        (lambda ps: ps["volumes"][0]["configMap"].__setitem__("defaultMode", "0644"), "valid integer"),
    ],
    ids=["unknown-field", "snake-case-name", "wrong-type", "missing-required", "string-for-int"],
)
def test_validator_rejects_bad_objects(
    rendered: list[dict[str, Any]], kube_schema: ModuleType, mutate: Any, expected: str
) -> None:
    """Negative controls: the schema gate is seen red on each kind of mistake it exists to catch."""
    objects = copy.deepcopy(rendered)
    mutate(_pod_spec(objects))
    ds = next(o for o in objects if o["kind"] == "DaemonSet")
    problems = kube_schema.validate(ds)
    assert any(expected in p for p in problems), problems


def test_validator_rejects_a_kind_under_the_wrong_api_version(kube_schema: ModuleType) -> None:
    obj = {"apiVersion": "v1", "kind": "Deployment", "metadata": {"name": "x"}}
    assert kube_schema.validate(obj) == ["Deployment/x: no schema known for apiVersion=v1 kind=Deployment"]


def test_validator_checks_crd_schemas(rendered: list[dict[str, Any]], kube_schema: ModuleType) -> None:
    crd = copy.deepcopy(next(o for o in rendered if o["kind"] == "CustomResourceDefinition"))
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-preserve-unknwon-fields"] = True
    assert any("preserve-unknwon" in p for p in kube_schema.validate(crd))


def test_deploy_crd_is_the_generated_one() -> None:
    """deploy/crds/ holds copies of crds/ (kustomize refuses files outside deploy/, even through a symlink).
    Fix a failure with: cp crds/<file> deploy/crds/<file>."""
    copies = sorted((DEPLOY / "crds").glob("*.yaml"))
    assert copies
    for path in copies:
        source = REPO / "crds" / path.name
        assert source.is_file(), f"{path} has no source {source}"
        assert path.read_text() == source.read_text(), f"{path} is stale: cp {source} {path}"


def test_kustomize_lite_refuses_unimplemented_features(kustomize_lite: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\npatches: []\n")
    with pytest.raises(kustomize_lite.KustomizeError, match="patches"):
        kustomize_lite.render(tmp_path)


def test_kustomize_lite_images_and_namespace(kustomize_lite: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n"
        "spec: {template: {spec: {containers: [{name: c, image: 'aether:0.1.0'}]}}}\n"
        "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\n"
    )
    (tmp_path / "kustomization.yaml").write_text(
        "namespace: ns\nresources: [d.yaml]\nimages: [{name: aether, newName: reg.example/aether, newTag: '1.2'}]\n"
    )
    dep, role = kustomize_lite.render(tmp_path)
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "reg.example/aether:1.2"
    assert dep["metadata"]["namespace"] == "ns"
    assert "namespace" not in role["metadata"]


KIND = REPO / "e2e" / "kind"


def test_kind_overlay_renders_deploy_with_the_e2e_image(
    rendered: list[dict[str, Any]], kustomize_lite: ModuleType, kube_schema: ModuleType
) -> None:
    overlay = kustomize_lite.render(KIND)
    assert {kustomize_lite.identity(o) for o in overlay} == {kustomize_lite.identity(o) for o in rendered}
    images = {
        c["image"]
        for o in overlay
        for c in [
            *o.get("spec", {}).get("template", {}).get("spec", {}).get("initContainers", []),
            *o.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []),
        ]
    }
    assert images == {"localhost/aether:e2e"}
    if shutil.which("kubectl"):
        out = subprocess.run(
            ["kubectl", "kustomize", str(KIND)], capture_output=True, text=True, timeout=120, check=True
        )
        theirs = {kustomize_lite.identity(o): o for o in yaml.safe_load_all(out.stdout) if o}
        assert theirs == {kustomize_lite.identity(o): o for o in overlay}


def test_kind_workloads_validate(kube_schema: ModuleType) -> None:
    docs = [d for d in yaml.safe_load_all((KIND / "workloads.yaml").read_text()) if d]
    assert [p for d in docs for p in kube_schema.validate(d)] == []
