"""Test and benchmark plumbing for the east-west data path: the real Envoy per node netns, served over delta ADS by
`aether.xds.ads.server` on a unix socket, an echo app in pods, and HTTP clients run inside pod netns.

Everything is started through an `aether.testing.netlab.Lab`, so it is cleaned up with the lab.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aether.testing.envoy_admin import admin_request
from aether.testing.envoybin import envoy_path
from aether.testing.netlab import Lab, Pod
from aether.xds.ads.cache import SnapshotCache, make_snapshot
from aether.xds.ads.server import DeltaAdsServer, serve
from aether.xds.resources import Resources, merge
from aether.xds.sidecar.bootstrap import ads_bootstrap

# An HTTP/1.1 app: answers every GET with JSON {xfcc, host, port}; appends one line per request to HITS; also
# holds a UDP socket on each port and appends every datagram it sees to HITS (so "never reaches an app" covers UDP).
ECHO_APP = r"""
import http.server, json, socket, sys, threading
hits = sys.argv[1]
ports = [int(p) for p in sys.argv[2:]]
def log(line):
    with open(hits, "a") as fh:
        fh.write(line + "\n")
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: Nagle + delayed ACK would add 40 ms
    def do_GET(self):
        port = self.server.server_address[1]
        body = json.dumps({"xfcc": self.headers.get("x-forwarded-client-cert"), "host": self.headers.get("host"),
                           "port": port}).encode()
        log(f"http {port} {self.path}")
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
def udp(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    while True:
        data, peer = s.recvfrom(65535)
        log(f"udp {port} {len(data)}")
servers = []
for p in ports:
    srv = http.server.ThreadingHTTPServer(("0.0.0.0", p), H)
    srv.daemon_threads = True
    servers.append(srv)
    threading.Thread(target=udp, args=(p,), daemon=True).start()
for srv in servers[1:]:
    threading.Thread(target=srv.serve_forever, daemon=True).start()
print("ready", flush=True)
servers[0].serve_forever()
"""

# Sends N GETs on one keep-alive connection (reconnecting after an error); prints one JSON line with
# [[status, body], ...]; status 0 = connection-level failure (body has the error).
CLIENT = r"""
import http.client, json, sys, time
host, port, hostname, n, pause = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
out = []
conn = None
for i in range(n):
    try:
        if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/", headers={"Host": hostname})
        r = conn.getresponse()
        out.append([r.status, r.read().decode(errors="replace")])
    except Exception as exc:
        out.append([0, repr(exc)])
        if conn is not None:
            conn.close()
        conn = None
    if pause:
        time.sleep(pause)
print(json.dumps(out))
"""


# A real QUIC client handshake (aioquic), no client certificate, server not verified: prints CONNECTED or
# FAILED <why>. Used to show where a handshake lands, not to carry traffic.
QUIC_PROBE = r"""
import asyncio, ssl, sys
from aioquic.asyncio import connect
from aioquic.quic.configuration import QuicConfiguration
async def main():
    cfg = QuicConfiguration(is_client=True, alpn_protocols=["h3"], server_name=sys.argv[3])
    cfg.verify_mode = ssl.CERT_NONE
    async with connect(sys.argv[1], int(sys.argv[2]), configuration=cfg, wait_connected=True):
        print("CONNECTED")
try:
    asyncio.run(asyncio.wait_for(main(), float(sys.argv[4])))
except BaseException as exc:
    print("FAILED", type(exc).__name__, exc)
"""


def quic_probe(netns: str, ip: str, port: int, sni: str, timeout: float = 3.0) -> str:
    out = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c", QUIC_PROBE, ip, str(port), sni, str(timeout)],
        capture_output=True,
        text=True,
        timeout=timeout + 30,
    )
    return (out.stdout + out.stderr).strip()


def unique_base_id() -> int:
    return 100_000 + secrets.randbelow(800_000)


@dataclass
class EnvoyNode:
    """One Envoy in a node netns, admin on a unix socket (reachable from any netns)."""

    node_id: str
    proc: subprocess.Popen[bytes]
    admin_path: str
    log_path: Path
    workdir: Path

    def admin(self, path: str, method: str = "GET") -> str:
        return admin_request(self.admin_path, path, method)

    def active_config(self, resource: str) -> str:
        """The active (not warming, not draining) dynamic resources of one config_dump section, as JSON text."""
        dump = json.loads(self.admin(f"/config_dump?resource={resource}"))
        active = []
        for cfg in dump.get("configs", []):
            active.append(cfg.get("active_state") or cfg.get("cluster") or cfg)
        return json.dumps(active)

    def stats(self, pattern: str = "") -> dict[str, int]:
        out: dict[str, int] = {}
        text = self.admin("/stats?filter=" + pattern if pattern else "/stats")
        for line in text.splitlines():
            name, sep, value = line.rpartition(": ")
            if sep and value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out

    def stat_sum(self, regex: str) -> int:
        rx = re.compile(regex)
        return sum(v for k, v in self.stats().items() if rx.search(k))

    def cpu_seconds(self) -> float:
        """utime + stime of the Envoy process (not the `ip netns exec` wrapper: it execs)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy {self.node_id} exited {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                last = self.admin("/ready").strip()
                if last == "LIVE":
                    return
            time.sleep(0.1)
        raise TimeoutError(f"envoy {self.node_id} not ready after {timeout}s ({last!r}): {self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text()[-n:]
        return ""


class AdsHarness:
    """The real delta-ADS server on a unix socket, one snapshot per node id."""

    def __init__(self, workdir: Path) -> None:
        self.cache = SnapshotCache()
        self.servicer = DeltaAdsServer(self.cache)
        self.socket_path = str(workdir / "ads.sock")
        self.server, _ = serve(self.servicer, f"unix:{self.socket_path}", max_workers=16)

    def set(self, node_id: str, *parts: Resources) -> None:
        prev = self.cache.get(node_id)
        self.cache.set_snapshot(node_id, make_snapshot(merge(*parts), previous=prev))

    def close(self) -> None:
        self.server.stop(grace=0)


def start_envoy(
    lab: Lab,
    netns: str,
    node_id: str,
    workdir: Path,
    ads: AdsHarness,
    *,
    concurrency: int = 1,
    log_level: str = "warning",
    drain_time_s: int = 2,
    runtime: dict[str, Any] | None = None,
) -> EnvoyNode:
    workdir.mkdir(parents=True, exist_ok=True)
    admin = str(workdir / f"admin-{node_id}.sock")
    boot = ads_bootstrap(node_id, f"unix:{ads.socket_path}", f"unix:{admin}")
    if runtime:
        boot["layered_runtime"] = {
            "layers": [{"name": "static", "static_layer": runtime}, {"name": "admin", "admin_layer": {}}]
        }
    boot_path = workdir / f"bootstrap-{node_id}.json"
    boot_path.write_text(json.dumps(boot))
    log_path = workdir / f"envoy-{node_id}.log"
    argv = [
        str(envoy_path()),
        "-c",
        str(boot_path),
        "--disable-hot-restart",
        "--base-id",
        str(unique_base_id()),
        "--concurrency",
        str(concurrency),
        "-l",
        log_level,
        "--log-path",
        str(log_path),
        "--file-flush-interval-msec",
        "100",
        "--drain-time-s",
        str(drain_time_s),
    ]
    proc = lab.spawn(netns, argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return EnvoyNode(node_id, proc, admin, log_path, workdir)


def start_echo(lab: Lab, pod: Pod, ports: tuple[int, ...], hits: Path) -> subprocess.Popen[bytes]:
    hits.touch()
    proc = lab.spawn(pod.netns, [sys.executable, "-c", ECHO_APP, str(hits), *map(str, ports)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if b"ready" not in line:
        raise RuntimeError(f"echo app in {pod.name} did not start")
    return proc


def http_in_netns(
    netns: str,
    hostname: str,
    *,
    n: int = 1,
    ip: str = "127.0.0.1",
    port: int = 18080,
    pause: float = 0.0,
    timeout: float = 120.0,
) -> list[tuple[int, str]]:
    """GET http://<ip>:<port>/ with `Host: hostname`, n times on one keep-alive connection, from inside `netns`."""
    out = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c", CLIENT, ip, str(port), hostname, str(n), str(pause)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(f"client in {netns} failed: {out.stderr.strip()}")
    return [(int(s), b) for s, b in json.loads(out.stdout)]


def start_client(
    lab: Lab, netns: str, hostname: str, *, n: int, ip: str = "127.0.0.1", port: int = 18080, pause: float = 0.0
) -> subprocess.Popen[bytes]:
    """The same client in the background (for traffic during a rotation); read its stdout when it exits."""
    return lab.spawn(
        netns, [sys.executable, "-c", CLIENT, ip, str(port), hostname, str(n), str(pause)], stdout=subprocess.PIPE
    )


def client_result(proc: subprocess.Popen[bytes], timeout: float = 120.0) -> list[tuple[int, str]]:
    stdout, _ = proc.communicate(timeout=timeout)
    return [(int(s), b) for s, b in json.loads(stdout.decode())]


def xfcc_uri(body: str) -> str | None:
    """The `URI=` of the app's XFCC header (the last element: the hop that reached it)."""
    xfcc = json.loads(body).get("xfcc")
    if not xfcc:
        return None
    m = re.search(r"URI=([^;,]+)", xfcc.split(",")[-1])
    return m.group(1) if m else None


def wait_until(pred: Any, timeout: float = 30.0, what: str = "condition", interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
