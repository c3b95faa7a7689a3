"""DNS through the mesh vs direct with programs nobody here wrote, in one run (needs root: netns, nftables).

    .venv/bin/python -m bench.udp_dns [--seconds S] [--rounds R] [--clients C] [--concurrency N] [--skip-sweep]
                                      [--sidecar-arg ARG ...] [--kernel]

One node netns with Envoy 1.40 served by the sidecar, one client pod (tproxy capture), a dnsmasq backend pod and an
iperf3 server pod. "direct" dials the backend pod's IP; "mesh" dials the Service VIP on 18082.

1. dnsperf (Debian) against dnsmasq, R interleaved pairs of S seconds (`who.test A`, and `big.test TXT` with EDNS:
   a ~3 KB answer): queries per second and lost queries per arm, the mesh/direct ratio per pair and its median.
2. The datagram-size sweep with iperf3 (Debian): for each size from 64 B to 65,507 B, a UDP stream at a fixed offered
   rate client -> server and server -> client (`-R`), mesh and direct back to back: what the receiver got and lost.
   iperf3's control connection is TCP on the same port, so the Service has a raw TCP arm too (the TCP floor).

Goal (issue 11): dnsperf mesh/direct >= 0.7x on 2 cores without losing any size or flow.

`--kernel` (issue 29) runs instead direct vs the in-kernel UDP path vs Envoy, ping-pong and dnsperf in one run: an
echo backend pod joins, and the client pod's netns is programmed with table `ip aether_udp`
(`aether.netns.kernel_udp_install.program_kernel_udp`) for two more VIPs, one to each backend (dnsmasq and the
echo), which Envoy's listener never sees. Each of R rounds runs every measure (ping-pong at 1 and at 32 in flight,
dnsperf A and TXT) as a triple of direct, kernel and Envoy back to back (ping-pong `--pingpong-triples` times: its
runs are short), the triple's order rotated per round; the ratios are taken per triple and their medians printed,
with the load average at the start and the end.
Goal (issue 29): kernel >= 0.9x direct on both ping-pong and dnsperf.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from aether.api.naming import tcp_cluster
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.netns.kernel_udp import KernelArm, KernelBackend
from aether.netns.kernel_udp_install import program_kernel_udp
from aether.testing.netlab import Lab, Pod, is_root
from aether.testing.nodebed import NodeBed, Service, udp_socket_in, wait_reply
from aether.testing.udp_clients import (
    BIG_TXT_NAME,
    WHO_NAME,
    add_app_backend,
    dig,
    dnsmasq_argv,
    dnsperf,
    iperf3,
    iperf3_server_argv,
)
from aether.testing.wait import wait_for
from bench.cpu_latency import cpu_latency
from bench.xds_udp_path import pingpong_run, ratios_of, restart_sidecar

DNS_VIP, IPERF_VIP = "10.96.60.1", "10.96.60.2"
ECHO_VIP = "10.96.60.3"  # --kernel: the udp_echo Service's Envoy arm (ping-pong)
DNS_KVIP, ECHO_KVIP = "10.96.60.11", "10.96.60.13"  # --kernel: the same backends through table `ip aether_udp`
DNS_IP, IPERF_IP = "10.202.1.2", "10.202.1.3"
PORT = 7000
IPERF_PORT = 5201
SIZES = (64, 512, 1452, 1453, 1500, 4096, 9000, 16384, 32768, 65507)


def _answers(netns: str, host: str, port: int) -> list[str]:
    return dig(netns, host, port, WHO_NAME).answers


def switch_sidecar(bed: NodeBed, flags: list[str]) -> None:
    """Restart the sidecar with `flags` and wait until Envoy has the listeners they make (nothing warming)."""
    if bed.sidecar_args == flags:
        return
    restart_sidecar(bed, flags)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.udp_dns")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clients", type=int, default=8, help="dnsperf -c")
    p.add_argument("--sweep-seconds", type=float, default=1.0)
    p.add_argument("--rate", default="50M", help="iperf3 -b for the size sweep")
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--concurrency", type=int, default=1, help="Envoy --concurrency (worker threads)")
    p.add_argument("--sidecar-arg", action="append", default=[], help="extra `aether xds` flag (repeat)")
    p.add_argument("--kernel", action="store_true", help="direct vs in-kernel vs Envoy: ping-pong and dnsperf")
    p.add_argument("--pingpong-seconds", type=float, default=0.3, help="--kernel: length of one ping-pong run")
    p.add_argument("--pingpong-triples", type=int, default=3, help="--kernel: ping-pong triples per round")
    p.add_argument(
        "--cpu-latency-us",
        type=int,
        default=0,
        help="--kernel: hold this wake-up latency request (/dev/cpu_dma_latency) for the run; -1: none "
        "(bench.cpu_latency says why)",
    )
    p.add_argument(
        "--versus",
        action="append",
        default=[],
        help="a second set of `aether xds` flags (repeat) that changes the capture listener: each round runs both "
        "sets, the sidecar restarted between them",
    )
    args = p.parse_args(argv)
    if not is_root():
        print("bench.udp_dns: needs root (network namespaces, nftables)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp, Lab() as lab:
        work = Path(tmp)
        bed = NodeBed(lab, work, sidecar_args=args.sidecar_arg, envoy_args=["--concurrency", str(args.concurrency)])
        client = bed.add_client("client-0")
        dns = add_app_backend(bed, "dns", DNS_VIP, DNS_IP, PORT, dnsmasq_argv(DNS_IP, PORT, "192.0.2.9", work))
        perf = add_app_backend(bed, "iperf", IPERF_VIP, IPERF_IP, IPERF_PORT, iperf3_server_argv(IPERF_IP, IPERF_PORT))
        echo = bed.add_service("echo", ECHO_VIP) if args.kernel else None
        node = bed.meshnode()
        tcp = perf.arm().model_copy(update={"cluster": tcp_cluster("default", "iperf")})
        node.status.tcp.services = [tcp]
        bed.write_state(node)
        bed.start_sidecar()
        bed.start_envoy()
        bed.wait_programmed()
        for host, port in ((DNS_IP, PORT), (DNS_VIP, L4_OUTBOUND_PORT)):
            wait_for(partial(_answers, client.netns, host, port), what=f"dnsmasq at {host}:{port}")
        if echo is not None:
            with cpu_latency(None if args.cpu_latency_us < 0 else args.cpu_latency_us) as held:
                print(f"  wake-up latency request: {f'{args.cpu_latency_us} us, held' if held else 'none'}")
                kernel_run(client, dns, echo, work, args)
            return 0
        head = f"bench.udp_dns: {args.rounds} pairs of {args.seconds:g}s, dnsperf -c {args.clients}"
        print(f"{head}, Envoy --concurrency {args.concurrency}")
        print(f"  sidecar flags: {' '.join(args.sidecar_arg) or '(defaults)'}")
        configs = [("defaults" if not args.sidecar_arg else " ".join(args.sidecar_arg), list(args.sidecar_arg))]
        if args.versus:
            configs.append((" ".join(args.versus), list(args.versus)))
        for label, line, edns in (
            ("A who.test", f"{WHO_NAME} A", False),
            ("TXT big.test (~3 KB, EDNS)", f"{BIG_TXT_NAME} TXT", True),
        ):
            data = work / "queries.txt"
            data.write_text(line + "\n")
            extra = ["-e"] if edns else []
            ratios: dict[str, list[float]] = {name: [] for name, _ in configs}
            lost: dict[str, int] = {name: 0 for name, _ in configs}
            qps: dict[str, list[float]] = {f"{name}/{arm}": [] for name, _ in configs for arm in ("direct", "mesh")}
            for _ in range(args.rounds):
                for name, flags in configs:
                    if len(configs) > 1:
                        switch_sidecar(bed, flags)
                    got = {}
                    for arm, (host, port) in (
                        ("direct", (dns.backend.ip, PORT)),
                        ("mesh", (dns.vip, L4_OUTBOUND_PORT)),
                    ):
                        r = dnsperf(client.netns, host, port, data, args.seconds, args.clients, extra)
                        qps[f"{name}/{arm}"].append(r.qps)
                        lost[name] += r.lost
                        got[arm] = r.qps
                    ratios[name].append(got["mesh"] / got["direct"] if got["direct"] else 0.0)
            print(f"  dnsperf {label}:")
            for name, _ in configs:
                dq, mq, rs = (
                    statistics.median(qps[f"{name}/direct"]),
                    statistics.median(qps[f"{name}/mesh"]),
                    ratios[name],
                )
                print(f"    [{name}] direct {dq:9.0f} q/s   mesh {mq:9.0f} q/s   lost {lost[name]}")
                print(
                    f"    [{name}] mesh/direct median {statistics.median(rs):.3f} (min {min(rs):.3f}, max {max(rs):.3f})"
                )
        if args.skip_sweep:
            return 0
        print(f"  size sweep (iperf3 -u -b {args.rate}, {args.sweep_seconds:g}s per run; receiver's view):")
        print(f"    {'bytes':>6} {'dir':>3} {'direct Mbit/s':>13} {'lost%':>6} {'mesh Mbit/s':>11} {'lost%':>6}")
        for size in SIZES:
            for reverse in (False, True):
                d = iperf3(client.netns, perf.backend.ip, IPERF_PORT, size, args.sweep_seconds, args.rate, reverse)
                m = iperf3(client.netns, perf.vip, L4_OUTBOUND_PORT, size, args.sweep_seconds, args.rate, reverse)
                arrow = "<-" if reverse else "->"
                print(
                    f"    {size:>6} {arrow:>3} {d.received_bps / 1e6:>13.1f} {d.lost_percent:>6.2f}"
                    f" {m.received_bps / 1e6:>11.1f} {m.lost_percent:>6.2f} {d.error or m.error}"
                )
    return 0


def kernel_run(client: Pod, dns: Service, echo: Service, work: Path, args: argparse.Namespace) -> None:
    """`--kernel`: every measure as a triple direct, kernel, Envoy in each round (see the module docstring)."""
    arms = [KernelArm(v, (KernelBackend(s.backend.ip, s.port, 1),)) for v, s in ((DNS_KVIP, dns), (ECHO_KVIP, echo))]
    program_kernel_udp(client.path, arms)
    wait_for(partial(_answers, client.netns, DNS_KVIP, L4_OUTBOUND_PORT), what="dnsmasq through the kernel path")
    for vip in (ECHO_VIP, ECHO_KVIP):
        sock = udp_socket_in(client.path)
        try:
            wait_reply(sock, vip, b"echo|", timeout=30)
        finally:
            sock.close()
    queries = {"A": (work / "a.txt", []), "TXT": (work / "txt.txt", ["-e"])}
    queries["A"][0].write_text(f"{WHO_NAME} A\n")
    queries["TXT"][0].write_text(f"{BIG_TXT_NAME} TXT\n")
    pp = args.pingpong_seconds
    lost = {"A": 0, "TXT": 0}

    def dnsperf_qps(kind: str) -> Callable[[str, int], float]:
        data, extra = queries[kind]

        def run(host: str, port: int) -> float:
            r = dnsperf(client.netns, host, port, data, args.seconds, args.clients, extra)
            lost[kind] += r.lost
            return r.qps

        return run

    measures: list[tuple[str, Callable[[str, int], float], list[tuple[str, int]]]] = [
        (f"ping-pong, {n} in flight", partial(_pingpong, client.path, pp, n), _dests(echo, ECHO_KVIP, ECHO_VIP))
        for n in (1, 32)
    ]
    measures += [
        ("dnsperf A who.test", dnsperf_qps("A"), _dests(dns, DNS_KVIP, DNS_VIP)),
        ("dnsperf TXT big.test (~3 KB, EDNS)", dnsperf_qps("TXT"), _dests(dns, DNS_KVIP, DNS_VIP)),
    ]
    for _, run, dests in measures[:2]:  # an unmeasured warm-up triple for ping-pong (a dnsperf run lasts seconds)
        [run(*d) for d in dests]
    load0 = os.getloadavg()
    triples: dict[str, list[list[float]]] = {label: [] for label, _, _ in measures}
    for rnd in range(args.rounds):
        for n, (label, run, dests) in enumerate(measures):
            for _ in range(args.pingpong_triples if n < 2 else 1):  # ping-pong runs are short: more of them
                order = [(rnd + i) % 3 for i in range(3)]  # rotated: no arm always runs first
                got = [0.0, 0.0, 0.0]
                for i in order:
                    got[i] = run(*dests[i])
                triples[label].append(got)
    load1 = os.getloadavg()
    head = f"bench.udp_dns --kernel: {args.rounds} rounds; ping-pong {args.pingpong_triples} triples of {pp:g}s runs"
    print(f"{head} per round (64 B, Python client, udp_echo),")
    print(
        f"  dnsperf {args.seconds:g}s runs (-c {args.clients}, dnsmasq); load average {_load(load0)} -> {_load(load1)}"
    )
    print("| measure | direct | kernel | Envoy | kernel/direct (min-max) | Envoy/direct |\n|---|---|---|---|---|---|")
    for label, rows in triples.items():
        d, k, e, kd, ed = ratios_of(rows)
        ks = [t[1] / t[0] if t[0] else 0.0 for t in rows]
        print(f"| {label} | {d:.0f} | {k:.0f} | {e:.0f} | {kd:.3f} ({min(ks):.2f}-{max(ks):.2f}) | {ed:.3f} |")
    print(f"  dnsperf queries lost over all its runs: A {lost['A']}, TXT {lost['TXT']}")


def _pingpong(client: str, seconds: float, inflight: int, host: str, port: int) -> float:
    return pingpong_run(client, (host, port), seconds, inflight)


def _dests(svc: Service, kernel_vip: str, envoy_vip: str) -> list[tuple[str, int]]:
    """direct (the backend pod's address and app port), kernel, Envoy: in that order."""
    return [(svc.backend.ip, svc.port), (kernel_vip, L4_OUTBOUND_PORT), (envoy_vip, L4_OUTBOUND_PORT)]


def _load(avg: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in avg)


if __name__ == "__main__":
    sys.exit(main())
