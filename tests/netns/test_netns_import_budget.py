"""What the CNI plugin imports on start-up: the standard library's cheap modules and aether.netns, nothing more.

The runtime starts a fresh interpreter per CNI call (the deployed shim runs `python -I -S`), so every module the
plugin imports is paid on every pod start (ADD p50 <= 50 ms, `bench.capture_cni`). A timed assertion would be
noise on these machines; the module set is exact. The heavy modules below cost 4-19 ms each here
(`python -I -S -c 'import typing'` vs `pass`); see aether.netns.lite for how the plugin avoids them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import aether

HEAVY = frozenset(
    {
        "typing",
        "enum",
        "re",
        "json",
        "collections",
        "functools",
        "copy",
        "dataclasses",
        "pathlib",
        "inspect",
        "socket",
        "selectors",
        "subprocess",
        "threading",
        "tempfile",
        "logging",
        "argparse",
        "pydantic",
        "pyroute2",
        "yaml",
        "grpc",
    }
)
CNI_ENTRY_MODULES = ("aether.netns.cni",)


def imported_by(module: str, path_dir: Path) -> set[str]:
    """The modules a fresh `python -I -S` holds after importing `module` from `path_dir` (nothing else on the path)."""
    code = f"import sys; sys.path.append({str(path_dir)!r}); import {module}; print(repr(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    return set(ast.literal_eval(out.stdout))


def heavy_imports(module: str, path_dir: Path) -> set[str]:
    return {name for name in imported_by(module, path_dir) if name.split(".")[0] in HEAVY}


@pytest.fixture
def package_dir(tmp_path: Path) -> Path:
    """A directory holding only `aether` (a link to the package), as the deployed bundle's site-packages does."""
    (tmp_path / "aether").symlink_to(Path(aether.__file__).parent)
    return tmp_path


@pytest.mark.parametrize("module", CNI_ENTRY_MODULES)
def test_the_cni_plugin_imports_nothing_heavy(module: str, package_dir: Path) -> None:
    assert heavy_imports(module, package_dir) == set()
    loaded = imported_by(module, package_dir)
    assert {m for m in loaded if m.startswith("aether.")} <= {
        "aether.atomicfile",
        "aether.netns",
        *(f"aether.netns.{m}" for m in ("cni", "cni_request", "contract", "install", "libnft", "lite", "litejson")),
        *(f"aether.netns.{m}" for m in ("nsthread", "record_file", "rtnl", "rules")),
    }


def test_the_budget_check_sees_a_heavy_import(tmp_path: Path) -> None:
    """Negative control: the check is not vacuous (a module importing `typing` or `json` is caught)."""
    (tmp_path / "budget_probe_typing.py").write_text("from typing import NamedTuple\n")
    (tmp_path / "budget_probe_json.py").write_text("import json\n")
    assert "typing" in heavy_imports("budget_probe_typing", tmp_path)
    assert {"json", "re", "enum"} <= heavy_imports("budget_probe_json", tmp_path)
