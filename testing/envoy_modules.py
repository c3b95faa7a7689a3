"""The repo's Envoy dynamic modules (envoy-modules/, Rust) for tests: built once with cargo, found by directory.

Envoy loads a module by name from `ENVOY_DYNAMIC_MODULES_SEARCH_PATH` (`lib<name>.so`): a test sets it to
`build()`'s answer before it starts Envoy."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKSPACE = ROOT / "envoy-modules"
RELEASE = WORKSPACE / "target" / "release"
QUIC_SNI = "aether_quic_sni"


def cargo() -> str:
    found = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    if not Path(found).is_file():
        raise RuntimeError("cargo is needed to build envoy-modules/ (rustup's stable toolchain)")
    return found


def build() -> Path:
    """`cargo build --release --locked` (a no-op when up to date); returns the directory holding the modules."""
    subprocess.run([cargo(), "build", "--release", "--locked", "-q"], cwd=WORKSPACE, check=True, timeout=600)
    if not (RELEASE / f"lib{QUIC_SNI}.so").is_file():
        raise RuntimeError(f"cargo built no lib{QUIC_SNI}.so in {RELEASE}")
    return RELEASE
