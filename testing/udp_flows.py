"""Many concurrent UDP flows from one pod: one socket per flow, each bound to its own source address and port, all
kept open, every flow sending a datagram and waiting for its reply (the udp_echo answers `<name>|<payload>`).

    ip netns exec POD python -m aether.testing.udp_flows --vip VIP --port PORT --source ADDR:LOW-HIGH [...]

Run as a child process in the client pod's netns. It raises its open-files limit to the hard limit, which bounds
the flows one process holds (20,000 on these machines, whose root lacks CAP_SYS_RESOURCE to raise it): start
several, each with its own sources, for more. Pass 1
sends one datagram per flow, `--inflight` outstanding at a time (a flow without a reply after `--timeout` s sends
again, at most `--tries` times: the same socket, so the same flow) and prints one JSON line: how many flows were
answered, how many replies came from VIP:PORT, how many named each backend. It then waits for a line on stdin,
runs pass 2 over the same sockets (every flow still open) and prints a second line that also counts how many flows
reached the same backend as in pass 1. It closes the sockets when stdin closes.
"""

from __future__ import annotations

import argparse
import json
import resource
import select
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Pass:
    answered: int = 0
    from_vip: int = 0
    retries: int = 0
    backends: Counter[str] = field(default_factory=Counter)
    same_backend: int = 0
    seconds: float = 0.0
    unanswered: list[str] = field(default_factory=list)  # the first 20 flows without a reply, as ADDR:PORT

    def line(self, phase: str) -> str:
        out = {k: v for k, v in self.__dict__.items() if k != "backends"} | {"backends": dict(self.backends)}
        return json.dumps({"phase": phase, **out})


def sources(specs: list[str]) -> list[tuple[str, int]]:
    """`ADDR:LOW-HIGH` each: every (address, port) in order."""
    out = []
    for spec in specs:
        addr, _, ports = spec.rpartition(":")
        low, _, high = ports.partition("-")
        out += [(addr, port) for port in range(int(low), int(high or low) + 1)]
    return out


def open_flows(addrs: list[tuple[str, int]]) -> list[socket.socket]:
    socks = []
    for addr in addrs:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setblocking(False)
        s.bind(addr)
        socks.append(s)
    return socks


def run_pass(
    socks: list[socket.socket], dest: tuple[str, int], inflight: int, timeout: float, tries: int, before: list[str]
) -> tuple[Pass, list[str]]:
    """One datagram per flow, `inflight` flows outstanding; returns the tally and the backend each flow reached
    ("" when it got no reply). The payload is `<pass>:<flow>`, so a late reply to an earlier pass is not taken."""
    p, names = Pass(), [""] * len(socks)
    tag = f"{2 if before else 1}:"
    by_fd = {s.fileno(): i for i, s in enumerate(socks)}
    poller = select.epoll()
    pending: dict[int, tuple[float, int]] = {}  # flow -> (sent at, tries)
    start = time.monotonic()
    next_flow, last_scan = 0, start
    while next_flow < len(socks) or pending:
        while next_flow < len(socks) and len(pending) < inflight:
            socks[next_flow].sendto(f"{tag}{next_flow}".encode(), dest)
            poller.register(socks[next_flow].fileno(), select.EPOLLIN)
            pending[next_flow] = (time.monotonic(), 1)
            next_flow += 1
        for fd, _ in poller.poll(0.05):
            i = by_fd[fd]
            data, src = socks[i].recvfrom(65535)
            name, _, payload = data.partition(b"|")
            if payload != f"{tag}{i}".encode():
                continue  # a late reply to an earlier pass: not this one's answer
            poller.unregister(fd)
            del pending[i]
            names[i] = name.decode()
            p.answered += 1
            p.from_vip += src == dest
            p.backends[names[i]] += 1
            p.same_backend += bool(before) and before[i] == names[i]
        now = time.monotonic()
        if now - last_scan >= timeout / 4:
            last_scan = now
            for i, (sent, n) in list(pending.items()):
                if now - sent < timeout:
                    continue
                if n >= tries:
                    poller.unregister(socks[i].fileno())
                    del pending[i]
                    continue
                socks[i].sendto(f"{tag}{i}".encode(), dest)
                pending[i] = (now, n + 1)
                p.retries += 1
    poller.close()
    p.unanswered = [f"{s.getsockname()[0]}:{s.getsockname()[1]}" for s, n in zip(socks, names, strict=True) if not n][
        :20
    ]
    p.seconds = round(time.monotonic() - start, 3)
    return p, names


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m aether.testing.udp_flows")
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--source", action="append", required=True, help="ADDR:LOW-HIGH (repeat)")
    ap.add_argument("--inflight", type=int, default=500)
    ap.add_argument("--timeout", type=float, default=2.0)
    ap.add_argument("--tries", type=int, default=3)
    args = ap.parse_args(argv)
    addrs = sources(args.source)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and len(addrs) + 64 > hard:
        ap.error(f"{len(addrs)} flows need more open files than the hard limit {hard}: start more processes")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    t0 = time.monotonic()
    socks = open_flows(addrs)
    print(json.dumps({"phase": "open", "flows": len(socks), "seconds": round(time.monotonic() - t0, 3)}), flush=True)
    dest = (args.vip, args.port)
    first, names = run_pass(socks, dest, args.inflight, args.timeout, args.tries, [])
    print(first.line("first"), flush=True)
    if sys.stdin.readline():
        again, _ = run_pass(socks, dest, args.inflight, args.timeout, args.tries, names)
        print(again.line("again"), flush=True)
    sys.stdin.read()
    for s in socks:
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
