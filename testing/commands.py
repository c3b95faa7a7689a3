"""How another process runs the `aether` CLI: the console script beside the interpreter, else `python -m aether.cli`."""

from __future__ import annotations

import sys
from pathlib import Path


def command() -> list[str]:
    """argv prefix that runs `aether` in a child process with this interpreter's install."""
    script = Path(sys.executable).parent / "aether"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "aether.cli"]
