"""Where the pinned control plane's binaries are: `k8s/build.sh --where` names the cache directory for the versions
`k8s/go.mod`, `k8s/etcd/go.mod` and `k8s/helm/go.mod` pin (the script is the one owner of that key); `AETHER_K8S_BIN` overrides it.
Nothing here builds: `make k8s` does, and a missing build is an error that says so."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from aether.api.crdgen import crds_dir

TOOLS = ("etcd", "helm", "kube-apiserver", "kube-controller-manager", "kubectl")


class ControlPlaneMissing(RuntimeError):
    """The pinned control plane is not built (run `make k8s`)."""


def repository_root() -> Path:
    return crds_dir().resolve().parent


@cache
def bin_dir() -> Path:
    """The directory holding every tool in TOOLS, or ControlPlaneMissing naming what is absent and how to build it."""
    override = os.environ.get("AETHER_K8S_BIN")
    if override:
        where = Path(override)
    else:
        script = repository_root() / "k8s" / "build.sh"
        if not script.is_file():
            raise ControlPlaneMissing(f"{script} not found: set AETHER_K8S_BIN to a directory with {', '.join(TOOLS)}")
        where = Path(
            subprocess.run([str(script), "--where"], check=True, capture_output=True, text=True).stdout.strip()
        )
    missing = [t for t in TOOLS if not os.access(where / t, os.X_OK)]
    if missing or not (override or (where / ".complete").is_file()):
        raise ControlPlaneMissing(
            f"the pinned Kubernetes control plane is not built in {where} (missing: {', '.join(missing) or 'the build marker'}):"
            " run `make k8s`"
        )
    return where


def available() -> bool:
    try:
        bin_dir()
    except ControlPlaneMissing:
        return False
    return True


def tool(name: str) -> str:
    return str(bin_dir() / name)


@contextlib.contextmanager
def or_skip(purpose: str) -> Iterator[None]:
    """Around a test's use of the build: ControlPlaneMissing is a skip that names `make k8s`, and a failure under
    AETHER_REQUIRE_PRIVILEGED=1 (as .ci/run sets), saying what could not run (`purpose`)."""
    try:
        yield
    except ControlPlaneMissing as exc:
        import pytest  # test support only: the callers run under pytest

        if os.environ.get("AETHER_REQUIRE_PRIVILEGED") == "1":
            pytest.fail(f"{exc} (AETHER_REQUIRE_PRIVILEGED=1: {purpose})")
        pytest.skip(str(exc))
