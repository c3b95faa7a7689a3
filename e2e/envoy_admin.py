"""Envoy's admin API over its unix socket (the socket path works across network namespaces)."""

from __future__ import annotations

import socket


def admin_get(sock_path: str, path: str, timeout: float = 5.0) -> str:
    """GET `path` from the admin socket; the body as text (raises OSError while Envoy is not up)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock_path)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    finally:
        s.close()
    return b"".join(chunks).partition(b"\r\n\r\n")[2].decode(errors="replace")


def stat(sock_path: str, name: str) -> int:
    """One counter or gauge by exact name; 0 when Envoy has no such stat (yet)."""
    for line in admin_get(sock_path, f"/stats?filter=^{name}$").splitlines():
        key, _, value = line.partition(": ")
        if key == name and value.strip().lstrip("-").isdigit():
            return int(value)
    return 0
