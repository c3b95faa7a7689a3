"""The e2e HTTP backend: answers every GET with JSON naming itself and the source identity Envoy forwarded
(`x-forwarded-client-cert`), so a test or the demo sees which SPIFFE ID arrived.

    python -m aether.testing.http_echo NAME PORT
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def handler(name: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = json.dumps({"backend": name, "xfcc": self.headers.get("x-forwarded-client-cert")}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    return Handler


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m aether.testing.http_echo NAME PORT", file=sys.stderr)
        return 2
    server = ThreadingHTTPServer(("0.0.0.0", int(argv[1])), handler(argv[0]))
    print(f"http_echo {argv[0]} on 0.0.0.0:{argv[1]}/tcp", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
