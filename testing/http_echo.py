"""The HTTP backend of the e2e tests, the east-west tests and the benchmarks: answers every GET with JSON naming
itself, the source identity Envoy forwarded (`x-forwarded-client-cert`), the Host it was asked for and the port
it was reached on, so a test or the demo sees which SPIFFE ID arrived where.

    python -m aether.testing.http_echo NAME PORT [PORT ...] [--hits FILE] [--udp] [--one-write]

    {"backend": NAME, "xfcc": "...", "host": "...", "port": 8080}

`--hits FILE` appends `http <port> <path>` per request; `--udp` also holds a UDP echo (`aether.testing.udp_echo`)
on every port, logging its datagrams to the same file (so "never reaches an app" covers UDP too); `--one-write`
sends status line, headers and body in one write (what most servers do for a small response; by default the headers
and the body are two writes). It prints one line with `ready` once every port is bound.
"""

from __future__ import annotations

import argparse
import io
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from aether.testing import udp_echo


def handler(name: str, hits: Path | None = None, one_write: bool = False) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body are two writes: Nagle + delayed ACK would add 40 ms

        def do_GET(self) -> None:
            port: int = self.connection.getsockname()[1]
            body = json.dumps(
                {
                    "backend": name,
                    "xfcc": self.headers.get("x-forwarded-client-cert"),
                    "host": self.headers.get("host"),
                    "port": port,
                }
            ).encode()
            udp_echo.log_hit(hits, f"http {port} {self.path}")
            sock_writer = self.wfile
            if one_write:
                self.wfile = io.BytesIO()  # collect the response, then send it in one write
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            finally:
                if one_write:
                    assert isinstance(self.wfile, io.BytesIO)
                    response, self.wfile = self.wfile.getvalue(), sock_writer
                    self.wfile.write(response)

        def log_message(self, *args: Any) -> None:
            return None

    return Handler


class DualStackServer(ThreadingHTTPServer):
    """[::]:port taking IPv4 too (IPV6_V6ONLY off)."""

    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m aether.testing.http_echo", description=__doc__.split("\n\n")[0])
    ap.add_argument("name")
    ap.add_argument("ports", type=int, nargs="+", metavar="PORT")
    ap.add_argument("--hits", type=Path, help="append `http <port> <path>` (and `udp <port> <length>`) per hit")
    ap.add_argument("--udp", action="store_true", help="also a UDP echo on every port")
    ap.add_argument("--one-write", action="store_true", help="status line, headers and body in one write")
    ap.add_argument("--dual-stack", action="store_true", help="listen on [::] for both IP families")
    args = ap.parse_args(argv)
    app = handler(args.name, args.hits, args.one_write)
    servers = []
    for port in args.ports:
        server = DualStackServer(("::", port), app) if args.dual_stack else ThreadingHTTPServer(("0.0.0.0", port), app)
        server.daemon_threads = True
        servers.append(server)
        if args.udp:
            sock = udp_echo.bind(port, args.dual_stack)
            threading.Thread(target=udp_echo.serve, args=(sock, args.name, args.hits), daemon=True).start()
    for server in servers[1:]:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    proto = "tcp+udp" if args.udp else "tcp"
    print(f"ready: http_echo {args.name} on 0.0.0.0:{','.join(map(str, args.ports))}/{proto}", flush=True)
    servers[0].serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
