"""The package-level import graph, built from the source: the layer rule holds, no package imports in a cycle, and
neither do the subpackages of aether.xds.

Every import statement counts, wherever it is: module level, inside a function, under `TYPE_CHECKING`; relative
imports are resolved, and `importlib.import_module("<literal>")` counts as an import too. The rule is the table
ALLOWED, in this one place (docs/architecture.md shows the same table to readers). The negative controls at the
end run the same scanner and checks over a throw-away tree holding a back edge and cycles, and must see them.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("netns", "api", "operator", "xds", "testing", "e2e")
# Scanned too, under their own top-level names: the benchmarks (may import anything of ours) and deploy/ (the
# image's CNI installer runs from a bare interpreter and the manifest tools stand alone: nothing of ours).
TOOLS = ("bench", "deploy")

# What each package may import, besides itself. Base modules import nothing of ours (the metrics read the heap's
# figures from aether.heap); netns <- api <- {operator,
# xds} <- {testing, e2e}; e2e may use testing, never the reverse; operator and xds never import each other; the
# console-script dispatcher `aether.cli` sits on top (it imports its subcommands lazily, by name).
BASE = frozenset({"aether", "aether.atomicfile", "aether.backoff", "aether.heap", "aether.metrics"})
ALLOWED: dict[str, frozenset[str]] = {
    "aether": frozenset(),  # aether/__init__.py: the version, nothing else
    "aether.atomicfile": frozenset(),
    "aether.backoff": frozenset(),
    "aether.heap": frozenset(),
    "aether.metrics": frozenset({"aether.heap"}),
    "aether.netns": BASE,
    "aether.api": BASE | {"aether.netns"},
    "aether.operator": BASE | {"aether.netns", "aether.api"},
    "aether.xds": BASE | {"aether.netns", "aether.api"},
    "aether.testing": BASE | {"aether.netns", "aether.api", "aether.operator", "aether.xds"},
    "aether.e2e": BASE | {"aether.netns", "aether.api", "aether.operator", "aether.xds", "aether.testing"},
}
ALLOWED["aether.cli"] = frozenset(ALLOWED)
ALLOWED["bench"] = frozenset(ALLOWED)
ALLOWED["deploy"] = frozenset()

# Cycles between aether.xds's subpackages that are reported rather than restructured, each pinned by its back edges
# (module -> module): another import along the pinned edge fails, any other cycle fails, and so does a pinned cycle
# going away (then delete its entry). None today: the memos register with `aether.xds.memo` instead of
# `translate.compose.clear_memo` reaching into the gates' caches.
KnownCycles = Mapping[frozenset[str], tuple[tuple[str, str], frozenset[tuple[str, str]]]]
KNOWN_XDS_CYCLES: KnownCycles = {}


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module: the deepest module or package of the tree the statement names
    where: str  # path:line

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.where})"


def sources(root: Path) -> dict[str, Path]:
    """import prefix -> folder: aether/ itself (its own modules only: the folders are linked in it), each folder,
    and bench/ and deploy/ under their own names."""
    return {
        "aether": root / "aether",
        **{f"aether.{folder}": root / folder for folder in FOLDERS},
        **{tool: root / tool for tool in TOOLS},
    }


def scan(where: Mapping[str, Path], root: Path) -> dict[str, Module]:
    """Every module of the tree by dotted name (symlinked directories are not followed: aether/xds is xds/)."""
    found: dict[str, Module] = {}
    for prefix, folder in where.items():
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not (Path(dirpath) / d).is_symlink())
            for filename in sorted(filenames):
                if not filename.endswith(".py"):
                    continue
                path = Path(dirpath) / filename
                parts = list(path.relative_to(folder).with_suffix("").parts)
                is_package = parts[-1] == "__init__"
                name = ".".join([prefix, *(parts[:-1] if is_package else parts)])
                found[name] = Module(name, path.relative_to(root), is_package)
    return found


def _absolute(module: str | None, level: int, importer: Module) -> str:
    if level == 0:
        return module or ""
    package = importer.name.split(".") if importer.is_package else importer.name.split(".")[:-1]
    if level - 1 >= len(package):
        raise ValueError(f"{importer.path}: relative import beyond the top-level package")
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _ours(name: str) -> bool:
    return any(name == top or name.startswith(f"{top}.") for top in ("aether", *TOOLS))


def imports_of(module: Module, root: Path, known: set[str]) -> Iterator[Import]:
    """The imports of our own modules that `module` makes, anywhere in its source."""
    tree = ast.parse((root / module.path).read_text(), str(module.path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, module)
            # `from pkg import name`: the module pkg.name when the tree has one, else an attribute of pkg
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        for name in dict.fromkeys(names):  # `from m import a, b`: one import of m
            if _ours(name):
                assert isinstance(node, ast.stmt | ast.expr)
                yield Import(module.name, name, f"{module.path}:{node.lineno}")


def all_imports(root: Path) -> tuple[dict[str, Module], list[Import]]:
    modules = scan(sources(root), root)
    known = set(modules) | {".".join(m.split(".")[:i]) for m in modules for i in range(1, m.count(".") + 1)}
    return modules, [imp for m in modules.values() for imp in imports_of(m, root, known)]


def package_of(module: str) -> str:
    """aether.xds.ads.server -> aether.xds; aether.cli -> aether.cli; aether -> aether; bench.udp_dns -> bench."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "aether" else parts[0]


def xds_subpackage_of(module: str) -> str | None:
    """aether.xds.ads.server -> aether.xds.ads; aether.xds.resources -> aether.xds.resources; outside xds: None."""
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["aether", "xds"] and len(parts) > 2 else None


Graph = dict[str, dict[str, list[Import]]]


def graph(imports: list[Import], group: Callable[[str], str | None]) -> Graph:
    """Edges between groups (`group` maps a module to its node, None: left out), each with the imports behind it."""
    out: Graph = {}
    for imp in imports:
        src, dst = group(imp.source), group(imp.target)
        if src is None or dst is None:
            continue
        edges = out.setdefault(src, {})
        out.setdefault(dst, {})
        if src != dst:
            edges.setdefault(dst, []).append(imp)
    return out


def unresolved(modules: Mapping[str, Module], imports: list[Import]) -> list[str]:
    known = set(modules) | {package_of(m) for m in modules} | {".".join(m.split(".")[:3]) for m in modules}
    return [str(imp) for imp in imports if imp.target not in known]


def layer_violations(g: Graph, allowed: Mapping[str, frozenset[str]]) -> list[str]:
    problems = []
    for src, edges in sorted(g.items()):
        if src not in allowed:
            problems.append(f"{src} is not in ALLOWED: say what it may import")
            continue
        for dst, evidence in sorted(edges.items()):
            if dst not in allowed[src]:
                shown = "; ".join(str(imp) for imp in evidence[:3])
                problems.append(f"{src} must not import {dst}: {shown}")
    return problems


def cycles(g: Graph) -> list[frozenset[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(g.get(node, {})):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(frozenset(component))

    for node in sorted(g):
        if node not in index:
            visit(node)
    return out


def describe(g: Graph, component: frozenset[str]) -> str:
    edges = [
        f"{src} -> {dst} [{'; '.join(str(i) for i in ev[:2])}]"
        for src in sorted(component)
        for dst, ev in sorted(g.get(src, {}).items())
        if dst in component
    ]
    return f"cycle {sorted(component)}: " + ", ".join(edges)


def xds_cycle_problems(g: Graph, known: KnownCycles) -> list[str]:
    problems = []
    found = cycles(g)
    for component in found:
        if component not in known:
            problems.append(describe(g, component))
            continue
        (src, dst), pinned = known[component]
        back = {(imp.source, imp.target) for imp in g.get(src, {}).get(dst, [])}
        if back != pinned:
            problems.append(
                f"known cycle {sorted(component)}: {src} -> {dst} is now {sorted(back)}, pinned {sorted(pinned)}"
            )
    problems += [f"known cycle {sorted(c)} is gone: remove it from KNOWN_XDS_CYCLES" for c in set(known) - set(found)]
    return problems


@pytest.fixture(scope="module")
def tree() -> tuple[dict[str, Module], list[Import]]:
    return all_imports(ROOT)


def test_the_scan_sees_every_kind_of_import(tree: tuple[dict[str, Module], list[Import]]) -> None:
    """Not vacuous: the real tree's lazy and TYPE_CHECKING-guarded imports are in the graph (import_module ones:
    the negative control's operator/handlers.py)."""
    modules, imports = tree
    assert {"aether.cli", "aether.netns.cni", "aether.xds.ads.server", "aether.testing.apitestbed"} <= set(modules)
    assert {"bench.xds_translate", "deploy.image.cni_install"} <= set(modules)
    edges = {(imp.source, imp.target) for imp in imports}
    assert ("aether.operator.cli", "aether.metrics") in edges  # inside a function
    assert ("aether.netns.contract", "aether.netns.lite") in edges  # under TYPE_CHECKING
    assert ("aether.netns.cni", "aether.netns.litejson") in edges  # `from package import module as alias`
    assert ("bench.xds_translate", "aether.xds.translate.compose") in edges  # bench/ is scanned
    assert unresolved(modules, imports) == []


def test_allowed_table_is_a_dag() -> None:
    g: Graph = {src: {dst: [] for dst in dsts if dst != src} for src, dsts in ALLOWED.items()}
    assert cycles(g) == []
    assert "aether.xds" not in ALLOWED["aether.operator"] and "aether.operator" not in ALLOWED["aether.xds"]
    assert "aether.e2e" not in ALLOWED["aether.testing"]


def test_no_import_breaks_the_layer_rule(tree: tuple[dict[str, Module], list[Import]]) -> None:
    _, imports = tree
    assert layer_violations(graph(imports, package_of), ALLOWED) == []


def test_no_package_level_cycle(tree: tuple[dict[str, Module], list[Import]]) -> None:
    _, imports = tree
    g = graph(imports, package_of)
    assert [describe(g, c) for c in cycles(g)] == []


def test_no_cycle_between_xds_subpackages(tree: tuple[dict[str, Module], list[Import]]) -> None:
    _, imports = tree
    assert xds_cycle_problems(graph(imports, xds_subpackage_of), KNOWN_XDS_CYCLES) == []


# --- negative controls: a throw-away tree with a back edge and cycles, through the same scan and checks ---

BAD_TREE = {
    # a back edge under TYPE_CHECKING: netns -> xds
    "netns/contract.py": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from aether.xds.resources import Resources\n",
    # production -> test support, inside a function, as a relative import: api -> testing
    "api/naming.py": "def f() -> None:\n    from ..testing import probe\n",
    # operator -> xds through importlib; xds -> operator back: a package cycle
    "operator/handlers.py": "import importlib\nimportlib.import_module('aether.xds.sidecar.loop')\n",
    "xds/resources.py": "from aether.operator import handlers\n",
    # a cycle between xds subpackages (relative on one side)
    "xds/sidecar/__init__.py": "",
    "xds/sidecar/loop.py": "from aether.xds.translate import compose\n",
    "xds/translate/__init__.py": "",
    "xds/translate/compose.py": "def clear() -> None:\n    from ..sidecar import loop\n",
    # allowed: testing -> netns; e2e -> testing
    "testing/probe.py": "import aether.netns.contract\n",
    "e2e/demo.py": "from aether.testing.probe import *\n",
    # the tools: bench may import anything (even test support); deploy/ nothing of ours; production never bench
    "bench/__init__.py": "",
    "bench/udp_dns.py": "from aether.e2e import demo\nfrom . import xds_translate\n",
    "bench/xds_translate.py": "",
    "deploy/image/cni_install.py": "from aether.netns import contract\n",
    "api/addresses.py": "import bench.udp_dns\n",
    # a typo'd module name is reported, not silently dropped
    "testing/devapi.py": "import importlib\nimportlib.import_module('aether.testing.nosuch.thing')\n",
}


# the pinned cycle the negative controls check against (the one the tree had until the memo registry)
PINNED: KnownCycles = {
    frozenset({"aether.xds.gates", "aether.xds.translate"}): (
        ("aether.xds.translate", "aether.xds.gates"),
        frozenset({("aether.xds.translate.compose", "aether.xds.gates.core")}),
    ),
}


@pytest.fixture
def bad_tree(tmp_path: Path) -> tuple[dict[str, Module], list[Import]]:
    (tmp_path / "aether").mkdir()
    (tmp_path / "aether" / "__init__.py").write_text("")
    for rel, text in BAD_TREE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for folder in FOLDERS:
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / "aether" / folder).symlink_to(tmp_path / folder)  # as in the repository: not walked twice
    return all_imports(tmp_path)


def test_negative_control_back_edges_are_reported(bad_tree: tuple[dict[str, Module], list[Import]]) -> None:
    modules, imports = bad_tree
    assert "aether.xds.sidecar.loop" in modules and "aether.xds.sidecar" in modules
    problems = layer_violations(graph(imports, package_of), ALLOWED)
    assert len(problems) == 6, problems  # none from bench/ (it may import anything)
    for src, dst, where in [
        ("aether.netns", "aether.xds", "netns/contract.py:3"),
        ("aether.api", "aether.testing", "api/naming.py:2"),
        ("aether.api", "bench", "api/addresses.py:1"),
        ("aether.operator", "aether.xds", "operator/handlers.py:2"),
        ("aether.xds", "aether.operator", "xds/resources.py:1"),
        ("deploy", "aether.netns", "deploy/image/cni_install.py:1"),
    ]:
        assert any(p.startswith(f"{src} must not import {dst}:") and where in p for p in problems), (src, dst)
    assert unresolved(modules, imports) == [
        "aether.testing.devapi -> aether.testing.nosuch.thing (testing/devapi.py:2)"
    ]


def test_negative_control_cycles_are_reported(bad_tree: tuple[dict[str, Module], list[Import]]) -> None:
    _, imports = bad_tree
    packages = graph(imports, package_of)
    assert cycles(packages) == [frozenset({"aether.operator", "aether.xds"})]
    xds = graph(imports, xds_subpackage_of)
    problems = xds_cycle_problems(xds, PINNED)
    assert len(problems) == 2, problems
    assert problems[0].startswith("cycle ['aether.xds.sidecar', 'aether.xds.translate']: ")
    assert "aether.xds.translate.compose -> aether.xds.sidecar.loop (xds/translate/compose.py:2)" in problems[0]
    assert problems[1] == (
        "known cycle ['aether.xds.gates', 'aether.xds.translate'] is gone: remove it from KNOWN_XDS_CYCLES"
    )


def test_negative_control_a_new_back_edge_into_the_known_cycle_is_reported() -> None:
    def imp(src: str, dst: str) -> Import:
        return Import(src, dst, "x.py:1")

    imports = [
        imp("aether.xds.gates.core", "aether.xds.translate.l4.tcp"),
        imp("aether.xds.translate.compose", "aether.xds.gates.core"),
        imp("aether.xds.translate.l4.udp", "aether.xds.gates.quic"),
    ]
    problems = xds_cycle_problems(graph(imports, xds_subpackage_of), PINNED)
    assert len(problems) == 1 and "aether.xds.translate.l4.udp" in problems[0], problems
