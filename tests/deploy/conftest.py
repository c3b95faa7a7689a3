"""Fixtures for deploy/: its tool modules (loaded by path: deploy/ is not a package), the objects the pinned
`kubectl kustomize` renders from it, and a real control plane for what only the server can answer (schema
validation by `--dry-run=server`, RBAC by SubjectAccessReview)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from aether.testing import controlplane
from aether.testing.apiserver import Kind
from aether.testing.controlplane import binaries, manifests

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def load_tool(relpath: str) -> ModuleType:
    """Import deploy/<relpath> as a module named after its file (deploy_<stem>), once per session."""
    path = DEPLOY / relpath
    name = f"deploy_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def cni_install() -> ModuleType:
    return load_tool("image/cni_install.py")


def kustomize(root: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize <root>` by the pinned kubectl; unbuilt, a skip naming `make k8s` (a failure under
    AETHER_REQUIRE_PRIVILEGED=1)."""
    with binaries.or_skip("deploy/ must be rendered by kubectl"):
        return manifests.kustomize(root)


@pytest.fixture(scope="session")
def rendered() -> list[dict[str, Any]]:
    return kustomize(DEPLOY)


@pytest.fixture(scope="session")
def plane(api_kind: Kind) -> Iterator[controlplane.ControlPlane]:
    """One real control plane (with the mesh and Gateway API CRDs) for the render and RBAC checks."""
    if api_kind != "real":
        pytest.skip("AETHER_CONTROL_PLANE=emulated: schema validation and RBAC are the real server's")
    cp = controlplane.start()
    try:
        yield cp
    finally:
        cp.stop()


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for obj in objects:
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise AssertionError(f"{kind}/{name} not rendered")


@pytest.fixture(scope="session")
def daemonset(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    return find(rendered, "DaemonSet", "aether-node")


@pytest.fixture(scope="session")
def operator_deployment(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    return find(rendered, "Deployment", "aether-operator")
