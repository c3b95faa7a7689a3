"""A UDP backend for tests and benchmarks: answers every datagram with `<name>|<payload>`.

python -m aether.xds.udp_echo NAME PORT [--bind ADDR]
"""

from __future__ import annotations

import argparse
import socket
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="udp_echo")
    p.add_argument("name")
    p.add_argument("port", type=int)
    p.add_argument("--bind", default="0.0.0.0")
    args = p.parse_args(argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((args.bind, args.port))
    prefix = args.name.encode() + b"|"
    print(f"udp_echo {args.name} on {args.bind}:{args.port}", flush=True)
    while True:
        data, peer = sock.recvfrom(65535)
        sock.sendto(prefix + data, peer)


if __name__ == "__main__":
    sys.exit(main())
