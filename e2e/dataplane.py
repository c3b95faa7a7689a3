"""The UDP e2e suite on both data paths (issue 29): which paths there are, and what a test reads to tell them apart.

A UDP e2e module parametrizes its module-scoped mesh over `UDP_DATAPLANES` (`Mesh(udp_dataplane=...)`: every
node's sidecar started with `--udp-dataplane envoy|kernel`), so each of its tests runs once per path with the
fixture shared by that path's tests. On `envoy` a datagram to a VIP is diverted to the node's Envoy (a udp_proxy
session per flow on the pod's capture listener); on `kernel` the sidecar programs table `ip aether_udp` into every
meshed pod's netns and the datagram is rewritten to a backend there: Envoy's capture listener counts no session,
the table's named counters count it (`aether.netns.kernel_udp_install.read_kernel_udp_counters`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from aether.e2e.harness import Mesh, MeshPod
from aether.netns.kernel_udp import KERNEL_UDP_TABLE, counter_of, service_chain
from aether.netns.kernel_udp_install import read_kernel_udp_counters
from aether.testing.netlab import sh
from aether.testing.wait import wait_for
from aether.xds.translate.l4.common import stat_name

UDP_DATAPLANES = ("envoy", "kernel")


def on_kernel(mesh: Mesh) -> bool:
    return mesh.udp_dataplane == "kernel"


def kernel_vips(pod: MeshPod) -> set[str]:
    """The VIPs the pod's netns holds in table `ip|ip6 aether_udp` (one Service counter each; none: no table)."""
    return {c.vip for c in read_kernel_udp_counters(pod.netns_path) if c.backend_ip is None}


def kernel_packets(pod: MeshPod, vip: str) -> int:
    """Datagrams the pod sent to vip:18082 on the kernel path (the Service's counter; 0 without one)."""
    return sum(c.packets for c in read_kernel_udp_counters(pod.netns_path) if c.vip == vip and c.backend_ip is None)


def kernel_backend_packets(pod: MeshPod, vip: str) -> dict[str, int]:
    """`<backend ip>:<port>` -> datagrams the pod's netns rewrote from vip:18082 to it."""
    return {
        f"{c.backend_ip}:{c.backend_port}": c.packets
        for c in read_kernel_udp_counters(pod.netns_path)
        if c.vip == vip and c.backend_ip is not None
    }


def kernel_shares(pod: MeshPod, vip: str) -> dict[str, int]:
    """How the pod's table splits new flows to vip:18082: `<backend ip>:<port>` (or "drop": an invalid backend's
    share) -> its buckets of `numgen random mod 100`; {} when the table has no such Service."""
    family = "ip6" if ":" in vip else "ip"
    chain = service_chain(vip)
    listed = sh("nft", "-j", "list", "chain", family, KERNEL_UDP_TABLE, chain, netns=pod.net.netns, check=False)
    out: dict[str, int] = {}
    for item in json.loads(listed or '{"nftables": []}')["nftables"]:
        for stmt in item.get("rule", {}).get("expr", []):
            data = stmt.get("vmap", {}).get("data")  # the numgen map: an inline set of [span, verdict]
            for span, verdict in data.get("set", []) if isinstance(data, dict) else []:
                low, high = span["range"] if isinstance(span, dict) else (span, span)
                target = counter_of(verdict["goto"]["target"], 0, 0) if "goto" in verdict else None
                key = f"{target.backend_ip}:{target.backend_port}" if target else "drop"
                out[key] = out.get(key, 0) + high - low + 1
    return out


def capture_sessions(pod: MeshPod) -> int:
    """udp_proxy sessions Envoy opened on the pod's capture listeners (its `0.0.0.0:18082` one and any per-VIP
    one of an idle-timeout Service; 0 until their stats exist)."""
    prefix = re.escape(f"udp.{stat_name(f'udp_capture_{pod.namespace}_{pod.name}')}")
    own = re.compile(rf"^{prefix}(_[0-9a-f.:]+)?\.downstream_sess_total$")
    stats = pod.node.running_envoy().stats("downstream_sess_total")
    return sum(v for k, v in stats.items() if own.match(k))


def wait_kernel_vips(mesh: Mesh, pods: Iterable[MeshPod], vips: Iterable[str], timeout: float = 60.0) -> None:
    """On the kernel path: until every pod's netns holds every VIP in its table (a no-op on the Envoy path)."""
    if not on_kernel(mesh):
        return
    want, pods = set(vips), list(pods)
    wait_for(
        lambda: all(want <= kernel_vips(p) for p in pods),
        timeout,
        f"{[p.name for p in pods]} holding {sorted(want)} in table aether_udp",
        diagnose=mesh.diagnostics,
    )


def wait_kernel_backends(mesh: Mesh, pod: MeshPod, vip: str, backends: Iterable[str], timeout: float = 60.0) -> None:
    """On the kernel path: until the pod's table rewrites vip:18082 to exactly `backends` (`ip:port`, the valid
    backends' counters; a draining or removed endpoint has none). A no-op on the Envoy path."""
    if not on_kernel(mesh):
        return
    want = set(backends)
    wait_for(
        lambda: set(kernel_backend_packets(pod, vip)) == want,
        timeout,
        f"{pod.name}'s table rewriting {vip} to {sorted(want)}",
        diagnose=mesh.diagnostics,
    )


class PathCounters:
    """Envoy's capture sessions and the kernel counters of one pod's VIPs, read before traffic; `moved()` says
    what each counted since. A test asserts on the path's own: the kernel path's datagrams never reach Envoy."""

    def __init__(self, pod: MeshPod, vips: Iterable[str]) -> None:
        self.pod, self.vips = pod, sorted(set(vips))
        self.sessions = capture_sessions(pod)
        self.kernel = {v: kernel_packets(pod, v) for v in self.vips}

    def moved(self) -> tuple[int, dict[str, int]]:
        """(new Envoy sessions, VIP -> datagrams the kernel path counted) since construction."""
        return capture_sessions(self.pod) - self.sessions, {
            v: kernel_packets(self.pod, v) - self.kernel[v] for v in self.vips
        }

    def check(self, mesh: Mesh, want_datagrams: int = 1) -> None:
        """The path that carried the traffic: kernel, every VIP counted at least `want_datagrams` and no Envoy
        session; envoy, Envoy opened sessions and no kernel counter moved (the pod holds no table)."""
        sessions, kernel = self.moved()
        if on_kernel(mesh):
            assert sessions == 0, f"{sessions} udp_proxy sessions on {self.pod.name}'s capture listener: {kernel}"
            assert all(n >= want_datagrams for n in kernel.values()), kernel
        else:
            assert sessions >= 1 and not any(kernel.values()), (sessions, kernel)
