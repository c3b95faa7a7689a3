"""One node of the e2e mesh: its netns, its pod records directory, its sidecar and Envoy processes, and how to
read Envoy's admin API (a unix socket in the node's working directory)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aether.testing.envoy import Envoy
from aether.testing.netlab import Node
from aether.testing.wait import wait_for


@dataclass
class MeshNodeProxy:
    """One node: its netns, pod records dir, and its sidecar + Envoy processes."""

    name: str
    net: Node
    workdir: Path
    sidecar: subprocess.Popen[bytes] | None = None
    envoy: Envoy | None = None
    # Listeners added to the bootstrap `aether xds bootstrap` writes, before each Envoy of this node starts: config
    # the sidecar did not make (a test's stale or hand-made route, e.g. aether.e2e.stale_routes).
    static_listeners: list[dict[str, Any]] = field(default_factory=list)

    @property
    def records(self) -> Path:
        return self.workdir / "pods"

    @property
    def ads_sock(self) -> str:
        return str(self.workdir / "ads.sock")

    @property
    def admin_sock(self) -> str:
        return str(self.workdir / "admin.sock")

    def running_envoy(self) -> Envoy:
        if self.envoy is None:
            raise RuntimeError(f"no Envoy on {self.name} yet: Mesh.start_node_proxies() starts it")
        return self.envoy

    def admin(self, path: str) -> str:
        return self.running_envoy().admin(path)

    def stat(self, name: str) -> int:
        return self.running_envoy().stat(name)

    def hosts(self, cluster: str) -> set[str]:
        """The IPs of the hosts Envoy's `/clusters` lists for `cluster` (its endpoints as this proxy has them)."""
        return set(self.host_health(cluster))

    def host_health(self, cluster: str) -> dict[str, str]:
        """ip -> EDS health status (`healthy`, `draining`, ...) of each host Envoy holds for `cluster`."""
        return self.running_envoy().host_health(cluster)

    def wait_hosts(self, want: dict[str, set[str]], timeout: float = 60.0) -> None:
        """Until Envoy holds exactly the hosts `want` names for each cluster: an arm in the MeshNode status says
        the route is there, not that this proxy has its endpoints yet, so a strict first datagram waits for this."""
        wait_for(
            lambda: all(self.hosts(c) == ips for c, ips in want.items()),
            timeout=timeout,
            what=f"hosts {want} in {self.name}'s Envoy",
            diagnose=lambda: str({c: self.hosts(c) for c in want}),
        )

    def log_tail(self, n: int = 2000) -> str:
        out = []
        for f in ("sidecar.log", "envoy.log"):
            p = self.workdir / f
            if p.exists():
                out.append(f"--- {self.name} {f} ---\n{p.read_text(errors='replace')[-n:]}")
        return "\n".join(out)


def connected(node: MeshNodeProxy) -> Callable[[], bool]:
    return lambda: node.running_envoy().running() and node.stat("control_plane.connected_state") == 1
