"""UDP ping-pong through the capture + Envoy vs direct, in one run (needs root: netns, nftables).

    .venv/bin/python -m bench.xds_udp_path [--seconds S] [--rounds R]

One client pod (capture in tproxy mode), one echo backend pod, a node netns holding Envoy 1.40 served by the
sidecar. "direct" dials the backend's pod IP; "mesh" dials the VIP on 18082 (divert -> Envoy's transparent
listener in the pod netns -> udp_proxy matcher -> the backend). Rates are replies per second of a Python
client, at 1 and at 32 datagrams in flight, with 1 and with 10,000 matcher arms (the 9,999 extra VIPs name a
second cluster), then the Envoy knobs one at a time. Each figure is a median over R back-to-back pairs.
`--ipv6` adds, in the same run, the same pairs over IPv6: the client dials the backend's IPv6 address (direct) and
an IPv6 VIP on 18082 (mesh, through the pod's [::]:18082 capture listener), interleaved with the IPv4 rows.
Targets (issue 3): mesh >= 0.45x direct at 1 in flight, >= 0.6x at 32; 10,000 arms within 10% of 1 arm.
`--kernel` adds (first, with 1 arm) direct vs the in-kernel UDP path vs Envoy in one run (issue 29): a second VIP
programmed into the client pod's netns as table `ip aether_udp` (aether.netns.kernel_udp) to the same backend,
each round a direct, a kernel and an Envoy run back to back; `--kernel-only` stops after those rows.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from aether.api.meshnode import Endpoint, ServiceArm
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.netns.kernel_udp import KernelArm, KernelBackend
from aether.netns.kernel_udp_install import program_kernel_udp
from aether.testing.netlab import Lab, is_root
from aether.testing.nodebed import NodeBed, Service, udp_socket_in, wait_reply
from aether.testing.probe import pod_socket
from aether.testing.wait import wait_for

VIP = "10.96.50.1"
VIP6 = "fd00:96:50::1"
VIP_KERNEL = "10.96.50.2"  # the in-kernel path's VIP (--kernel): not an arm of Envoy's listener
PORT = 5353


RCVTIMEO_200MS = struct.pack("ll", 0, 200_000)


def pingpong(sock: socket.socket, seconds: float, inflight: int, payload: bytes, lean: bool = False) -> float:
    """Replies per second with `inflight` datagrams outstanding (a lost one is replaced after 0.2 s).

    Default: Python's own timeout (`settimeout`), which polls before every recv and every send. lean: a blocking
    socket with SO_RCVTIMEO, one recv and one send syscall per reply. Both arms always get the same loop."""
    if lean:
        sock.settimeout(None)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, RCVTIMEO_200MS)
        lost: type[OSError] = BlockingIOError  # EAGAIN once SO_RCVTIMEO expires
    else:
        sock.settimeout(0.2)
        lost = TimeoutError
    for _ in range(inflight):
        sock.send(payload)
    got = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        try:
            sock.recv(4096)
            got += 1
        except lost:
            pass
        sock.send(payload)
    return got / seconds


def measure(
    bed: NodeBed,
    svc: Service,
    seconds: float,
    rounds: int,
    inflight: int,
    size: int,
    lean: bool = False,
    ipv6: bool = False,
) -> tuple[float, float, float]:
    """(direct, mesh, mesh/direct): medians over `rounds` short paired runs (direct then mesh, back to back, so
    both see the same load on this shared machine; the ratio is taken per pair). A fresh connected socket per
    run; one unmeasured warm-up pair first."""
    payload = b"x" * size
    client = bed.clients["bench-client"].path

    def run(dest: tuple[str, int]) -> float:
        sock = pod_socket(client, 1.0, socket.AF_INET6) if ipv6 else udp_socket_in(client)
        try:
            sock.connect(dest)
            return pingpong(sock, seconds, inflight, payload, lean)
        finally:
            sock.close()

    direct_dest, mesh_dest = (svc.backend.ip, svc.port), (VIP, L4_OUTBOUND_PORT)
    if ipv6:
        direct_dest, mesh_dest = (str(svc.backend.ip6), svc.port), (VIP6, L4_OUTBOUND_PORT)
    run(direct_dest), run(mesh_dest)
    pairs = [(run(direct_dest), run(mesh_dest)) for _ in range(rounds)]
    return (
        statistics.median(d for d, _ in pairs),
        statistics.median(m for _, m in pairs),
        statistics.median(m / d for d, m in pairs),
    )


def pingpong_run(client: str, dest: tuple[str, int], seconds: float, inflight: int, size: int = 64) -> float:
    """One ping-pong run from a fresh socket made in the netns at `client`, connected to `dest`: replies/s."""
    sock = udp_socket_in(client)
    try:
        sock.connect(dest)
        return pingpong(sock, seconds, inflight, b"x" * size)
    finally:
        sock.close()


def ratios_of(triples: list[list[float]]) -> list[float]:
    """[direct, kernel, envoy, kernel/direct, envoy/direct]: the medians of per-triple figures (each ratio taken
    within its own triple, so the three arms of a ratio saw the same moment's load)."""
    medians = [statistics.median(t[i] for t in triples) for i in range(3)]
    return medians + [statistics.median(t[i] / t[0] if t[0] else 0.0 for t in triples) for i in (1, 2)]


def measure3(bed: NodeBed, svc: Service, seconds: float, rounds: int, inflight: int) -> list[float]:
    """`ratios_of` `rounds` triples (direct, kernel, Envoy) run back to back, after one unmeasured warm-up triple."""
    client = bed.clients["bench-client"].path
    dests = [(svc.backend.ip, svc.port), (VIP_KERNEL, L4_OUTBOUND_PORT), (VIP, L4_OUTBOUND_PORT)]
    [pingpong_run(client, d, seconds, inflight) for d in dests]
    return ratios_of([[pingpong_run(client, d, seconds, inflight) for d in dests] for _ in range(rounds)])


def kernel_rows(bed: NodeBed, svc: Service, seconds: float, rounds: int) -> None:
    client = bed.clients["bench-client"].path
    program_kernel_udp(client, [KernelArm(VIP_KERNEL, (KernelBackend(svc.backend.ip, svc.port, 1),))])
    s = udp_socket_in(client)
    try:
        wait_reply(s, VIP_KERNEL, b"echo|", timeout=30)
    finally:
        s.close()
    print("| in flight | direct /s | kernel /s | Envoy /s | kernel/direct | Envoy/direct |\n|---|---|---|---|---|---|")
    for inflight in (1, 32):
        d, k, e, kd, ed = measure3(bed, svc, seconds, rounds, inflight)
        print(f"| {inflight} | {d:.0f} | {k:.0f} | {e:.0f} | {kd:.2f} | {ed:.2f} |", flush=True)


def arm6(svc: Service) -> ServiceArm:
    """The echo Service's IPv6 VIP: its own cluster (one family per cluster) with the backend's IPv6 address."""
    return ServiceArm(
        service=svc.name,
        vip=VIP6,
        cluster="udp:default/echo@ipv6",
        endpoints=[Endpoint(ip=str(svc.backend.ip6), port=svc.port)],
    )


def arms(svc: Service, extra: int, ipv6: bool = False) -> list[ServiceArm]:
    filler = [
        ServiceArm(
            service=f"default/filler-{i}",
            vip=f"10.97.{i // 250}.{i % 250 + 1}",
            cluster="udp:default/filler",
            endpoints=[Endpoint(ip=svc.backend.ip, port=svc.port)],
        )
        for i in range(extra)
    ]
    return [arm6(svc), *filler] if ipv6 else filler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.xds_udp_path")
    p.add_argument("--seconds", type=float, default=0.3, help="length of one run")
    p.add_argument("--rounds", type=int, default=11, help="paired rounds per figure")
    p.add_argument("--skip-knobs", action="store_true")
    p.add_argument("--kernel", action="store_true", help="also direct vs the in-kernel UDP path vs Envoy")
    p.add_argument("--kernel-only", action="store_true", help="only the --kernel rows")
    p.add_argument("--ipv6", action="store_true", help="also the IPv6 path vs direct IPv6, in the same run")
    p.add_argument(
        "--client",
        choices=["lean", "poll"],
        default="poll",
        help="the client loop of both arms: Python's settimeout, which polls before each call (poll, as in every "
        "recorded run) or a blocking socket with SO_RCVTIMEO (lean)",
    )
    args = p.parse_args(argv)
    if not is_root():
        print("bench.xds_udp_path needs root (network namespaces, nftables)", file=sys.stderr)
        return 2
    lab = Lab()
    try:
        work = Path(tempfile.mkdtemp(prefix="xds-udp-bench-"))
        bed = NodeBed(lab, work, envoy_args=["--concurrency", "1"], ipv6=args.ipv6)
        bed.add_client("bench-client")
        svc = bed.add_service("echo", VIP, PORT)

        def program(extra: int) -> None:
            bed.write_state(bed.meshnode(["echo"], extra_arms=arms(svc, extra, args.ipv6)))
            want = 1 + extra

            def arms_loaded() -> bool:
                dump = bed.admin("/config_dump?resource=dynamic_listeners")
                return dump.count('"udp:default/') >= min(want, 2) and bed.condition().get("status") == "True"

            wait_for(arms_loaded, timeout=120, what=f"{want} arms programmed")
            settled(bed)

        def sock_ready() -> None:
            s = udp_socket_in(bed.clients["bench-client"].path)
            try:
                wait_reply(s, VIP, b"echo|", timeout=60)
            finally:
                s.close()
            if args.ipv6:
                s6 = pod_socket(bed.clients["bench-client"].path, 1.0, socket.AF_INET6)
                try:
                    wait_reply(s6, VIP6, b"echo|", timeout=60)
                finally:
                    s6.close()

        bed.write_state(bed.meshnode(["echo"], extra_arms=arms(svc, 0, args.ipv6)))
        bed.start_sidecar()
        bed.start_envoy()
        bed.wait_programmed()
        sock_ready()
        rows: list[tuple[str, int, int, float, float]] = []
        if args.kernel or args.kernel_only:
            kernel_rows(bed, svc, args.seconds, args.rounds)
        if args.kernel_only:
            return 0

        def row(label: str, inflight: int, size: int = 64) -> None:
            for v6 in (False, True) if args.ipv6 else (False,):
                d, m, ratio = measure(bed, svc, args.seconds, args.rounds, inflight, size, args.client == "lean", v6)
                name = f"{label}{', IPv6' if v6 else ', IPv4' if args.ipv6 else ''}"
                rows.append((name, inflight, size, d, m))
                print(f"| {name} | {inflight} | {size} | {d:.0f} | {m:.0f} | {ratio:.2f} |", flush=True)

        print(
            "| config | in flight | bytes | direct /s | mesh /s | mesh/direct (median of pairs) |\n|---|---|---|---|---|---|"
        )
        for extra, label in ((0, "1 arm"), (9_999, "10,000 arms")):
            program(extra)
            sock_ready()
            for inflight in (1, 32):
                row(f"{label}, concurrency 1", inflight)
        if not args.skip_knobs:
            program(0)
            row("1 arm, concurrency 1, 1200-byte datagrams", 1, 1200)
            knobs: list[tuple[str, Callable[[], None]]] = [
                # the GSO writer is off by default (each knob must change the listener: restart_sidecar waits for it)
                ("1 arm, GSO writer on", lambda: restart_sidecar(bed, ["--udp-gso", "on"])),
                ("1 arm, defaults again", lambda: restart_sidecar(bed, [])),
                ("1 arm, GSO writer on again", lambda: restart_sidecar(bed, ["--udp-gso", "on"])),
                ("1 arm, defaults again", lambda: restart_sidecar(bed, [])),
                ("1 arm, listener GRO off", lambda: restart_sidecar(bed, ["--udp-gro", "off"])),
                ("1 arm, defaults again", lambda: restart_sidecar(bed, [])),
                ("1 arm, upstream GRO off", lambda: restart_sidecar(bed, ["--udp-upstream-gro", "off"])),
                ("1 arm, session idle 5 s", lambda: restart_sidecar(bed, ["--udp-idle-timeout", "5"])),
                ("1 arm, concurrency 2", lambda: restart_envoy(bed, ["--concurrency", "2"])),
            ]
            for label, apply in knobs:
                apply()
                sock_ready()
                for inflight in (1, 32):
                    row(label, inflight)
        cmd = f"--seconds {args.seconds} --rounds {args.rounds} --client {args.client}{' --ipv6' * args.ipv6}"
        print(f"\n(command: .venv/bin/python -m bench.xds_udp_path {cmd}{' --skip-knobs' * args.skip_knobs})")
    finally:
        lab.close()
    return 0


def restart_sidecar(bed: NodeBed, extra: list[str]) -> None:
    bed.stop_sidecar()
    bed.sidecar_args = extra
    before = bed.stats("listener_manager.listener_modified").get("listener_manager.listener_modified", 0)
    bed.start_sidecar()
    wait_for(
        lambda: bed.stats("listener_manager.listener_modified").get("listener_manager.listener_modified", 0) > before,
        timeout=60,
        what="listener updated",
    )
    settled(bed)


def restart_envoy(bed: NodeBed, envoy_args: list[str]) -> None:
    bed.stop_sidecar()
    bed.sidecar_args = []
    bed.start_sidecar()
    bed.stop_envoy()
    bed.envoy_args = envoy_args
    bed.start_envoy()
    bed.wait_programmed()
    settled(bed)


def settled(bed: NodeBed) -> None:
    """After a change: Envoy serves the new listeners (none left warming) before the next figure is measured."""
    wait_for(
        lambda: bed.running_envoy().stat("listener_manager.total_listeners_warming") == 0,
        timeout=60,
        what="no listener warming",
    )


if __name__ == "__main__":
    sys.exit(main())
