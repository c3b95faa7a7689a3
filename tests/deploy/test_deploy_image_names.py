"""One source of truth for the image names: `deploy/image/build.sh --names` prints what `make images` builds, and the
kustomize tree's containers, the Helm chart's default values and the image tests all name exactly those (the
operator Deployment the operator image, every container of the node DaemonSet the node image)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from aether.testing import images

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "aether"


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def test_the_build_script_names_two_images_of_the_package_version() -> None:
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert images.names() == {
        "operator": f"localhost/aether-operator:{version}",
        "node": f"localhost/aether-node:{version}",
    }


def test_the_manifests_name_the_built_images(operator_deployment: dict[str, Any], daemonset: dict[str, Any]) -> None:
    built = images.names()
    assert {c["name"]: c["image"] for c in containers(operator_deployment)} == {"operator": built["operator"]}
    assert {c["name"]: c["image"] for c in containers(daemonset)} == {
        "install-cni": built["node"],
        "xds": built["node"],
        "envoy": built["node"],
    }


def test_the_charts_defaults_name_the_built_images() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["images"]
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    for which, ref in images.names().items():
        tag = values[which]["tag"] or version  # empty: the chart's appVersion (templates/_helpers.tpl)
        assert f"{values[which]['repository']}:{tag}" == ref, which
