"""QUIC passthrough by the SNI of the client's Initial, on the real data path: the real Envoy 1.40 loads our Rust
dynamic module (`envoy-modules/quic-sni-filter`, library `aether_quic_sni`) as a UDP listener filter before
`udp_proxy`, and real aioquic clients reach a real aioquic server through it on loopback.

- an exported SNI: the handshake completes end to end and the client verifies the server's own certificate (the
  gateway holds no key, so it cannot have terminated), for a one-Initial and a three-Initial ClientHello;
- an SNI not exported: nothing is forwarded (no udp_proxy session) and `quic_sni_unknown` counts it;
- the module loads with its ABI version matched (`envoy --mode validate`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from aether.testing import quic_passthrough
from aether.testing.envoy import Envoy, allocate_base_id, envoy_path, start_envoy
from aether.testing.envoy_modules import build, free_udp_port, gateway_bootstrap
from aether.testing.quic_passthrough import Server, self_signed
from aether.testing.wait import wait_for

EXPORTED = "8080.web.default.mesh.local"
STATS = "dynamicmodulescustom.quic_sni."
LONG_ALPN = ["h3"] + [f"x-aether-test-{i:02d}-" + "p" * 43 for i in range(40)]  # a ~2.5 KB ClientHello


@dataclass
class Rig:
    envoy: Envoy
    gateway_port: int
    server_port: int
    cert: Path
    key: Path

    def counter(self, name: str) -> int:
        return self.envoy.stats().get(STATS + name, 0)


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    monkeypatch.setenv("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", str(build()))
    cert, key = self_signed(tmp_path, EXPORTED, "other.default.mesh.local")
    gateway_port, server_port = free_udp_port(), free_udp_port()
    boot = gateway_bootstrap(tmp_path / "admin.sock", gateway_port, server_port, [EXPORTED])
    envoy = start_envoy(boot, tmp_path, name="gateway", args=["--concurrency", "1"], log_level="info")
    try:
        yield Rig(envoy, gateway_port, server_port, cert, key)
    finally:
        envoy.stop()


async def handshake(rig: Rig, sni: str, alpn: list[str], timeout: float) -> bytes | None:
    """Serve QUIC on the server port, connect through the gateway with `sni`; the DER certificate the client
    verified, or None when no handshake completed within `timeout`."""
    server = Server(rig.server_port, rig.cert, rig.key)
    return await quic_passthrough.handshake(rig.gateway_port, sni, [server], rig.cert, alpn, timeout)


def test_the_module_loads_with_its_abi_version_matched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", str(build()))
    config = tmp_path / "gateway.json"
    config.write_text(
        json.dumps(gateway_bootstrap(tmp_path / "admin.sock", free_udp_port(), free_udp_port(), [EXPORTED]))
    )
    argv = [str(envoy_path()), "--mode", "validate", "-c", str(config), "--disable-hot-restart"]
    argv += ["--base-id", str(allocate_base_id()), "-l", "info"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "Dynamic module ABI version v0.2.0 matched." in done.stdout + done.stderr


def test_an_exported_sni_passes_through_unterminated(rig: Rig) -> None:
    server_der = x509.load_pem_x509_certificate(rig.cert.read_bytes()).public_bytes(Encoding.DER)
    assert asyncio.run(handshake(rig, EXPORTED, ["h3"], timeout=10)) == server_der
    assert rig.counter("quic_sni_forwarded") == 1
    assert rig.counter("quic_sni_pending") == 0
    # A ClientHello over three Initials: the first two are held back (dropped) until the name is known, and the
    # client's retransmissions complete the handshake.
    assert asyncio.run(handshake(rig, EXPORTED, LONG_ALPN, timeout=10)) == server_der
    assert rig.counter("quic_sni_forwarded") == 2
    assert rig.counter("quic_sni_pending") >= 2
    assert rig.envoy.stat("udp.gw.downstream_sess_total") == 2


def test_an_unknown_sni_is_dropped_and_counted(rig: Rig) -> None:
    assert asyncio.run(handshake(rig, "other.default.mesh.local", ["h3"], timeout=2)) is None
    wait_for(lambda: rig.counter("quic_sni_unknown") == 1, timeout=10, what="quic_sni_unknown == 1")
    assert rig.counter("quic_sni_forwarded") == 0
    assert rig.envoy.stats().get("udp.gw.downstream_sess_total", 0) == 0, "a datagram reached udp_proxy"
