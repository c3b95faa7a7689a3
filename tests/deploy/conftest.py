"""Fixtures for deploy/: its tool modules (loaded by path: deploy/ is not a package) and the rendered objects."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

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
def kustomize_lite() -> ModuleType:
    return load_tool("tools/kustomize_lite.py")


@pytest.fixture(scope="session")
def kube_schema() -> ModuleType:
    return load_tool("tools/kube_schema.py")


@pytest.fixture(scope="session")
def rbac_check() -> ModuleType:
    return load_tool("tools/rbac_check.py")


@pytest.fixture(scope="session")
def cni_install() -> ModuleType:
    return load_tool("image/cni_install.py")


@pytest.fixture(scope="session")
def rendered(kustomize_lite: ModuleType) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = kustomize_lite.render(DEPLOY)
    return objects


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
