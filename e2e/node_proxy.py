"""One node of the e2e mesh: its netns, its pod records directory, its sidecar and Envoy processes, and how to
read Envoy's admin API (a unix socket in the node's working directory)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aether.testing.envoy_admin import admin_get
from aether.testing.envoy_admin import stat as envoy_stat
from aether.testing.netlab import Node


@dataclass
class MeshNodeProxy:
    """One node: its netns, pod records dir, and its sidecar + Envoy processes."""

    name: str
    net: Node
    workdir: Path
    base_id: int
    sidecar: subprocess.Popen[bytes] | None = None
    envoy: subprocess.Popen[bytes] | None = None

    @property
    def records(self) -> Path:
        return self.workdir / "pods"

    @property
    def ads_sock(self) -> str:
        return str(self.workdir / "ads.sock")

    @property
    def admin_sock(self) -> str:
        return str(self.workdir / "admin.sock")

    def admin(self, path: str) -> str:
        return admin_get(self.admin_sock, path)

    def stat(self, name: str) -> int:
        return envoy_stat(self.admin_sock, name)

    def log_tail(self, n: int = 2000) -> str:
        out = []
        for f in ("sidecar.log", "envoy.log"):
            p = self.workdir / f
            if p.exists():
                out.append(f"--- {self.name} {f} ---\n{p.read_text(errors='replace')[-n:]}")
        return "\n".join(out)


def connected(node: MeshNodeProxy) -> Callable[[], bool]:
    return lambda: node.stat("control_plane.connected_state") == 1


def admin_up(node: MeshNodeProxy) -> bool:
    if node.envoy is not None and node.envoy.poll() is not None:
        raise RuntimeError(f"Envoy on {node.name} exited ({node.envoy.returncode})\n{node.log_tail()}")
    try:
        node.admin("/ready")
    except OSError:
        return False
    return True
