"""No function in production code is over MAX_LINES lines (the house style's "no function over ~80 lines").

Production code is what the `aether` package ships: api/, netns/, operator/, xds/, e2e/ (the demo) and the top-level
modules of aether/ (its other entries are links to those folders). Test support (testing/), benchmarks (bench/) and
tests are not held to it. A function's length is its `def` line to its last line, decorators excluded, nested
functions counted inside their parent as well as on their own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80
PRODUCTION = ("api", "netns", "operator", "xds", "e2e")


def production_files(root: Path) -> Iterator[Path]:
    for folder in PRODUCTION:
        yield from sorted(p for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts)
    yield from sorted(p for p in (root / "aether").glob("*.py") if not p.is_symlink())


def long_functions(source: str, max_lines: int = MAX_LINES) -> list[tuple[str, int]]:
    """-> (name, lines) of every function in `source` longer than max_lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > max_lines:
                out.append((node.name, lines))
    return out


def test_no_production_function_is_over_the_limit() -> None:
    files = list(production_files(ROOT))
    assert len(files) > 100, "the production folders moved: update PRODUCTION"
    over = [
        f"{path.relative_to(ROOT)}: {name} is {lines} lines (> {MAX_LINES}): split it into named steps"
        for path in files
        for name, lines in long_functions(path.read_text())
    ]
    assert over == []


def _function(name: str, lines: int, indent: str = "", prefix: str = "def") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))
    return f"{indent}{prefix} {name}():\n{body}"


def test_the_check_sees_a_long_function() -> None:
    """Negative control: an 81-line function (an async method here) is reported, an 80-line one is not."""
    source = _function("at_limit", 80) + "\n\nclass C:\n" + _function("over", 81, "    ", "async def")
    assert long_functions(source) == [("over", 81)]
    assert long_functions(Path(__file__).read_text(), max_lines=5), "this module's own tests are over 5 lines"
