"""The gateway role through the real sidecar process: `aether xds --east-west-gateway 127.0.0.1` on a MeshNode
file (`aether.testing.nodebed`: the sidecar as a process, a real Envoy in the node netns over its ADS socket).

The node's MeshNode lists default/web (SA web-sa, port 8080) with one endpoint, a pod whose "inbound" on 18008 is
a raw TCP sink recording the bytes it receives. openssl s_client from the node netns to 127.0.0.1:18009:
- with web's SNI: the sink receives the ClientHello as sent, a TLS handshake record whose server_name is web's SNI
  (the gateway forwarded the TLS bytes unopened), and `tcp.east_west_gateway.downstream_cx_total` counts it;
- with an SNI the node does not export: the sink receives nothing and
  `listener.east_west_gateway.no_filter_chain_match` goes +1;
- the QUIC half, served because the module is on `ENVOY_DYNAMIC_MODULES_SEARCH_PATH` (as the node image sets it;
  `--east-west-gateway-quic auto`): a real aioquic client Initial naming web's SNI opens a udp_proxy session
  through the module, one naming another SNI is dropped and counted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aether.api.meshnode import Endpoint, QuicDestination
from aether.api.naming import quic_sni
from aether.netns.contract import EAST_WEST_PORT, INBOUND_PORT
from aether.testing.envoy_modules import build as build_modules
from aether.testing.netlab import Lab, Pod
from aether.testing.nodebed import NodeBed
from aether.testing.quic_initials import MESH_SNI, Case, capture
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

MD = "mesh.example"
WEB_SNI = quic_sni(8080, "web-sa", "default", MD)
# Accepts connections on <ip>:18008 and appends what each sends (up to 16 KiB, 2 s) to a file, hex, one line each.
SINK = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(2)
    data = b""
    try:
        while len(data) < 16384:
            chunk = c.recv(16384)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    c.close()
    with open(sys.argv[3], "a") as f:
        f.write(data.hex() + "\n")
"""


@dataclass
class Bed:
    node: NodeBed
    web: Pod
    received: Path


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    search = os.environ.get("ENVOY_DYNAMIC_MODULES_SEARCH_PATH")
    os.environ["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"] = str(build_modules())  # the sidecar and its Envoy inherit it
    lab = Lab()
    try:
        workdir = tmp_path_factory.mktemp("gateway-sidecar")
        args = ["--east-west-gateway", "127.0.0.1", "--mesh-domain", MD]
        nb = NodeBed(lab, workdir, areas="gateway", sidecar_args=args)
        web = lab.add_pod(nb.node, "web-0", "10.201.9.7")
        received = workdir / "received.hex"
        received.touch()
        sink = lab.spawn(
            web.netns,
            [sys.executable, "-c", SINK, web.ip, str(INBOUND_PORT), str(received)],
            stdout=subprocess.PIPE,
        )
        assert sink.stdout is not None and b"ready" in sink.stdout.readline()
        node = nb.meshnode()
        node.status.quic.destinations = [
            QuicDestination(
                service="default/web",
                service_account="web-sa",
                ports=[8080],
                endpoints=[Endpoint(ip=web.ip, port=INBOUND_PORT)],
            )
        ]
        nb.write_state(node)
        nb.start_sidecar()
        nb.start_envoy()
        nb.wait_programmed()
        nb.wait_listeners(2)  # the gateway's TCP and UDP listeners, the only ones this node has
        yield Bed(nb, web, received)
    finally:
        lab.close()
        if search is None:
            os.environ.pop("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", None)
        else:
            os.environ["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"] = search


def s_client(bed: Bed, sni: str) -> str:
    argv = ["openssl", "s_client", "-connect", f"127.0.0.1:{EAST_WEST_PORT}", "-servername", sni]
    out = subprocess.run(
        ["ip", "netns", "exec", bed.node.node.netns, *argv], input="", capture_output=True, text=True, timeout=30
    )
    return out.stdout + out.stderr


def lines(bed: Bed) -> list[bytes]:
    return [bytes.fromhex(line) for line in bed.received.read_text().splitlines()]


def test_the_sidecars_gateway_forwards_the_tls_bytes_unopened(bed: Bed) -> None:
    envoy = bed.node.running_envoy()
    forwarded, before = envoy.stat("tcp.east_west_gateway.downstream_cx_total"), len(lines(bed))
    out = s_client(bed, WEB_SNI)
    assert "BEGIN CERTIFICATE" not in out  # the sink is no TLS server: nothing answered the handshake
    wait_for(lambda: len(lines(bed)) == before + 1, 15, "the sink to record one connection")
    hello = lines(bed)[-1]
    assert hello[:1] == b"\x16" and hello[5:6] == b"\x01", hello[:8].hex()  # TLS handshake record, ClientHello
    assert WEB_SNI.encode() in hello  # the server_name as the client sent it
    assert envoy.stat("tcp.east_west_gateway.downstream_cx_total") == forwarded + 1


def test_an_sni_the_node_does_not_export_reaches_nothing(bed: Bed) -> None:
    envoy = bed.node.running_envoy()
    refused, before = envoy.stat("listener.east_west_gateway.no_filter_chain_match"), len(lines(bed))
    s_client(bed, quic_sni(8080, "other", "default", MD))
    wait_for(
        lambda: envoy.stat("listener.east_west_gateway.no_filter_chain_match") == refused + 1, 10, "unknown SNI +1"
    )
    assert len(lines(bed)) == before


SEND = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for line in sys.stdin.read().split():
    s.sendto(bytes.fromhex(line), ("127.0.0.1", int(sys.argv[1])))
"""


def send_initials(bed: Bed, sni: str) -> None:
    """A real aioquic client's first flight naming `sni`, from the node netns to the gateway's UDP 18009."""
    flight = "\n".join(d.hex() for d in capture(Case("sidecar", sni)))
    argv = ["ip", "netns", "exec", bed.node.node.netns, sys.executable, "-c", SEND, str(EAST_WEST_PORT)]
    subprocess.run(argv, input=flight, text=True, check=True, timeout=30)


def test_the_sidecar_serves_the_quic_half_where_the_module_is(bed: Bed) -> None:
    envoy = bed.node.running_envoy()
    stats = "dynamicmodulescustom.quic_sni."
    forwarded, unknown = (
        envoy.stats().get(stats + "quic_sni_forwarded", 0),
        envoy.stats().get(stats + "quic_sni_unknown", 0),
    )
    sessions = envoy.stats().get("udp.east_west_gateway_quic.downstream_sess_total", 0)
    send_initials(bed, WEB_SNI)
    wait_for(lambda: envoy.stats().get(stats + "quic_sni_forwarded", 0) == forwarded + 1, 10, "web's SNI forwarded")
    assert envoy.stat("udp.east_west_gateway_quic.downstream_sess_total") == sessions + 1
    send_initials(bed, MESH_SNI)  # a name this node does not export
    wait_for(lambda: envoy.stats().get(stats + "quic_sni_unknown", 0) == unknown + 1, 10, "unknown SNI +1")
    assert envoy.stat("udp.east_west_gateway_quic.downstream_sess_total") == sessions + 1  # no session for it
