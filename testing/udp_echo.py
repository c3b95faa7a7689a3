"""The UDP backend of the e2e tests, the xDS tests and the benchmarks: a UDP server that answers every datagram with
`<its name>|<payload>`, so a test (or a person) sees which backend a VIP reached.

    python -m aether.testing.udp_echo NAME PORT [--hits FILE] [--hold FILE]

`--hits FILE` appends `udp <port> <length>` to FILE for every datagram (a test counts what reached the app).
`--dual-stack` binds [::] for both IP families and ends each hit line with the peer's family (`ipv4`/`ipv6`).
`--hold FILE` keeps each reply until FILE exists (a test holds a reply on its way while it changes the mesh).
The HTTP echo (`aether.testing.http_echo --udp`) runs the same loop beside its HTTP ports.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from pathlib import Path

_log_lock = threading.Lock()


def log_hit(hits: Path | None, line: str) -> None:
    """Append one line to the hits file (one writer at a time: the HTTP echo logs from many threads)."""
    if hits is None:
        return
    with _log_lock, hits.open("a") as fh:
        fh.write(line + "\n")


def bind(port: int, dual_stack: bool = False) -> socket.socket:
    """0.0.0.0:port, or with `dual_stack` [::]:port taking both families (IPv4 peers as ::ffff:a.b.c.d)."""
    sock = socket.socket(socket.AF_INET6 if dual_stack else socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # benchmarks keep 32 datagrams in flight
    if dual_stack:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::" if dual_stack else "0.0.0.0", port))
    return sock


def serve(sock: socket.socket, name: str, hits: Path | None = None, hold: Path | None = None) -> None:
    """Answer every datagram on the bound `sock` with `<name>|<payload>`, forever (once `hold` exists, if given)."""
    prefix = name.encode() + b"|"
    port = sock.getsockname()[1]
    while True:
        data, peer = sock.recvfrom(65535)
        family = "" if sock.family == socket.AF_INET else (" ipv4" if peer[0].startswith("::ffff:") else " ipv6")
        log_hit(hits, f"udp {port} {len(data)}{family}")
        while hold is not None and not hold.exists():
            time.sleep(0.005)
        sock.sendto(prefix + data, peer)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m aether.testing.udp_echo", description="a UDP echo: <NAME>|<payload>")
    ap.add_argument("name")
    ap.add_argument("port", type=int)
    ap.add_argument("--hits", type=Path, help="append `udp <port> <length>` per datagram")
    ap.add_argument("--hold", type=Path, help="send each reply only once this file exists")
    ap.add_argument("--dual-stack", action="store_true", help="bind [::] for both families; hits end ipv4|ipv6")
    args = ap.parse_args(argv)
    sock = bind(args.port, args.dual_stack)
    print(f"echo {args.name} on {'[::]' if args.dual_stack else '0.0.0.0'}:{args.port}/udp", flush=True)
    serve(sock, args.name, args.hits, args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
