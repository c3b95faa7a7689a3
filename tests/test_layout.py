"""The layout rules: one `aether` import root, nothing shadowing the stdlib or the Envoy protos."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("netns", "api", "operator", "xds", "testing", "e2e")


@pytest.mark.parametrize(
    ("module", "must_not_be_under"),
    [("operator", ROOT), ("xds", ROOT), ("envoy", ROOT)],
)
def test_running_python_from_the_repo_root_does_not_shadow(module: str, must_not_be_under: Path) -> None:
    for flags in ([], ["-S"]):
        out = subprocess.run(
            [sys.executable, *flags, "-c", f"import {module}; print({module}.__file__)"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if flags and out.returncode != 0:
            continue  # without site, installed packages (xds, envoy) are not importable at all: nothing shadows
        assert out.returncode == 0, out.stderr
        assert not Path(out.stdout.strip()).resolve().is_relative_to(must_not_be_under / module), out.stdout


@pytest.mark.parametrize("folder", FOLDERS)
def test_folders_are_mapped_under_aether(folder: str) -> None:
    link = ROOT / "aether" / folder
    assert link.is_symlink() and link.resolve() == ROOT / folder
    # An __init__.py in the folder would make `import <folder>` from the repo root shadow the real one.
    assert not (ROOT / folder / "__init__.py").exists()


def test_aether_help_lists_every_command() -> None:
    out = subprocess.run([sys.executable, "-m", "aether.cli", "--help"], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0
    for name in ("operator", "dev-api", "xds", "capture", "demo"):
        assert f"  {name}" in out.stdout


def test_unknown_command_is_an_error() -> None:
    out = subprocess.run([sys.executable, "-m", "aether.cli", "frobnicate"], capture_output=True, text=True, cwd="/")
    assert out.returncode == 2
    assert "unknown command 'frobnicate'" in out.stderr


def test_an_installed_wheel_carries_the_crds(tmp_path: Path) -> None:
    """`aether dev-api`/`aether demo` load CRDs from the package: a non-editable install (the image) must have them."""
    wheels = tmp_path / "wheels"
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools reuses build/: a stale one could hide a miss
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    target = tmp_path / "site"
    (wheel,) = wheels.glob("*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)], check=True
    )
    out = subprocess.run(
        [sys.executable, "-c", "from aether.api.crdgen import crds_dir, stale; print(crds_dir()); print(stale())"],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    where, stale = out.stdout.splitlines()
    assert Path(where).is_relative_to(target) and stale == "[]"
    assert (Path(where) / "testbed" / "udproutes.yaml").is_file()
