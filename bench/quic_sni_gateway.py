"""The QUIC SNI gate's cost on the real Envoy 1.40 (`aether_quic_sni` before `udp_proxy`) against `udp_proxy` alone,
on loopback: `python -m bench.quic_sni_gateway [--datagrams N] [--handshakes N]`. Three arms, interleaved per round:
`udp_proxy` alone; the module as a gate before one round-robin cluster; the module as the gate and as the
cluster's load balancer (per-SNI endpoints, the shape the translator emits: `gateway_quic.py`).

1. Handshake time through the gateway (aioquic client and server), a one-Initial and a three-Initial ClientHello:
   median and max over N handshakes. Without the module every SNI passes; with it the three-Initial one loses its
   first two datagrams and waits for the client's loss recovery.
2. Envoy CPU per forwarded datagram after the decision: one real client Initial (the captured aioquic one, exported
   SNI) opens the session, then N 1,200-byte datagrams from the same socket; Envoy's utime+stime over the datagrams
   `udp_proxy` forwarded (`udp.gw.downstream_sess_rx_datagrams`), both ways of the listener, interleaved runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from aioquic.asyncio.client import connect
from aioquic.asyncio.server import serve
from aioquic.quic.configuration import QuicConfiguration

from aether.testing.envoy import Envoy, start_envoy
from aether.testing.envoy_modules import ROOT, build, free_udp_port, gateway_bootstrap, per_sni_gateway_bootstrap
from aether.testing.wait import wait_for

SNI = "8080.web.default.mesh.local"
LONG_ALPN = ["h3"] + [f"x-aether-test-{i:02d}-" + "p" * 43 for i in range(40)]
INITIAL = ROOT / "envoy-modules" / "quicsni" / "testdata" / "aioquic-short.hex"


def make_cert(workdir: Path) -> tuple[Path, Path]:
    cert, key = workdir / "server.pem", workdir / "server.key"
    argv = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    argv += ["-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={SNI}"]
    argv += ["-addext", f"subjectAltName=DNS:{SNI}"]
    subprocess.run(argv, check=True, capture_output=True)
    return cert, key


async def handshakes(gw: int, srv: int, cert: Path, key: Path, alpn: list[str], n: int) -> list[float]:
    server_config = QuicConfiguration(is_client=False, alpn_protocols=alpn)
    server_config.load_cert_chain(str(cert), str(key))
    server = await serve("127.0.0.1", srv, configuration=server_config)
    times = []
    try:
        for _ in range(n):
            client_config = QuicConfiguration(is_client=True, alpn_protocols=alpn, server_name=SNI)
            client_config.load_verify_locations(str(cert))
            start = time.monotonic()
            async with asyncio.timeout(10), connect("127.0.0.1", gw, configuration=client_config) as client:
                await client.ping()
            times.append(time.monotonic() - start)
    finally:
        server.close()
    return times


def cpu_per_datagram(envoy: Envoy, gw: int, srv: int, n: int) -> float:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", srv))
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
    sink.settimeout(10)
    src = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        initial = bytes.fromhex(INITIAL.read_text().splitlines()[1])
        src.sendto(initial, ("127.0.0.1", gw))
        sink.recv(65536)  # the session is open: the module passed it
        before_rx = envoy.stat("udp.gw.downstream_sess_rx_datagrams")
        payload = b"\x40" + bytes(1199)
        cpu0 = envoy.cpu_seconds()
        for i in range(n):
            src.sendto(payload, ("127.0.0.1", gw))
            if i % 64 == 63:
                time.sleep(0.0005)  # stay under the socket buffers: count what Envoy forwards, not drops
        # until the count settles: on a loaded machine the kernel drops some datagrams before Envoy sees them
        # (not Envoy's CPU), so the cost is per datagram udp_proxy actually forwarded
        seen = [-1]

        def settled() -> bool:
            now = envoy.stat("udp.gw.downstream_sess_rx_datagrams")
            done = now == seen[0]
            seen[0] = now
            return done

        wait_for(settled, 30, "the forwarded count to settle", 0.5)
        cpu = envoy.cpu_seconds() - cpu0
        forwarded = envoy.stat("udp.gw.downstream_sess_rx_datagrams") - before_rx
        if forwarded < n // 2:
            raise RuntimeError(f"only {forwarded} of {n} datagrams forwarded: the machine is too loaded to measure")
        return cpu / forwarded
    finally:
        src.close()
        sink.close()


ARMS = ("udp_proxy only", "module gate", "module gate+lb")


def run(arm: str, workdir: Path, args: argparse.Namespace, cert: Path, key: Path) -> dict[str, float]:
    gw, srv = free_udp_port(), free_udp_port()
    if arm == "module gate+lb":
        boot = per_sni_gateway_bootstrap(workdir / "admin.sock", gw, {SNI: srv})
    else:
        boot = gateway_bootstrap(workdir / "admin.sock", gw, srv, [SNI], with_module=arm == "module gate")
    envoy = start_envoy(boot, workdir, name="gw", args=["--concurrency", "1"])
    try:
        short = asyncio.run(handshakes(gw, srv, cert, key, ["h3"], args.handshakes))
        long = asyncio.run(handshakes(gw, srv, cert, key, LONG_ALPN, args.handshakes))
        return {
            "short_p50_ms": statistics.median(short) * 1e3,
            "short_max_ms": max(short) * 1e3,
            "long_p50_ms": statistics.median(long) * 1e3,
            "long_max_ms": max(long) * 1e3,
            "cpu_us_per_datagram": cpu_per_datagram(envoy, gw, srv, args.datagrams) * 1e6,
        }
    finally:
        envoy.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--datagrams", type=int, default=50_000)
    parser.add_argument("--handshakes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"] = str(build())
    with tempfile.TemporaryDirectory(prefix="aether-bench-quic-sni-") as tmp:
        workdir = Path(tmp)
        cert, key = make_cert(workdir)
        for r in range(args.rounds):
            for i, arm in enumerate(ARMS):
                figures = run(arm, workdir / f"{r}-{i}", args, cert, key)
                shown = ", ".join(f"{k} {v:.2f}" for k, v in figures.items())
                print(f"round {r} {arm:15s}: {shown}", flush=True)


if __name__ == "__main__":
    main()
