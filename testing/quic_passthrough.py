"""QUIC through a passthrough gateway, for tests and benches: self-signed server certificates, aioquic servers
behind the gateway, and a client that reports which certificate it verified (the gateway holds no key, so a
verified server certificate means the connection reached that server unterminated)."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aioquic.asyncio.client import connect
from aioquic.asyncio.server import serve
from aioquic.quic.configuration import QuicConfiguration
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding


@dataclass(frozen=True)
class Server:
    """An aioquic server's UDP port on 127.0.0.1 and the certificate it presents."""

    port: int
    cert: Path
    key: Path

    def der(self) -> bytes:
        return x509.load_pem_x509_certificate(self.cert.read_bytes()).public_bytes(Encoding.DER)


def self_signed(workdir: Path, name: str, *more_names: str) -> tuple[Path, Path]:
    """A P-256 certificate and key for `name` (CN and SAN) and `more_names` (SAN), valid one day."""
    cert, key = workdir / f"{name}.pem", workdir / f"{name}.key"
    argv = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    argv += ["-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}"]
    sans = ",".join(f"DNS:{n}" for n in (name, *more_names))
    subprocess.run([*argv, "-addext", f"subjectAltName={sans}"], check=True, capture_output=True)
    return cert, key


async def handshake(
    gateway_port: int,
    sni: str,
    servers: Sequence[Server],
    trust: Path,
    alpn: list[str],
    timeout: float,
    *,
    host: str = "127.0.0.1",
) -> bytes | None:
    """`servers` serve; a client naming `sni` and trusting only `trust` connects to `host`:`gateway_port`.
    The DER certificate it verified, or None when no handshake completed within `timeout`."""
    running = []
    for server in servers:
        config = QuicConfiguration(is_client=False, alpn_protocols=alpn)
        config.load_cert_chain(str(server.cert), str(server.key))
        running.append(await serve("127.0.0.1", server.port, configuration=config))
    client_config = QuicConfiguration(is_client=True, alpn_protocols=alpn, server_name=sni)
    client_config.load_verify_locations(str(trust))
    try:
        async with asyncio.timeout(timeout):
            async with connect(host, gateway_port, configuration=client_config) as client:
                await client.ping()
                peer = client._quic.tls._peer_certificate
                assert peer is not None
                return peer.public_bytes(Encoding.DER)
    except (TimeoutError, ConnectionError):
        return None
    finally:
        for quic_server in running:
            quic_server.close()
