"""No Python module in the repository is over MAX_LINES lines unless its top says why.

Every `.py` file counts (production folders, testing/, e2e/, tests/, bench/, deploy/, aether/): a module over the
limit needs a line `Long because: <the reason>` in its first TOP_LINES lines (in practice: its docstring). KNOWN_LONG
lists the files that are over and cannot get that line right now, each with why; it is kept honest: an entry whose
file is gone, is no longer over the limit or has its reason line now fails until the entry is removed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400
TOP_LINES = 10
MARKER = re.compile(r"Long because: \S.{10,}")
SKIP_DIRS = frozenset({".git", ".venv", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"})

# path (from the repository root) -> why it has no reason line yet
KNOWN_LONG: dict[str, str] = {
    # Over 400 lines with no reason line yet: give it a `Long because:` line or split it, then drop its entry.
}


def python_files(root: Path) -> Iterator[Path]:
    """Every .py file under root, symlinked directories not followed (aether/xds is xds/)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in SKIP_DIRS and not d.endswith(".egg-info") and not (Path(dirpath) / d).is_symlink()
        )
        for filename in sorted(filenames):
            if filename.endswith(".py"):
                yield Path(dirpath) / filename


def says_why(lines: list[str]) -> bool:
    return any(MARKER.search(line) for line in lines[:TOP_LINES])


def problems(root: Path, known: Mapping[str, str]) -> list[str]:
    out = []
    seen_long = set()
    for path in python_files(root):
        rel = path.relative_to(root).as_posix()
        lines = path.read_text().splitlines()
        if len(lines) <= MAX_LINES:
            continue
        seen_long.add(rel)
        if says_why(lines):
            if rel in known:
                out.append(f"{rel}: has its `Long because:` line now: remove it from KNOWN_LONG")
        elif rel not in known:
            out.append(
                f"{rel}: {len(lines)} lines (> {MAX_LINES}): split it, or say why in its first {TOP_LINES} lines"
                " with `Long because: <reason>`"
            )
    for rel in sorted(set(known) - seen_long):
        out.append(f"{rel}: in KNOWN_LONG but not over {MAX_LINES} lines (or gone): remove the entry")
    return out


def test_no_module_is_long_without_saying_why() -> None:
    assert problems(ROOT, KNOWN_LONG) == []


def test_the_walk_sees_every_area() -> None:
    """Not vacuous: production, test support, tests, benchmarks and deploy/ are all walked, once each."""
    files = [p.relative_to(ROOT).as_posix() for p in python_files(ROOT)]
    assert len(files) == len(set(files))
    for expected in (
        "aether/cli.py",
        "xds/ads/server.py",
        "testing/nodebed.py",
        "e2e/harness.py",
        "tests/test_module_length.py",
        "bench/quic_cpu.py",
        "deploy/image/cni_install.py",
    ):
        assert expected in files
    assert not any(f.startswith(("aether/xds/", ".venv/", "build/")) for f in files)


def test_negative_control_long_modules_without_a_reason_are_reported(tmp_path: Path) -> None:
    body = "x = 1\n" * MAX_LINES
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "exactly.py").write_text(body)  # at the limit: fine
    (tmp_path / "pkg" / "over.py").write_text(body + "y = 2\n")
    (tmp_path / "pkg" / "why.py").write_text(
        '"""A table.\n\nLong because: one table of cases, read as one.\n"""\n' + body
    )
    (tmp_path / "pkg" / "too_late.py").write_text("\n" * TOP_LINES + "# Long because: one table of cases.\n" + body)
    (tmp_path / "pkg" / "no_reason.py").write_text("# Long because:\n" + body)
    (tmp_path / "pkg" / "known.py").write_text(body + "y = 2\n")
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n")
    (tmp_path / "linked").symlink_to(tmp_path / "pkg")  # not walked twice
    found = problems(tmp_path, {"pkg/known.py": "being edited", "pkg/short.py": "stale", "pkg/why.py": "stale"})
    assert [p.split(":")[0] for p in found] == [
        "pkg/no_reason.py",
        "pkg/over.py",
        "pkg/too_late.py",
        "pkg/why.py",
        "pkg/short.py",
    ], found
    assert "401 lines (> 400)" in found[1]
    assert "remove it from KNOWN_LONG" in found[3] and "remove the entry" in found[4]
