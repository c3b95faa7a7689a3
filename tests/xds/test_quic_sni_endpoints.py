"""Per-SNI endpoints behind one gateway UDP listener, on the real Envoy 1.40 with aioquic: the `aether_quic_sni`
module is both the listener filter (it reads the SNI from the client's Initial) and the gateway cluster's load
balancer (it picks an endpoint whose metadata names that SNI, for the session `udp_proxy` opens on the same
worker right after the filter passed the datagram).

Two exported Services, each an aioquic server presenting its own certificate; the client trusts only the
certificate of the Service it names, so a handshake completing proves the datagrams reached that Service's
endpoint unterminated. An unknown SNI gets no session and `quic_sni_unknown` +1; a three-Initial ClientHello
reaches its own Service too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aether.testing import quic_passthrough
from aether.testing.envoy import Envoy, start_envoy
from aether.testing.envoy_modules import build, free_udp_port, per_sni_gateway_bootstrap
from aether.testing.quic_passthrough import Server, self_signed
from aether.testing.wait import wait_for

WEB = "8080.web.default.mesh.local"
API = "9090.api.default.mesh.local"
STATS = "dynamicmodulescustom.quic_sni."
LONG_ALPN = ["h3"] + [f"x-aether-test-{i:02d}-" + "p" * 43 for i in range(40)]  # a ~2.5 KB ClientHello


@dataclass(frozen=True)
class Service(Server):
    sni: str = ""


@dataclass
class Rig:
    envoy: Envoy
    gateway_port: int
    services: dict[str, Service]

    def counter(self, name: str) -> int:
        return self.envoy.stats().get(STATS + name, 0)


@pytest.fixture(params=[1, 4], ids=["1-worker", "4-workers"])
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Rig]:
    """The gateway with one worker, and with four: each worker runs its own filter and load balancer, and the SNI
    handoff between them is per worker thread (a datagram's listener filters and udp_proxy run on one worker)."""
    monkeypatch.setenv("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", str(build()))
    services = {sni: Service(free_udp_port(), *self_signed(tmp_path, sni), sni=sni) for sni in (WEB, API)}
    gateway_port = free_udp_port()
    boot = per_sni_gateway_bootstrap(tmp_path / "admin.sock", gateway_port, {s.sni: s.port for s in services.values()})
    workers = ["--concurrency", str(request.param)]
    envoy = start_envoy(boot, tmp_path, name="gateway", args=workers, log_level="info")
    try:
        yield Rig(envoy, gateway_port, services)
    finally:
        envoy.stop()


async def handshake(rig: Rig, sni: str, trust: Service, alpn: list[str], timeout: float) -> bytes | None:
    """Both Services serve; a client naming `sni` and trusting only `trust`'s certificate connects through the
    gateway: the certificate it verified, or None."""
    servers = list(rig.services.values())
    return await quic_passthrough.handshake(rig.gateway_port, sni, servers, trust.cert, alpn, timeout)


def test_each_sni_reaches_its_own_services_endpoint(rig: Rig) -> None:
    web, api = rig.services[WEB], rig.services[API]
    # Alternating, twice each: a load balancer ignoring the SNI would send one of them to the other Service.
    for turn in range(4):
        service = web if turn % 2 == 0 else api
        got = asyncio.run(handshake(rig, service.sni, service, ["h3"], timeout=10))
        assert got == service.der(), f"turn {turn}: {service.sni} did not reach its own endpoint"
    assert rig.counter("quic_sni_forwarded") == 4
    assert rig.envoy.stat("udp.gw.downstream_sess_total") == 4


def test_a_three_initial_clienthello_reaches_its_own_service(rig: Rig) -> None:
    api = rig.services[API]
    assert asyncio.run(handshake(rig, API, api, LONG_ALPN, timeout=10)) == api.der()
    assert rig.counter("quic_sni_pending") >= 2
    assert rig.counter("quic_sni_forwarded") == 1


def test_an_unknown_sni_is_dropped_and_counted_with_no_session(rig: Rig) -> None:
    web = rig.services[WEB]
    assert asyncio.run(handshake(rig, "7070.other.default.mesh.local", web, ["h3"], timeout=2)) is None
    wait_for(lambda: rig.counter("quic_sni_unknown") == 1, timeout=10, what="quic_sni_unknown == 1")
    assert rig.counter("quic_sni_forwarded") == 0
    assert rig.envoy.stats().get("udp.gw.downstream_sess_total", 0) == 0, "a datagram reached udp_proxy"
