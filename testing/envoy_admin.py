"""Envoy's admin API over its unix socket (the socket path works across network namespaces)."""

from __future__ import annotations

import http.client
import socket


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket (Envoy's admin; the path works across network namespaces)."""

    def __init__(self, path: str, timeout: float = 5.0) -> None:
        super().__init__("admin", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def admin_request(sock_path: str, path: str, method: str = "GET", timeout: float = 5.0) -> str:
    """`method path` on the admin socket; the body as text (raises OSError while Envoy is not up)."""
    conn = UnixHTTPConnection(sock_path, timeout)
    try:
        conn.request(method, path)
        return conn.getresponse().read().decode(errors="replace")
    finally:
        conn.close()


def admin_get(sock_path: str, path: str, timeout: float = 5.0) -> str:
    return admin_request(sock_path, path, timeout=timeout)


def stat(sock_path: str, name: str) -> int:
    """One counter or gauge by exact name; 0 when Envoy has no such stat (yet)."""
    for line in admin_get(sock_path, f"/stats?filter=^{name}$").splitlines():
        key, _, value = line.partition(": ")
        if key == name and value.strip().lstrip("-").isdigit():
            return int(value)
    return 0
