"""Test and benchmark plumbing for the east-west data path: the real Envoy per node netns, served over delta ADS by
`aether.xds.ads.server` on a unix socket (`aether.testing.envoy` starts it), the HTTP echo app
(`aether.testing.http_echo`) in pods, and HTTP clients run inside pod netns.

Everything is started through an `aether.testing.netlab.Lab`, so it is cleaned up with the lab.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from aether.testing import envoy
from aether.testing.envoy import Envoy
from aether.testing.netlab import Lab, Pod
from aether.xds.ads.cache import SnapshotCache, make_snapshot
from aether.xds.ads.server import DeltaAdsServer, serve
from aether.xds.resources import Resources, merge
from aether.xds.sidecar.bootstrap import ads_bootstrap

# Sends N GETs on one keep-alive connection (reconnecting after an error); prints one JSON line with
# [[status, body], ...]; status 0 = connection-level failure (body has the error).
CLIENT = r"""
import http.client, json, sys, time
host, port, hostname, n, pause = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
extra = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {}
out = []
conn = None
for i in range(n):
    try:
        if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/", headers={"Host": hostname, **extra})
        r = conn.getresponse()
        out.append([r.status, r.read().decode(errors="replace")])
    except Exception as exc:
        out.append([0, repr(exc)])
        if conn is not None:
            conn.close()
        conn = None
    if pause:
        time.sleep(pause)  # pacing: requests spread over time (traffic during a change), not synchronisation
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


class AdsHarness:
    """The real delta-ADS server on a unix socket, one snapshot per node id."""

    def __init__(self, workdir: Path) -> None:
        self.cache = SnapshotCache()
        self.servicer = DeltaAdsServer(self.cache, sent_log_size=10_000)  # benches index into the whole log
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
) -> Envoy:
    """Node `node_id`'s Envoy in `netns`, on delta ADS from `ads`; files named after the node in `workdir`."""
    admin = workdir / f"admin-{node_id}.sock"
    boot = ads_bootstrap(node_id, f"unix:{ads.socket_path}", f"unix:{admin}")
    if runtime:
        boot["layered_runtime"] = {
            "layers": [{"name": "static", "static_layer": runtime}, {"name": "admin", "admin_layer": {}}]
        }
    args = ["--concurrency", str(concurrency), "--drain-time-s", str(drain_time_s)]
    return envoy.start_envoy(
        boot, workdir, name=f"envoy-{node_id}", lab=lab, netns=netns, args=args, log_level=log_level
    )


def start_echo(
    lab: Lab, pod: Pod, ports: tuple[int, ...], hits: Path, *, one_write: bool = False
) -> subprocess.Popen[bytes]:
    """`aether.testing.http_echo` in `pod` on `ports` (HTTP and UDP), every hit logged to `hits`."""
    hits.touch()
    argv = [sys.executable, "-m", "aether.testing.http_echo", pod.name, *map(str, ports), "--hits", str(hits), "--udp"]
    proc = lab.spawn(pod.netns, [*argv, *(["--one-write"] if one_write else [])], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    if b"ready" not in proc.stdout.readline():
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
    headers: dict[str, str] | None = None,
) -> list[tuple[int, str]]:
    """GET http://<ip>:<port>/ with `Host: hostname` (and `headers`), n times on one keep-alive connection, from
    inside `netns`."""
    argv = [sys.executable, "-c", CLIENT, ip, str(port), hostname, str(n), str(pause), json.dumps(headers or {})]
    out = subprocess.run(
        ["ip", "netns", "exec", netns, *argv],
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
