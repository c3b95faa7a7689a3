"""The soak's watcher: once a second, under the churn's swap lock (so a restart the churn asked for is never taken
for a crash), it checks that the operator, every sidecar and every Envoy still run (one that exited unasked is a
crash: recorded with its exit code and log tail, then started again so the soak goes on); every `sample_every`
seconds it samples their RSS and open fds from /proc (and each Envoy's own heap figures from its admin /stats:
allocated, heap size, physical size, which tell a leak from tcmalloc keeping freed pages); and it reads the sidecars' logs for QUIC pair prunes, each
judged in use when its source ServiceAccount still had a caller and a 200 on that pair in the last IN_USE_S.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aether.e2e.harness import Mesh
from aether.e2e.lifecycle import restart_envoy, restart_sidecar
from aether.e2e.node_proxy import MeshNodeProxy
from aether.testing.envoy import ADMIN_ERRORS
from aether.testing.promtext import named, scrape
from bench.soak_report import Prune, Sample
from bench.soak_traffic import Recorder

IN_USE_S = 60.0
PRUNED = re.compile(
    r"QUIC pair pruned \((?P<cause>[^)]*)\): (?P<src>\S+) -> (?P<dst>\S+), twin (?P<twin>\S+) withdrawn"
)


PAIR_GAUGES = ("aether_quic_pairs", "aether_quic_dormant_pairs")
ENVOY_HEAP = ("server.memory_allocated", "server.memory_heap_size", "server.memory_physical_size")


def envoy_heap(stats: dict[str, int]) -> tuple[int, int, int] | None:
    """(allocated, heap size, physical size) in KiB from an Envoy's admin stats (bytes); None if one is missing."""
    if not all(name in stats for name in ENVOY_HEAP):
        return None
    allocated, heap, physical = (stats[name] // 1024 for name in ENVOY_HEAP)
    return allocated, heap, physical


def proc_sample(pid: int) -> tuple[int, int, int | None, int | None] | None:
    """(VmRSS in KiB, open fds, RssAnon KiB, RssFile KiB) of a running process; None once it is gone. RSS is the sum
    of the anonymous part (the process's own memory: heaps, arenas, stacks) and the file-backed part (pages of its
    executable and libraries, shared with every process mapping them, which the kernel drops and reads back at will);
    the shared-memory part (RssShmem) none of these processes has."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    got = {k: int(v) for k, v in re.findall(r"^(VmRSS|RssAnon|RssFile):\s+(\d+) kB", status, re.M)}
    if "VmRSS" not in got:
        return None
    return got["VmRSS"], fds, got.get("RssAnon"), got.get("RssFile")


@dataclass
class Watcher:
    mesh: Mesh
    rec: Recorder
    swap: threading.Lock
    sidecar_args: Callable[[MeshNodeProxy], tuple[str, ...]]
    callers: Callable[[], set[str]]  # the ServiceAccounts with a running caller now
    metrics_ports: dict[str, int] = field(default_factory=dict)  # node -> its sidecar's --metrics port
    sample_every: float = 10.0
    samples: list[Sample] = field(default_factory=list)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    prunes: list[Prune] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    _offsets: dict[str, int] = field(default_factory=dict)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        for node in self.mesh.nodes.values():  # prunes before the soak started are not the soak's
            log = node.workdir / "sidecar.log"
            self._offsets[node.name] = log.stat().st_size if log.exists() else 0
        self._thread = threading.Thread(target=self._loop, name="soak-watch", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self._prunes()

    def _loop(self) -> None:
        next_sample = time.monotonic()
        while not self.stop.wait(1.0):
            with self.swap:
                self._check()
                if time.monotonic() >= next_sample:
                    self._sample()
                    next_sample += self.sample_every
            self._prunes()

    def _processes(self) -> list[tuple[str, str, subprocess.Popen[bytes] | None]]:
        out: list[tuple[str, str, subprocess.Popen[bytes] | None]] = [("operator", "", self.mesh.operator)]
        for node in self.mesh.nodes.values():
            out.append(("sidecar", node.name, node.sidecar))
            out.append(("envoy", node.name, node.envoy.proc if node.envoy else None))
        return out

    def _check(self) -> None:
        for role, name, proc in self._processes():
            if proc is None or proc.poll() is None:
                continue
            crash = {"role": role, "node": name, "pid": proc.pid, "returncode": proc.returncode, "t": time.monotonic()}
            crash["log_tail"] = self._tail(role, name)
            self.crashes.append(crash)
            with contextlib.suppress(Exception):  # started again so the soak goes on (its failure is in the log)
                self._restart(role, name)

    def _restart(self, role: str, name: str) -> None:
        if role == "operator":
            self.mesh.start_operator()
            return
        node = self.mesh.nodes[name]
        if role == "envoy":
            restart_envoy(self.mesh, node)
        else:
            self.mesh.sidecar_args = self.sidecar_args(node)
            restart_sidecar(self.mesh, node)

    def _tail(self, role: str, name: str) -> str:
        path = self.mesh.dir / "operator.log" if role == "operator" else self.mesh.dir / name / f"{role}.log"
        with contextlib.suppress(OSError):
            return path.read_text(errors="replace")[-1500:]
        return ""

    def _sample(self) -> None:
        now = time.monotonic()
        for role, name, proc in self._processes():
            got = proc_sample(proc.pid) if proc is not None and proc.poll() is None else None
            if got is None:
                continue
            heap, clusters, draining, listeners = self._envoy_figures(name) if role == "envoy" else (None,) * 4
            pairs, malloc, blocks = self.python_figures(role, name) if role != "envoy" else (None,) * 3
            pid = proc.pid if proc else 0
            rss, fds, anon, file = got
            self.samples.append(
                Sample(
                    *(now, role, name, pid, rss, fds, heap, clusters, pairs, draining, listeners, malloc, blocks),
                    rss_anon_kib=anon,
                    rss_file_kib=file,
                )
            )

    def python_figures(self, role: str, name: str) -> tuple[int | None, int | None, int | None]:
        """From a sidecar's or the operator's metrics: the sidecar's QUIC pairs, live and dormant (the live state its
        memory grows with), and the heap in use at the end of the process's last full garbage collection
        (aether.metrics.HeapCollector, aether.heap: C malloc's KiB, CPython's blocks, what was still reachable; the
        figures of the moment also count dead cycles waiting for the collector)."""
        port = self.metrics_ports.get(name)
        if port is None:
            return None, None, None
        with contextlib.suppress(OSError, ValueError):
            got = scrape(f"http://127.0.0.1:{port}/metrics")
            pairs = int(sum(sum(named(got, m).values()) for m in PAIR_GAUGES)) if role == "sidecar" else None
            malloc = sum(named(got, "aether_process_malloc_in_use_after_full_gc_bytes").values()) // 1024
            blocks = sum(named(got, "aether_process_python_allocated_blocks_after_full_gc").values())
            return pairs, int(malloc) or None, int(blocks) or None
        return None, None, None

    def _envoy_figures(self, name: str) -> tuple[tuple[int, int, int] | None, int | None, int | None, int | None]:
        """The Envoy's heap figures, its live cluster count (`cluster_manager.active_clusters`: every twin and
        Service cluster it holds), its draining listeners (`listener_manager.total_listeners_draining`: each
        listener removed or replaced stays, with its stats, for --drain-time-s) and its active listeners
        (`listener_manager.total_listeners_active`: a meshed pod's own listeners come and go with it): the live
        state its heap grows with; all None if its admin does not answer."""
        envoy = self.mesh.nodes[name].envoy
        if envoy is None:
            return None, None, None, None
        with contextlib.suppress(*ADMIN_ERRORS, ValueError):
            stats = envoy.stats(
                r"^(server\.memory_|cluster_manager\.active_clusters$|listener_manager\.total_listeners_)"
            )
            draining = stats.get("listener_manager.total_listeners_draining")
            active = stats.get("listener_manager.total_listeners_active")
            return envoy_heap(stats), stats.get("cluster_manager.active_clusters"), draining, active
        return None, None, None, None

    def _prunes(self) -> None:
        for node in self.mesh.nodes.values():
            log = node.workdir / "sidecar.log"
            with contextlib.suppress(OSError), log.open("rb") as fh:
                fh.seek(self._offsets.get(node.name, 0))
                data = fh.read()
                cut = data.rfind(b"\n") + 1
                self._offsets[node.name] = self._offsets.get(node.name, 0) + cut
                for line in data[:cut].decode(errors="replace").splitlines():
                    m = PRUNED.search(line)
                    if m:
                        self.prunes.append(self._judge(node.name, m, line))

    def _judge(self, node: str, m: re.Match[str], line: str) -> Prune:
        now = time.monotonic()
        sa = m.group("twin").rpartition("@")[2].rpartition("/")[2]
        last = self.rec.last_ok.get(sa)
        in_use = sa in self.callers() and last is not None and now - last <= IN_USE_S
        return Prune(now, node, m.group("cause"), m.group("twin"), in_use, line.strip()[-300:])
