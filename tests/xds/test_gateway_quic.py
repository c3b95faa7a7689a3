"""The east-west gateway's QUIC half on UDP 18009 (`aether.xds.translate.eastwest.gateway_quic`, emitted by
`gateway.build(..., quic=True)` beside the TCP listener from the same exports): golden, shape, the real Envoy's
`--mode validate` with the module on its search path, the `gateway-passthrough` gate's UDP rules, the sidecar's
`--east-west-gateway-quic` switch, and the translated resources on the real data path (aioquic through a real
Envoy serving exactly what the translator emitted: each SNI reaches its own Service's endpoint)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aether.netns.contract import EAST_WEST_PORT, INBOUND_PORT
from aether.testing import quic_passthrough
from aether.testing.envoy import start_envoy, validate
from aether.testing.envoy_modules import build as build_modules
from aether.testing.envoy_modules import free_udp_port
from aether.testing.golden import check_golden, golden_json
from aether.testing.quic_passthrough import Server, self_signed
from aether.xds.gates.quic import run_quic_gates
from aether.xds.resources import CLUSTER, ENDPOINT, LISTENER, Resources
from aether.xds.sidecar.arguments import east_west_gateway_quic
from aether.xds.sidecar.bootstrap import static_bootstrap
from aether.xds.translate.eastwest import gateway, gateway_quic
from aether.xds.translate.eastwest.plan import Destination

GOLDEN = Path(__file__).parent / "golden"
MD, TD = "mesh.example", "cluster.local"
GW = "10.199.0.2"


def dest(svc: str, sa: str, ports: tuple[int, ...], endpoints: tuple[tuple[str, int], ...]) -> Destination:
    return Destination("default", svc, sa, f"spiffe://{TD}/ns/default/sa/{sa}", ports, endpoints, None)


def exports() -> list[Destination]:
    """web (SA web-sa, ports 8080 and 9090: one pod serves two SNIs), db (SA db, one port)."""
    return [
        dest("web", "web-sa", (8080, 9090), (("10.200.2.7", INBOUND_PORT), ("10.200.2.8", INBOUND_PORT))),
        dest("db", "db", (5432,), (("10.200.3.4", INBOUND_PORT),)),
    ]


def quic_part(res: Resources) -> Resources:
    return {
        LISTENER: {gateway_quic.LISTENER_NAME: res[LISTENER][gateway_quic.LISTENER_NAME]},
        CLUSTER: {gateway_quic.CLUSTER_NAME: res[CLUSTER][gateway_quic.CLUSTER_NAME]},
        ENDPOINT: {gateway_quic.CLUSTER_NAME: res[ENDPOINT][gateway_quic.CLUSTER_NAME]},
    }


def test_golden_gateway_quic() -> None:
    check_golden(GOLDEN / "gateway_quic.json", golden_json(quic_part(gateway.build(exports(), GW, MD, quic=True))))


def test_the_udp_listener_sits_beside_the_tcp_one_and_one_host_per_address_names_its_snis() -> None:
    res = gateway.build(exports(), GW, MD, quic=True)
    tcp, udp = res[LISTENER][gateway.LISTENER_NAME], res[LISTENER][gateway_quic.LISTENER_NAME]
    assert tcp["address"]["socketAddress"] == {"protocol": "TCP", "address": GW, "portValue": EAST_WEST_PORT}
    assert udp["address"]["socketAddress"] == {"protocol": "UDP", "address": GW, "portValue": EAST_WEST_PORT}
    module, proxy = udp["listenerFilters"]
    assert module["typedConfig"]["filterConfig"]["value"] == (
        "5432.db.default.mesh.example,8080.web-sa.default.mesh.example,9090.web-sa.default.mesh.example"
    )
    assert proxy["typedConfig"]["matcher"]["onNoMatch"]["action"]["typedConfig"]["cluster"] == "east-west-quic"
    hosts = res[ENDPOINT][gateway_quic.CLUSTER_NAME]["endpoints"][0]["lbEndpoints"]
    got = {
        h["endpoint"]["address"]["socketAddress"]["address"]: h["metadata"]["filterMetadata"]["aether.quic_sni"]["sni"]
        for h in hosts
    }
    assert got == {
        "10.200.2.7": "8080.web-sa.default.mesh.example,9090.web-sa.default.mesh.example",
        "10.200.2.8": "8080.web-sa.default.mesh.example,9090.web-sa.default.mesh.example",
        "10.200.3.4": "5432.db.default.mesh.example",
    }
    assert len(hosts) == 3  # one host per address, not one per (SNI, address)
    assert gateway_quic.LISTENER_NAME not in gateway.build(exports(), GW, MD)[LISTENER]  # off unless asked
    assert gateway.build([], GW, MD, quic=True)[LISTENER] == {}  # no exports: neither listener


@pytest.mark.envoy
def test_envoy_validates_the_gateway_with_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", str(build_modules()))
    out = validate(static_bootstrap("node-gw", gateway.build(exports(), GW, MD, quic=True)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK" in out.stdout


# -- the gateway-passthrough gate's UDP rules ------------------------------------------------------------------------


def test_the_gate_passes_the_built_quic_gateway() -> None:
    assert run_quic_gates(gateway.build(exports(), GW, MD, quic=True)) == []


@pytest.mark.parametrize("change", ["terminating", "no-module"])
def test_the_gate_refuses_a_udp_gateway_that_terminates_or_passes_every_sni(change: str) -> None:
    res = gateway.build(exports(), GW, MD, quic=True)
    udp = res[LISTENER][gateway_quic.LISTENER_NAME]
    if change == "terminating":
        udp["udpListenerConfig"] = {"quicOptions": {}}
    else:
        udp["listenerFilters"] = udp["listenerFilters"][1:]
    failures = run_quic_gates(res)
    passthrough = [f for f in failures if f.gate == "gateway-passthrough"]
    assert len(passthrough) == 1 and gateway_quic.LISTENER_NAME in passthrough[0].reason, failures
    # udp_proxy alone on 18009 is also the plaintext class on the QUIC role's port (R5)
    assert {f.gate for f in failures} == {"gateway-passthrough"} | (
        {"classes-separated"} if change == "no-module" else set()
    )


# -- the sidecar's switch -----------------------------------------------------------------------------------------


def test_auto_is_on_only_where_envoy_finds_the_module(tmp_path: Path) -> None:
    assert east_west_gateway_quic("auto", {}) is False
    assert east_west_gateway_quic("auto", {"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(tmp_path)}) is False
    (tmp_path / "libaether_quic_sni.so").write_bytes(b"")
    assert east_west_gateway_quic("auto", {"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(tmp_path)}) is True
    assert east_west_gateway_quic("off", {"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(tmp_path)}) is False
    assert east_west_gateway_quic("on", {}) is True


def test_the_cli_role_serves_the_udp_listener_where_the_module_is(tmp_path: Path) -> None:
    from tests.xds.test_gateway_tcp import gateway_node_state

    state = gateway_node_state(tmp_path)
    argv = [sys.executable, "-m", "aether.cli", "xds", "render", "--state", str(state), "--records", str(tmp_path)]
    argv += ["--mesh-domain", MD, "--east-west-gateway", GW]
    env = {k: v for k, v in os.environ.items() if k != "ENVOY_DYNAMIC_MODULES_SEARCH_PATH"}
    plain = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert plain.returncode == 0, plain.stderr
    assert gateway_quic.LISTENER_NAME not in json.loads(plain.stdout)[LISTENER]
    env["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"] = str(build_modules())
    with_module = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert with_module.returncode == 0, with_module.stderr
    udp = json.loads(with_module.stdout)[LISTENER][gateway_quic.LISTENER_NAME]
    assert udp["address"]["socketAddress"]["address"] == GW
    assert "refused" not in with_module.stderr  # the gates passed it


# -- the translated resources on the real data path ---------------------------------------------------------------


@pytest.mark.envoy
def test_the_translated_gateway_sends_each_sni_to_its_own_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", str(build_modules()))
    web = Server(free_udp_port(), *self_signed(tmp_path, "8080.web-sa.default.mesh.example"))
    db = Server(free_udp_port(), *self_signed(tmp_path, "5432.db.default.mesh.example"))
    # 127.0.0.0/8 is all loopback: an address of this test's own so the fixed port 18009 cannot collide
    address = f"127.{os.getpid() % 200 + 20}.{os.getpid() // 200 % 250 + 1}.9"
    res = gateway.build(
        [
            dest("web", "web-sa", (8080,), (("127.0.0.1", web.port),)),
            dest("db", "db", (5432,), (("127.0.0.1", db.port),)),
        ],
        address,
        MD,
        quic=True,
    )
    boot = static_bootstrap("node-gw", res)
    boot["admin"] = {"address": {"pipe": {"path": str(tmp_path / "admin.sock")}}}
    envoy = start_envoy(boot, tmp_path, name="gateway", args=["--concurrency", "1"], log_level="info")
    try:
        for turn in range(4):
            server, sni = (
                (web, "8080.web-sa.default.mesh.example") if turn % 2 == 0 else (db, "5432.db.default.mesh.example")
            )
            got = asyncio.run(_handshake(address, sni, [web, db], server))
            assert got == server.der(), f"turn {turn}: {sni} did not reach its own endpoint"
        assert envoy.stat("udp.east_west_gateway_quic.downstream_sess_total") == 4
        assert "Dynamic module ABI version v0.2.0 matched." in envoy.log_path.read_text()
    finally:
        envoy.stop()


async def _handshake(address: str, sni: str, servers: list[Server], trust: Server) -> bytes | None:
    return await quic_passthrough.handshake(EAST_WEST_PORT, sni, servers, trust.cert, ["h3"], 10, host=address)
