"""End-to-end propagation through the whole mesh: an API write -> the operator -> MeshNode -> the sidecar -> Envoy
-> where a pod's datagrams go. Run as root from the repository root:

    .venv/bin/python -m bench.e2e_propagation [--flips 20] [--debounce SECONDS]

One node of the e2e harness (API test bed, `aether operator`, `aether xds` in cluster mode, real Envoy), a client
pod, two echo backends, Services alpha and bravo and a UDPRoute on alpha. Two kinds of change, interleaved in one
run: re-pointing the UDPRoute (alpha -> bravo's backend and back) and replacing the Service's EndpointSlice (the
route removed, alpha's endpoint swapped between the two backend pods). For each change: the time from the API
write returning to the first datagram the new backend answers (probed every ~5 ms). Also printed: the time from
start to the mesh answering its first datagram.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time

from aether.e2e.harness import BACKEND_PORT, Mesh
from aether.testing.netlab import is_root
from aether.testing.probe import ask, pod_socket, wait_answer


def until_answered_by(sock: socket.socket, vip: str, backend: str, timeout: float = 30.0) -> float:
    t0 = time.monotonic()
    i = 0
    while time.monotonic() - t0 < timeout:
        i += 1
        if ask(sock, vip, f"p{i}".encode()).backend == backend:
            return time.monotonic() - t0
    raise TimeoutError(f"{vip} not answered by {backend} within {timeout}s")


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench.e2e_propagation")
    p.add_argument("--flips", type=int, default=20, help="changes of each kind")
    p.add_argument("--debounce", type=float, help="the operator's --debounce (its default when absent)")
    args = p.parse_args(argv)
    if not is_root():
        print("bench.e2e_propagation: needs root", file=sys.stderr)
        return 1
    t_start = time.monotonic()
    extra = ("--debounce", str(args.debounce)) if args.debounce is not None else ()
    with Mesh(namespace="bench", operator_args=extra) as mesh:
        node = mesh.add_node("node-1")
        mesh.start_node_proxies()
        client = mesh.add_pod(node, "client")
        a, b = mesh.add_backend(node, "echo-a"), mesh.add_backend(node, "echo-b")
        vip = mesh.add_service("alpha", ["echo-a"])
        mesh.add_service("bravo", ["echo-b"])
        first = wait_answer(client.netns_path, vip, "echo-a", timeout=60)
        assert first.backend == "echo-a", first
        ready = time.monotonic() - t_start
        sock = pod_socket(client.netns_path, timeout=0.005)
        route: list[float] = []
        slices: list[float] = []
        try:
            for i in range(args.flips):
                # a UDPRoute on alpha: to bravo (echo-b) and back to alpha (echo-a)
                if i == 0:
                    mesh.add_route("alpha-route", "alpha", "bravo")
                else:
                    mesh.repoint_route("alpha-route", "bravo")
                route.append(until_answered_by(sock, vip, "echo-b"))
                mesh.repoint_route("alpha-route", "alpha")
                route.append(until_answered_by(sock, vip, "echo-a"))
                # the EndpointSlice of alpha itself: its endpoint moves to echo-b and back (route re-pointed
                # to alpha, so the arm follows alpha's own endpoints)
                mesh.kube.endpoint_slice("bench", "alpha", BACKEND_PORT, [(b.ip, b.name)])
                slices.append(until_answered_by(sock, vip, "echo-b"))
                mesh.kube.endpoint_slice("bench", "alpha", BACKEND_PORT, [(a.ip, a.name)])
                slices.append(until_answered_by(sock, vip, "echo-a"))
        finally:
            sock.close()
    ms = 1000.0
    print(f"mesh start -> first datagram answered: {ready:.1f} s")
    print(f"{'change':<28} {'n':>3} {'p50':>8} {'p90':>8} {'max':>8}")
    for name, xs in (("UDPRoute re-point", route), ("EndpointSlice replace", slices)):
        print(
            f"{name:<28} {len(xs):>3} {statistics.median(xs) * ms:>6.0f}ms {pct(xs, 0.9) * ms:>6.0f}ms "
            f"{max(xs) * ms:>6.0f}ms"
        )
    print(f"route/slice p50 ratio: {statistics.median(route) / statistics.median(slices):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
