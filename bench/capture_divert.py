"""The divert's own cost: UDP ping-pong rate to a transparent socket through mark-and-divert vs direct, same run.

Run as root from the repository root: `.venv/bin/python -m bench.capture_divert [--rounds 7] [--pings 3000]`.

One pod netns (Lab: eth0, /32, default route) with the tproxy capture installed by `install_capture`. An echo server
(its own process, inside the pod netns) holds one transparent UDP socket on 0.0.0.0:18082 and answers every datagram
from the address its header carried (IP_PKTINFO -> ipi_spec_dst). Two clients in the pod netns ping it one datagram
at a time (both ends pinned to one CPU by default): "divert" dials a VIP that exists nowhere (so the capture marks it and the local route delivers it),
"direct" dials the pod's own IP (local: `fib daddr type != local` leaves it alone). Each round alternates the two
paths in short chunks; the figure is the median of the per-round rate ratios divert/direct. Target: >= 0.7x.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

from aether.netns.contract import L4_OUTBOUND_PORT
from aether.netns.install import check_capture, install_capture
from aether.netns.nsthread import call_in_netns
from aether.testing.netlab import Lab
from aether.testing.tproxy_socket import recv_pktinfo, send_from, transparent_udp_socket

VIP = "10.96.7.7"
POD_IP = "10.202.0.2"


def serve(port: int) -> int:
    """The echo server (runs inside the pod netns): reply from the header's destination, until b'quit'."""
    sock = transparent_udp_socket(port)
    print("ready", flush=True)
    while True:
        dgram = recv_pktinfo(sock)
        if dgram.data == b"quit":
            return 0
        reply = dgram.data + b"|" + (dgram.dst or "?").encode()
        send_from(sock, reply, dgram.source, dgram.dst)


def ping_rate(client: socket.socket, pings: int, want_dst: str) -> tuple[float, float]:
    """(round trips per second, median RTT in microseconds) for `pings` sequential round trips."""
    rtts: list[float] = []
    payload = b"p" * 32
    t0 = time.perf_counter()
    for _ in range(pings):
        t = time.perf_counter()
        client.send(payload)
        data = client.recv(2048)
        rtts.append(time.perf_counter() - t)
        if not data.endswith(want_dst.encode()):
            raise SystemExit(f"the server saw {data.split(b'|')[-1]!r}, expected {want_dst}: the rig is wrong")
    elapsed = time.perf_counter() - t0
    return pings / elapsed, statistics.median(rtts) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--pings", type=int, default=10000, help="round trips per path per round")
    ap.add_argument("--chunk", type=int, default=250, help="round trips per path before switching paths")
    ap.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1, help="pin both ends (-1: no)")
    ap.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        return serve(args.serve)
    if os.geteuid() != 0:
        print("bench.capture_divert needs root (network namespaces, nftables)", file=sys.stderr)
        return 2
    port = L4_OUTBOUND_PORT
    with Lab() as lab:
        node = lab.add_node("n")
        pod = lab.add_pod(node, "p", POD_IP)
        install_capture(pod.path)
        check_capture(pod.path)
        server = lab.spawn(
            pod.netns,
            [sys.executable, "-m", "bench.capture_divert", "--serve", str(port)],
            stdout=subprocess.PIPE,
            cwd=os.getcwd(),
        )
        assert server.stdout is not None
        if server.stdout.readline().strip() != b"ready":
            raise SystemExit("the echo server did not start")

        def client(dst: str) -> socket.socket:
            def make() -> socket.socket:
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.connect((dst, port))
                s.settimeout(5.0)
                return s

            return call_in_netns(pod.path, make)

        divert, direct = client(VIP), client(POD_IP)
        if args.cpu >= 0:  # one CPU for both ends: a hand-off is a context switch, not a cross-CPU wake-up
            os.sched_setaffinity(0, {args.cpu})
            os.sched_setaffinity(server.pid, {args.cpu})
        ping_rate(divert, 500, VIP)  # warm-up
        ping_rate(direct, 500, POD_IP)
        ratios: list[float] = []
        d_rates: list[float] = []
        n_rates: list[float] = []
        d_rtts: list[float] = []
        n_rtts: list[float] = []
        for r in range(args.rounds):
            # each round is many short alternating chunks, so both paths see the same machine load
            t_div = t_dir = 0.0
            rtt_div: list[float] = []
            rtt_dir: list[float] = []
            chunks = max(1, args.pings // args.chunk)
            for c in range(chunks):
                order = [("divert", divert, VIP), ("direct", direct, POD_IP)]
                if c % 2:
                    order.reverse()
                for name, sock, dst in order:
                    rate, rtt = ping_rate(sock, args.chunk, dst)
                    if name == "divert":
                        t_div += args.chunk / rate
                        rtt_div.append(rtt)
                    else:
                        t_dir += args.chunk / rate
                        rtt_dir.append(rtt)
            n = chunks * args.chunk
            d_rates.append(n / t_div)
            n_rates.append(n / t_dir)
            d_rtts.append(statistics.median(rtt_div))
            n_rtts.append(statistics.median(rtt_dir))
            ratios.append(d_rates[-1] / n_rates[-1])
            print(
                f"round {r + 1}: divert {d_rates[-1]:8.0f}/s  direct {n_rates[-1]:8.0f}/s  ratio {ratios[-1]:.3f}",
                flush=True,
            )
        divert.send(b"quit")
        divert.close()
        direct.close()
        lab.stop(server)

    print(f"rounds={args.rounds} pings/round/path={args.pings}")
    print(
        f"divert: median {statistics.median(d_rates):8.0f} round trips/s, median RTT {statistics.median(d_rtts):6.1f} us"
    )
    print(
        f"direct: median {statistics.median(n_rates):8.0f} round trips/s, median RTT {statistics.median(n_rtts):6.1f} us"
    )
    print(
        f"divert/direct rate ratio: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
