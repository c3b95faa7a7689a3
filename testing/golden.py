"""Golden files: one convention, one flag.

A golden file holds the expected text of some output, under `tests/<area>/golden/`. `check_golden(path, text)`
compares `text` with it and fails with a unified diff; run with `AETHER_UPDATE_GOLDEN=1` to (re)write the files
instead (then review the diff in git). A missing file fails too: it is only ever created on purpose.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any, Final

UPDATE_FLAG: Final = "AETHER_UPDATE_GOLDEN"
_MAX_DIFF_LINES: Final = 200


class GoldenMismatch(AssertionError):
    """The output differs from its golden file, or the file is missing."""


def updating() -> bool:
    """Whether this run rewrites golden files (`AETHER_UPDATE_GOLDEN=1`)."""
    return os.environ.get(UPDATE_FLAG) == "1"


def golden_json(obj: Any) -> str:
    """The text form golden JSON files use: sorted keys, two-space indent, a final newline."""
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def check_golden(path: Path, actual: str, *, update: bool | None = None) -> None:
    """Fail unless `path` holds exactly `actual`; write it instead when updating (`update`, else the flag)."""
    if updating() if update is None else update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        return
    if not path.exists():
        raise GoldenMismatch(f"golden file {path} is missing; create it deliberately with {UPDATE_FLAG}=1")
    expected = path.read_text()
    if expected == actual:
        return
    diff = list(
        difflib.unified_diff(
            expected.splitlines(), actual.splitlines(), f"{path} (golden)", "actual output", lineterm=""
        )
    )
    if len(diff) > _MAX_DIFF_LINES:
        diff = [*diff[:_MAX_DIFF_LINES], f"... {len(diff) - _MAX_DIFF_LINES} more diff lines"]
    raise GoldenMismatch(
        f"{path.name} differs from the output; if the change is intended, run with {UPDATE_FLAG}=1 and review it\n"
        + "\n".join(diff)
    )
