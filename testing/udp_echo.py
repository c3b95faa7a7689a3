"""The UDP backend of the e2e tests, the xDS tests and the benchmarks: a UDP server that answers every datagram with `<its name>|<payload>`, so a test (or a person)
sees which backend a VIP reached.

    python -m aether.testing.udp_echo NAME PORT
"""

from __future__ import annotations

import socket
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m aether.testing.udp_echo NAME PORT", file=sys.stderr)
        return 2
    prefix = argv[0].encode() + b"|"
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # benchmarks keep 32 datagrams in flight
    sock.bind(("0.0.0.0", int(argv[1])))
    print(f"echo {argv[0]} on 0.0.0.0:{argv[1]}/udp", flush=True)
    while True:
        data, peer = sock.recvfrom(65535)
        sock.sendto(prefix + data, peer)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
