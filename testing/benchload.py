"""Load a module of the repository's `bench/` by its path, for tests of its pure parts.

The repository root is never on sys.path (its `operator/` would shadow the standard library's), so `bench` is not
importable from the tests; a bench module that imports only the standard library and `aether` loads this way."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_bench(name: str) -> ModuleType:
    """`bench/<name>.py` as module `bench_<name>` (registered in sys.modules, so its dataclasses resolve)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
