"""The east-west gateway's TCP half on the real data path (the rig: `aether.testing.quic_mesh`, two node netns and
their real Envoys). Node B also plays the gateway: `aether.xds.translate.eastwest.gateway` on its node address
10.199.0.2:18009, exporting default/web. Node A holds default/web as a remote Service
(`EastWestOptions.remote_gateways`): its h2 cluster dials the gateway, with the SNI, pinned SPIFFE ID and source SVID
of the in-cluster path.

- node A holds no route to web-0 (nor node B to client-0): only the nodes' link, where the gateway listens;
- client-0 -> node A's outbound -> gateway 18009 (tls_inspector + tcp_proxy) -> web-0's inbound 18008 -> app: the app's
  XFCC carries client-0's SPIFFE ID (other-0's for other-0), and the gateway holds no certificate at all;
- openssl s_client through the gateway gets web-0's SVID, verified against the mesh's root: passthrough;
- an SNI no exported Service has, or none, gets no certificate and counts in
  `listener.east_west_gateway.no_filter_chain_match`;
- a packet capture on node B's links sees TLS records to 18009 and 18008 and never a request's marker header (the
  same capture in web-0's netns does see it);
- the gateway as its own Envoy, restarted during traffic, recovers on the snapshot it had (one window of
  failures, then 200s with the source's identity);
- a MeshAuthorizationPolicy on default/web applies through the gateway as in-cluster (403 for the source it does
  not name, 200 and XFCC for the one it does);
- negative control: the same listener terminating TLS with a gateway SVID: s_client sees the gateway's identity and
  the source proxy refuses it (its pinned destination SAN), so the tests above can tell passthrough from termination.
"""

from __future__ import annotations

import copy
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography import x509

from aether.api.naming import quic_sni
from aether.netns.contract import EAST_WEST_PORT, InboundMode
from aether.testing.eastwest_lab import client_result, start_client, start_envoy, xfcc_uri
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.packet_capture import capture, tcp_payloads
from aether.testing.quic_mesh import (
    CLIENT,
    HOST,
    MD,
    ONLY_OTHER,
    OPTS,
    OTHER,
    TD,
    VIP,
    WEB,
    Mesh,
    quic_mesh,
    two_clusters,
)
from aether.testing.wait import wait_for
from aether.xds.identity.sds import secrets
from aether.xds.resources import LISTENER, Resources
from aether.xds.translate.eastwest import gateway
from aether.xds.translate.eastwest.build import camel
from aether.xds.translate.eastwest.tls import downstream_tls, tcp_downstream_socket

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

GATEWAY_IP = "10.199.0.2"  # node B's end of the node link (quic_mesh)
GATEWAY_ID = f"spiffe://{TD}/ns/aether-system/sa/east-west-gateway"  # only the negative control's listener has it
WEB_SNI = quic_sni(8080, "web-sa", "default", MD)
NO_CHAIN = "listener.east_west_gateway.no_filter_chain_match"
FORWARDED = "tcp.east_west_gateway.downstream_cx_total"
H2_ACTIVE = r"^cluster\.h2_default/web\.upstream_cx_active$"
H2_SAN_FAILED = r"^cluster\.h2_default/web\.ssl\.fail_verify_san$"


def gateway_resources(mesh: Mesh) -> Resources:
    """Node B's gateway role as the sidecar translates it (`aether xds --east-west-gateway 10.199.0.2`): node B's
    MeshNode lists default/web (web-0) among its QUIC destinations, so the gateway exports it."""
    node, records = sample_node(
        "node-b",
        [SamplePod("u-web", "web-0", mesh.web.ip, "web-sa", mesh.web.path)],
        [SampleDestination("default/web", "web-sa", (8080,), (mesh.web.ip,))],
    )
    return gateway.area(node, records, replace(OPTS, east_west_gateway=GATEWAY_IP))


def serve_b(mesh: Mesh, gw: Resources) -> None:
    mesh.ads.set("node-b", mesh.resources_b(), gw, secrets(mesh.ca, [WEB, GATEWAY_ID]))


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with quic_mesh(tmp_path_factory.mktemp("gateway")) as m:
        two_clusters(m)
        # h2 only (quic=False): this module is the TCP half; the QUIC half is test_gateway_quic_datapath.py
        m.serve_a(m.resources_a(quic=False, remote_gateways={"default/web": (GATEWAY_IP,)}))
        serve_b(m, gateway_resources(m))
        m.wait_synced(m.a)
        m.wait_synced(m.b)
        yield m


def s_client(mesh: Mesh, sni: str | None, *extra: str) -> str:
    """openssl s_client from node A's netns to the gateway (stdin closed: handshake, print, quit)."""
    name = ["-servername", sni] if sni is not None else ["-noservername"]
    argv = ["openssl", "s_client", "-connect", f"{GATEWAY_IP}:{EAST_WEST_PORT}", *name, "-showcerts", *extra]
    out = subprocess.run(
        ["ip", "netns", "exec", mesh.client.node.netns, *argv],
        input="",
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout + out.stderr


def certificates(output: str) -> list[x509.Certificate]:
    blocks = re.findall(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", output, re.S)
    return [x509.load_pem_x509_certificate(b.encode()) for b in blocks]


def uri_sans(cert: x509.Certificate) -> list[str]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    return ext.value.get_values_for_type(x509.UniformResourceIdentifier)


def test_node_a_has_no_route_to_web0(mesh: Mesh) -> None:
    """The fixture's premise: node A reaches web-0 only through the gateway (as across two clusters' networks)."""
    out = subprocess.run(
        ["ip", "netns", "exec", mesh.client.node.netns, "ip", "route", "get", mesh.web.ip],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "unreachable" in out.stderr, out


def test_the_app_sees_each_source_through_the_gateway(mesh: Mesh) -> None:
    forwarded = mesh.b.stat(FORWARDED)
    for pod, identity in ((mesh.client, CLIENT), (mesh.other, OTHER)):
        (_status, body), *_ = mesh.until_200(pod)
        assert xfcc_uri(body) == identity, body
    assert mesh.b.stat(FORWARDED) >= forwarded + 2  # one connection per source identity, through the gateway
    assert mesh.b.stat_sum(r"^cluster\.east-west_8080\.web-sa\.default\.mesh\.example\.upstream_cx_total$") >= 2
    # node A dialled the gateway over h2, never a twin (QUIC off on node A in this module)
    assert mesh.a.stat_sum(r"^cluster\.h2_default/web\.upstream_cx_total$") >= 2
    assert mesh.a.stat_sum(r"^cluster\.quic_.*\.upstream_cx_total$") == 0
    hosts = {m for m in re.findall(r"^h2:default/web::([0-9.]+:[0-9]+)::", mesh.a.admin("/clusters"), re.M)}
    assert hosts == {f"{GATEWAY_IP}:{EAST_WEST_PORT}"}, hosts
    # the gateway holds no certificate: Envoy on node B has only web-0's SVID and the bundle
    dumped = mesh.b.config_dump("dynamic_active_secrets")["configs"]
    assert GATEWAY_ID not in str([c["name"] for c in dumped])


def test_openssl_through_the_gateway_sees_the_destinations_svid(mesh: Mesh, tmp_path: Path) -> None:
    root = tmp_path / "root.pem"
    root.write_text(mesh.ca.bundle().pem)
    out = s_client(mesh, WEB_SNI, "-CAfile", str(root), "-verify_return_error")
    chain = certificates(out)
    assert chain, out
    assert uri_sans(chain[0]) == [WEB], out
    assert "Verify return code: 0 (ok)" in out, out


@pytest.mark.parametrize(
    "sni", [quic_sni(8080, "nobody", "default", MD), quic_sni(9999, "web-sa", "default", MD), None]
)
def test_an_unknown_sni_gets_nothing_and_is_counted(mesh: Mesh, sni: str | None) -> None:
    before, forwarded = mesh.b.stat(NO_CHAIN), mesh.b.stat(FORWARDED)
    out = s_client(mesh, sni)
    assert certificates(out) == [], out
    wait_for(lambda: mesh.b.stat(NO_CHAIN) == before + 1, 10, f"{NO_CHAIN} +1", diagnose=lambda: out)
    assert mesh.b.stat(FORWARDED) == forwarded  # nothing forwarded to any default


def terminating(gw: Resources) -> Resources:
    """The negative control: the gateway's listener with a TLS context holding the gateway's own SVID (what a
    re-originating gateway would present); chains, clusters and tcp_proxy unchanged."""
    out = copy.deepcopy(gw)
    socket = camel(tcp_downstream_socket(downstream_tls(GATEWAY_ID, TD, None)))
    for chain in out[LISTENER][gateway.LISTENER_NAME]["filterChains"]:
        chain["transportSocket"] = socket
    return out


def test_negative_control_a_terminating_gateway_is_told_apart(mesh: Mesh) -> None:
    gw = gateway_resources(mesh)
    try:
        serve_b(mesh, terminating(gw))
        seen: list[str] = []

        def gateway_identity() -> bool:
            chain = certificates(s_client(mesh, WEB_SNI))
            seen[:] = uri_sans(chain[0]) if chain else []
            return seen == [GATEWAY_ID]

        wait_for(gateway_identity, 30, "the terminating listener", diagnose=lambda: f"leaf URIs {seen}")
        # the passthrough connections drain with their old chains (drain time 2 s); the next one meets the new chain
        wait_for(lambda: mesh.a.stat_sum(H2_ACTIVE) == 0, 30, "node A's h2 connections to the gateway closed")
        refused, hits = mesh.a.stat_sum(H2_SAN_FAILED), mesh.app_hits()
        out = mesh.get(mesh.client, n=2)
        assert all(s != 200 for s, _ in out), out
        assert mesh.a.stat_sum(H2_SAN_FAILED) > refused  # the source's pinned destination SAN refused the gateway
        assert mesh.app_hits() == hits
    finally:
        serve_b(mesh, gw)
    mesh.wait_synced(mesh.b)
    wait_for(lambda: uri_sans(certificates(s_client(mesh, WEB_SNI))[0]) == [WEB], 30, "passthrough again")
    (_status, body), *_ = mesh.until_200(mesh.client)
    assert xfcc_uri(body) == CLIENT


def test_a_policy_applies_through_the_gateway_unchanged(mesh: Mesh) -> None:
    """A MeshAuthorizationPolicy on default/web admitting only other-0's identity: through the gateway client-0 gets
    403 and other-0 200, as in-cluster callers would (the inbound sees each source's own SVID)."""
    gw = gateway_resources(mesh)
    try:
        mesh.ads.set("node-b", mesh.resources_b([ONLY_OTHER]), gw, secrets(mesh.ca, [WEB]))
        wait_for(lambda: mesh.get(mesh.client)[0][0] == 403, 30, "client-0 denied through the gateway")
        hits = mesh.app_hits()
        assert [s for s, _ in mesh.get(mesh.client, n=2)] == [403, 403]
        assert mesh.app_hits() == hits  # the app saw none of them
        (_status, body), *_ = mesh.until_200(mesh.other)
        assert xfcc_uri(body) == OTHER
    finally:
        serve_b(mesh, gw)
    mesh.wait_synced(mesh.b)
    mesh.until_200(mesh.client)


def test_strict_on_the_destination_admits_the_gateways_hop(mesh: Mesh) -> None:
    """web-0 in STRICT: a new connection from the gateway's tcp_proxy reaches web-0 on the inbound port 18008,
    which STRICT admits from anyone (the mTLS handshake is the check there): s_client through the gateway (a new
    gateway -> web-0 connection each time) still gets web-0's SVID, and a request still
    answers with the source's identity."""
    try:
        mesh.enforce(InboundMode.STRICT)
        chain = certificates(s_client(mesh, WEB_SNI))
        assert chain and uri_sans(chain[0]) == [WEB]
        (_status, body), *_ = mesh.until_200(mesh.client)
        assert xfcc_uri(body) == CLIENT
    finally:
        mesh.enforce(InboundMode.PERMISSIVE)


def test_the_gateways_links_carry_only_tls(mesh: Mesh) -> None:
    """A packet capture in node B's netns (both its links: to node A, where the gateway listens, and to web-0)
    during a request carrying a marker header: the marker never crosses them in the clear, while TLS records do
    (to 18009 and to 18008). Control: the same capture in web-0's netns, where the inbound hands the request to the
    app over loopback, sees the marker, so the capture would have seen it."""
    marker = f"aether-marker-{uuid.uuid4().hex}"
    work = mesh.workdir
    with (
        capture(mesh.lab, mesh.web.node.netns, work / "node-b.frames") as node_b,
        capture(mesh.lab, mesh.web.netns, work / "web-0.frames") as web0,
    ):
        (status, body), *_ = mesh.get(mesh.client, headers={"x-marker": marker})
        assert status == 200 and xfcc_uri(body) == CLIENT, body
        wait_for(lambda: marker.encode() in b"".join(web0()), 10, "the app's hop in the capture")
    at_gateway, onward = tcp_payloads(node_b(), EAST_WEST_PORT), tcp_payloads(node_b(), 18008)
    assert at_gateway and onward, "no TCP payload to 18009 and 18008 captured on node B"
    assert marker.encode() not in b"".join(node_b())
    for payloads in (at_gateway, onward):
        assert any(p[:3] == b"\x17\x03\x03" for p in payloads)  # TLS application data records


def test_a_gateway_restart_recovers_without_any_change(mesh: Mesh) -> None:
    """The gateway as its own Envoy (node id `gateway`, in node B's netns, on the same address): killed and started
    again while client-0 sends requests, it comes back on the snapshot the ADS server already holds (no config
    change, no operator): the failures are one contiguous window around the restart, and every request after it
    answers 200 with client-0's identity."""
    gw_res = gateway_resources(mesh)
    mesh.ads.set("node-b", mesh.resources_b(), secrets(mesh.ca, [WEB]))
    mesh.ads.set("gateway", gw_res)
    wait_for(lambda: gateway.LISTENER_NAME not in mesh.b.active_config("dynamic_listeners"), 30, "B without it")
    mesh.b.wait_drained()
    own = start_envoy(mesh.lab, mesh.web.node.netns, "gateway", mesh.workdir, mesh.ads)
    try:
        own.wait_live()
        mesh.until_200(mesh.client)
        assert own.stat("tcp.east_west_gateway.downstream_cx_total") >= 1
        rx = "tcp.east_west_gateway.downstream_cx_rx_bytes_total"
        before = own.stat(rx)
        load = start_client(mesh.lab, mesh.client.netns, HOST, n=150, ip=VIP, pause=0.02)
        wait_for(lambda: own.stat(rx) > before, 30, "the load's requests through it")
        own.stop()
        own = start_envoy(mesh.lab, mesh.web.node.netns, "gateway", mesh.workdir, mesh.ads)  # same snapshot
        own.wait_live()
        results = client_result(load)
    finally:
        own.stop()
        serve_b(mesh, gw_res)
        mesh.wait_synced(mesh.b)
    failed = [i for i, (s, _) in enumerate(results) if s != 200]
    assert failed, "the restart cost no request: the client did not straddle it"
    assert failed == list(range(failed[0], failed[-1] + 1)), failed  # one window
    after = results[failed[-1] + 1 :]
    print(f"gateway restart: requests {failed[0]}-{failed[-1]} of {len(results)} failed, {len(after)} answered after")
    assert len(after) >= 10 and all(xfcc_uri(b) == CLIENT for _, b in after), results[failed[-1] :][:3]
