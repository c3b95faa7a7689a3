"""The production CLI runs without the development extra: with kmock and jsonschema unimportable (as in a
production install or image), every production command's --help works, and each development command answers with
how to get it instead of a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from aether.cli import DEVELOPMENT, SUBCOMMANDS

BLOCK = "import sys; sys.modules['kmock'] = None; sys.modules['jsonschema'] = None; "


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    code = BLOCK + f"from aether.cli import main; raise SystemExit(main({list(argv)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_a_production_command_needs_no_development_extra(name: str) -> None:
    out = _run(name, "--help")
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout


@pytest.mark.parametrize("name", sorted(DEVELOPMENT))
def test_a_development_command_says_how_to_get_it(name: str) -> None:
    out = _run(name)
    assert out.returncode == 2, out.stderr
    assert f"aether {name}: a development command" in out.stderr and "aether-mesh[dev]" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
