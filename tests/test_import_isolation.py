"""Production code loads no test support: every module of netns, api, operator and xds (and the base modules),
imported in one fresh interpreter, leaves no `aether.testing` and no `aether.e2e` module in `sys.modules`.

tests/test_import_graph.py checks the import statements; this checks what actually gets loaded, so an import the
source scan cannot see (a computed name, a plugin, a third-party hook) is caught too. The negative control runs the
same child with a deliberately bad module added and must see what it pulled in, and which import did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = ("netns", "api", "operator", "xds")
BASE = ("aether", "aether.atomicfile", "aether.metrics")

# Runs in the child: import each module in turn, note which test-support modules each import brought in, then
# report everything of ours left in sys.modules. argv: a JSON list of extra sys.path entries, then module names.
CHILD = """
import importlib, json, sys

def test_support(name):
    return name in ("aether.testing", "aether.e2e") or name.startswith(("aether.testing.", "aether.e2e."))

sys.path[:0] = json.loads(sys.argv[1])
by_import = {}
for name in sys.argv[2:]:
    before = set(sys.modules)
    importlib.import_module(name)
    new = sorted(n for n in set(sys.modules) - before if test_support(n))
    if new:
        by_import[name] = new
ours = sorted(n for n in sys.modules if n == "aether" or n.startswith("aether."))
print(json.dumps({"by_import": by_import, "test_support": [n for n in ours if test_support(n)], "ours": ours}))
"""


def production_modules() -> list[str]:
    """Every module and package of the production folders, by import name (from the source tree)."""
    names = list(BASE)
    for folder in PRODUCTION:
        for dirpath, dirnames, filenames in os.walk(ROOT / folder):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for filename in sorted(f for f in filenames if f.endswith(".py")):
                parts = (Path(dirpath) / filename).relative_to(ROOT).with_suffix("").parts
                names.append(".".join(("aether", *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return names


@dataclass(frozen=True)
class Loaded:
    by_import: dict[str, list[str]]  # module imported -> the test-support modules that import brought in
    test_support: list[str]  # every test-support module loaded at the end
    ours: list[str]  # every aether module loaded at the end


def load_in_fresh_interpreter(modules: list[str], extra_path: list[str] | None = None) -> Loaded:
    # this tree first: `-I` drops PYTHONPATH, and the venv's installed `aether` may be another checkout's
    out = subprocess.run(
        [sys.executable, "-I", "-c", CHILD, json.dumps([str(ROOT), *(extra_path or [])]), *modules],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return Loaded(**json.loads(out.stdout))


def test_production_modules_load_no_test_support() -> None:
    modules = production_modules()
    some = {"aether.xds.ads.server", "aether.xds.sidecar.cli", "aether.xds.translate.l4.udp", "aether.api.meshnode"}
    assert some | {"aether.operator.handlers", "aether.operator.reconcile.model", "aether.netns.cni"} <= set(modules)
    # the tree under test first: a shared venv's editable install may point at another checkout of the project
    result = load_in_fresh_interpreter(modules, [str(ROOT)])
    assert set(modules) <= set(result.ours)  # every one really was imported
    assert result.test_support == [], result.by_import
    assert result.by_import == {}


def test_negative_control_a_production_module_importing_test_support_is_caught(tmp_path: Path) -> None:
    """The same child, with a module added that imports test support (as a production module gone wrong would)."""
    (tmp_path / "leaky_testing.py").write_text("import aether.xds.resources\nfrom aether.testing import probe\n")
    (tmp_path / "leaky_e2e.py").write_text("def later() -> None:\n    pass\n\nimport aether.e2e\n")
    modules = ["aether.api.naming", "leaky_testing", "aether.xds.ads.cache", "leaky_e2e", "aether.netns.records"]
    result = load_in_fresh_interpreter(modules, [str(tmp_path)])
    # exactly the bad modules are blamed; what probe itself pulls in besides is testing's business
    assert sorted(result.by_import) == ["leaky_e2e", "leaky_testing"]
    assert {"aether.testing", "aether.testing.probe"} <= set(result.by_import["leaky_testing"])
    assert all(n == "aether.testing" or n.startswith("aether.testing.") for n in result.by_import["leaky_testing"])
    assert result.by_import["leaky_e2e"] == ["aether.e2e"]
    assert {"aether.e2e", "aether.testing", "aether.testing.probe"} <= set(result.test_support)
