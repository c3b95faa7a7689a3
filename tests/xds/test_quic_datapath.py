"""East-west HTTP/3 with per-source mTLS identity on the real data path: two nodes, each with its own real Envoy
1.40 over delta ADS, the capture in the source pods, an echo app in the destination pod that returns the XFCC header
it got (the rig: `aether.testing.quic_mesh`). Node A: pods client-0 (SA client) and other-0 (SA client in namespace
team-b). Node B: pod web-0 (SA web-sa) behind Service default/web.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from aether.testing.eastwest_lab import client_result, http_in_netns, quic_probe, start_client, xfcc_uri
from aether.testing.quic_mesh import (
    CLIENT,
    HOST,
    MD,
    OTHER,
    TD,
    TWIN,
    VIP,
    VIP_UDP,
    WEB,
    Mesh,
    as_names,
    quic_chain_counters,
    quic_mesh,
)
from aether.testing.wait import wait_for
from aether.xds.gates.quic import run_quic_gates
from aether.xds.identity.sds import secrets

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with quic_mesh(tmp_path_factory.mktemp("quic")) as m:
        yield m


def test_h3_carries_each_source_identity(mesh: Mesh) -> None:
    assert run_quic_gates(mesh.resources_a()) == []
    (_, body), *_ = mesh.until_200(mesh.client)
    assert xfcc_uri(body) == CLIENT
    assert [xfcc_uri(b) for s, b in mesh.get(mesh.other, n=3)] == [OTHER] * 3
    assert [xfcc_uri(b) for s, b in mesh.get(mesh.client, n=3)] == [CLIENT] * 3
    # every spelling of the destination routes to it: <svc>.<ns>, <svc>.<ns>.<mesh-domain>[:port], the VIP
    for host in ("web.default", f"{HOST}:18080", VIP, f"{VIP}:18080"):
        (status, body), *_ = http_in_netns(mesh.client.netns, host, ip=VIP)
        assert (status, xfcc_uri(body)) == (200, CLIENT), host

    # the destination proxy saw HTTP/3 from each source, with the source's SPIFFE ID as the verified peer
    def h3_from_each_source() -> bool:
        lines = mesh.access_b()
        return all(any(ln.startswith("HTTP/3 200") and f"peer={sid} " in ln for ln in lines) for sid in (CLIENT, OTHER))

    wait_for(h3_from_each_source, 10, "HTTP/3 from each source in node B's access log")
    # and the source proxy sent them on the twins
    twins = mesh.a.stats("quic_default")
    assert twins.get("cluster.quic_default/web@client.upstream_rq_200", 0) > 0, twins
    assert twins.get("cluster.quic_default/web@team-b/client.upstream_rq_200", 0) > 0, twins


def test_h2_when_the_twin_is_absent(mesh: Mesh) -> None:
    try:
        mesh.serve_a(mesh.resources_a(quic=False))
        wait_for(lambda: TWIN not in mesh.a.admin("/clusters"), 30, "twins gone")
        before = len(mesh.access_b_flushed())  # the earlier requests' lines are all in
        bodies = [mesh.until_200(mesh.client)[0][1], *(b for _, b in mesh.get(mesh.other, n=2))]
        assert [xfcc_uri(b) for b in bodies] == [CLIENT, OTHER, OTHER]
        wait_for(lambda: len(mesh.access_b()) >= before + 3, 10, "access log lines")
        new = mesh.access_b()[before:]
        assert new and all(line.startswith("HTTP/2 200") for line in new[-3:]), new
        assert f"peer={CLIENT}" in new[-3] and f"peer={OTHER}" in new[-1]
    finally:
        mesh.serve_a()
        mesh.wait_applied(mesh.a, TWIN)


def test_envoy_string_identity_leaks_and_the_gate_catches_it(mesh: Mesh) -> None:
    """Negative control of the identity-hashable gate: with `envoy.string` the h2 pool is not partitioned and
    the second source's request rides the first source's connection, arriving with the first source's ID."""
    leaky = mesh.resources_a(quic=False, identity_factory="envoy.string")
    assert [f.gate for f in run_quic_gates(leaky)] == ["identity-hashable", "identity-hashable"]
    try:
        mesh.serve_a(leaky)
        wait_for(lambda: "envoy.string" in mesh.a.active_config("dynamic_listeners"), 30, "envoy.string listeners")
        # client-0 goes first: its upstream h2 connection stays pooled after its own connection closes; with
        # `envoy.string` the pool key does not carry the identity, so other-0's requests ride that connection
        assert {xfcc_uri(b) for s, b in mesh.until_200(mesh.client)} == {CLIENT}
        seen_by_other = {xfcc_uri(b) for s, b in mesh.get(mesh.other, n=5) if s == 200}
        assert seen_by_other == {CLIENT}, f"expected the leak (other-0 arriving as client-0), saw {seen_by_other}"
    finally:
        mesh.serve_a()
        mesh.wait_applied(mesh.a, TWIN)
        wait_for(lambda: "envoy.string" not in mesh.a.active_config("dynamic_listeners"), 30, "envoy.string gone")


def test_no_client_certificate_is_refused(mesh: Mesh) -> None:
    # positive control of the variant mechanism: an unchanged copy of the twin under a new name answers 200
    mesh.serve_a(mesh.with_twin_variant("same", lambda u: None))
    mesh.wait_routed_to(f"{TWIN}~same")
    assert xfcc_uri(mesh.until_200(mesh.client)[0][1]) == CLIENT
    try:
        mesh.serve_a(
            mesh.with_twin_variant("nocert", lambda u: u["commonTlsContext"].pop("tlsCertificateSdsSecretConfigs"))
        )
        mesh.wait_routed_to(f"{TWIN}~nocert")
        mesh.refused("no client certificate")
    finally:
        mesh.serve_a()
        mesh.wait_routed_to(f'"{TWIN}"')
    mesh.until_200(mesh.client)


def test_unpinned_san_is_refused(mesh: Mesh) -> None:
    """A client SVID whose URI SAN is outside the mesh trust domain (same CA): the inbound SAN match refuses it."""
    mesh.until_200(mesh.client)
    foreign = mesh.ca.issue("spiffe://elsewhere.example/ns/default/sa/client", dns_names=(f"client.default.{MD}",))
    before = mesh.b.stat_sum(r"ssl\.fail_verify_san$")
    try:
        mesh.serve_a(secret_overrides=as_names(foreign, CLIENT))
        mesh.wait_synced(mesh.a)  # node A holds the foreign SVID before the next handshake
        mesh.bounce_inbound()
        mesh.refused("unpinned SAN")
        assert mesh.b.stat_sum(r"ssl\.fail_verify_san$") > before
    finally:
        mesh.serve_a()
        mesh.wait_synced(mesh.a)
        mesh.bounce_inbound()
    mesh.until_200(mesh.client)


def test_bare_port_sni_with_uri_only_svids_is_refused(mesh: Mesh) -> None:
    """The QUIC client checks the server leaf's DNS SANs against the SNI: `8080` with URI-only SVIDs fails."""
    mesh.until_200(mesh.client)
    uri_only = mesh.ca.issue(WEB)
    try:
        mesh.serve_b(secret_overrides=as_names(uri_only, WEB))
        mesh.serve_a(mesh.with_twin_variant("bareport", lambda u: u.__setitem__("sni", "8080")))
        mesh.wait_routed_to(f"{TWIN}~bareport")
        mesh.wait_synced(mesh.b)  # B presents the URI-only SVID ...
        mesh.wait_synced(mesh.a)  # ... and A's twin variant is active (not warming: a 503 would prove nothing)
        mesh.refused("bare-port SNI with URI-only SVIDs")
    finally:
        mesh.serve_b()
        mesh.serve_a()
        mesh.wait_routed_to(f'"{TWIN}"')
    mesh.until_200(mesh.client)


def test_plaintext_to_the_inbound_port_never_reaches_an_app(mesh: Mesh) -> None:
    mesh.until_200(mesh.client)
    hits = mesh.app_hits()
    inbound = f"listener.{mesh.web.ip}_18008"
    tls_refused = mesh.b.stat(f"{inbound}.ssl.connection_error")
    quic_reset = mesh.b.stat(f"{inbound}.quic.dispatcher.stateless_reset_packets_sent")
    request = b"GET / HTTP/1.1\r\nHost: web\r\n\r\n"
    sender = (
        "import socket,sys;ip=sys.argv[1];req=sys.argv[2].encode()\n"
        "u=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
        "[u.sendto(req,(ip,18008)) for _ in range(20)]\n"
        "t=socket.create_connection((ip,18008),timeout=5);t.sendall(req)\n"
        "try:\n  print(repr(t.recv(100)))\nexcept Exception as e:\n  print(repr(e))\n"
    )
    out = subprocess.run(
        ["ip", "netns", "exec", mesh.client.netns, sys.executable, "-c", sender, mesh.web.ip, request.decode()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "HTTP/" not in out.stdout  # TLS-only on TCP 18008: no HTTP answer to plaintext
    # node B is done with both: its TLS chain refused the TCP bytes and its QUIC dispatcher answered the datagrams
    # (not a QUIC connection it knows) with a stateless reset
    wait_for(
        lambda: (
            mesh.b.stat(f"{inbound}.ssl.connection_error") > tls_refused
            and mesh.b.stat(f"{inbound}.quic.dispatcher.stateless_reset_packets_sent") > quic_reset
        ),
        10,
        "node B refusing the plaintext",
    )
    assert mesh.app_hits() == hits


def test_rotation_under_traffic(mesh: Mesh) -> None:
    """New handshakes present the new SVID; every request keeps succeeding."""
    mesh.until_200(mesh.client)
    old = mesh.ca.svid(CLIENT)
    on_twin = f"cluster.{TWIN.replace(':', '_')}.upstream_rq_total"
    sent = mesh.a.stat(on_twin)
    traffic = start_client(mesh.lab, mesh.client.netns, HOST, n=60, ip=VIP, pause=0.05)
    wait_for(lambda: mesh.a.stat(on_twin) >= sent + 5, 30, "traffic on the twin")  # rotate under traffic
    new = mesh.ca.rotate(CLIENT)
    mesh.ca.rotate(WEB)
    mesh.serve_a()
    mesh.serve_b()
    assert new.fingerprint != old.fingerprint
    results = client_result(traffic)
    assert [s for s, _ in results] == [200] * 60
    assert {xfcc_uri(b) for _, b in results} == {CLIENT}
    # a new handshake (new connection) presents the new certificate
    serial = format(_serial(new.chain_pem), "x")
    mesh.bounce_inbound()
    mesh.until_200(mesh.client)
    wait_for(lambda: any(serial in line.lower() for line in mesh.access_b()[-5:]), 30, "the new serial at node B")


def _serial(chain_pem: str) -> int:
    from cryptography import x509

    return int(x509.load_pem_x509_certificates(chain_pem.encode())[0].serial_number)


def test_a_quic_handshake_to_the_plaintext_port_never_reaches_a_quic_chain(mesh: Mesh) -> None:
    """R5 on the wire: a QUIC Initial sent to VIP:18082 is carried by the plaintext class as opaque datagrams
    (the app's UDP socket gets them) and no QUIC chain on either node sees it."""
    res = mesh.resources_a_with_udp()
    assert run_quic_gates(res) == []
    sni = f"8080.web-sa.default.{MD}"
    try:
        mesh.ads.set("node-a", res, secrets(mesh.ca, [CLIENT, OTHER]))
        wait_for(lambda: "capture-udp:" in mesh.a.active_config("dynamic_listeners"), 30, "UDP capture listener")
        mesh.wait_synced(mesh.a)  # its cluster too
        # positive control: the probe does reach a QUIC chain when aimed at one (it is refused: no client cert)
        before = quic_chain_counters(mesh.b)
        out = quic_probe(mesh.client.netns, mesh.web.ip, 18008, sni)
        assert out.startswith("FAILED") or out.startswith("CONNECTED"), out
        wait_for(lambda: quic_chain_counters(mesh.b) > before, 10, "the probe reaching node B's QUIC listener")
        # the case: VIP_UDP:18082 is the plaintext class
        a0, b0 = quic_chain_counters(mesh.a), quic_chain_counters(mesh.b)
        udp0 = mesh.app_udp_hits()
        out = quic_probe(mesh.client.netns, VIP_UDP, 18082, sni)
        assert out.startswith("FAILED"), out
        # the plaintext class carried the datagrams to the app (else the test would prove nothing)
        wait_for(lambda: mesh.app_udp_hits() > udp0, 10, "the probe's datagrams at the app's UDP port")
        assert (quic_chain_counters(mesh.a), quic_chain_counters(mesh.b)) == (a0, b0)
    finally:
        mesh.serve_a()


def test_quic_sni_picks_the_app_port(mesh: Mesh) -> None:
    """The inbound matches the SNI `<port>.<sa>.<ns>.<mesh-domain>` per app port; the primary port is the default."""
    assert json.loads(mesh.until_200(mesh.client)[0][1])["port"] == 8080
    try:
        mesh.serve_a(mesh.with_twin_variant("port9090", lambda u: u.__setitem__("sni", f"9090.web-sa.default.{MD}")))
        mesh.wait_routed_to(f"{TWIN}~port9090")
        body = mesh.until_200(mesh.client)[0][1]
        assert json.loads(body)["port"] == 9090 and xfcc_uri(body) == CLIENT
    finally:
        mesh.serve_a()
        mesh.wait_routed_to(f'"{TWIN}"')


def test_h2_selector_serves_each_identity_to_several_destinations(mesh: Mesh) -> None:
    """Several h2 clusters' selectors ask for the same identities (one SDS name each, shared): every source
    arrives with its own ID at every destination, first use and later ones."""
    try:
        mesh.serve_a(mesh.resources_a(quic=False, more_destinations=("web2", "web3")))
        wait_for(lambda: "h2:default/web3" in mesh.a.admin("/clusters"), 30, "web3's h2 cluster")
        wait_for(lambda: TWIN not in mesh.a.admin("/clusters"), 30, "twins gone")
        for svc in ("web", "web2", "web3", "web2"):
            for pod, sid in ((mesh.client, CLIENT), (mesh.other, OTHER)):
                out = http_in_netns(pod.netns, f"{svc}.default.{MD}", n=2, ip=VIP)
                assert [(s, xfcc_uri(b)) for s, b in out] == [(200, sid)] * 2, (svc, pod.name, out)
    finally:
        mesh.serve_a()
        mesh.wait_routed_to(f'"{TWIN}"')


def test_a_destination_outside_the_twins_san_pin_is_refused(mesh: Mesh) -> None:
    """The client side of the pin: a twin expecting another destination identity refuses node B's SVID."""
    mesh.until_200(mesh.client)
    name = f"{TWIN}~otherpin"
    pin = [{"sanType": "URI", "matcher": {"exact": f"spiffe://{TD}/ns/default/sa/not-web"}}]

    def repin(u: dict[str, Any]) -> None:
        u["commonTlsContext"]["combinedValidationContext"]["defaultValidationContext"]["matchTypedSubjectAltNames"] = (
            pin
        )

    try:
        mesh.serve_a(mesh.with_twin_variant("otherpin", repin))
        mesh.wait_routed_to(name)
        mesh.refused("destination outside the SAN pin")
        assert mesh.a.stat_sum(r"^cluster\.quic_default/web@client~otherpin\.ssl\.fail_verify_san$") > 0
    finally:
        mesh.serve_a()
        mesh.wait_routed_to(f'"{TWIN}"')
    mesh.until_200(mesh.client)


def test_an_idle_source_connection_closes_at_both_ends(mesh: Mesh) -> None:
    """The h2 pools are per source identity, so a source's connection is only ever reused by that source: without an
    idle timeout a ServiceAccount's connections (and node B's side of them) stayed Envoy's default hour after its
    last request, one more set per ServiceAccount that came and went (the soak's node with h2 sources grew by
    them). With `idle_timeout_s` each closes once idle that long, at the source and at the destination, and the
    next request opens a new one as the same source."""
    h2 = r"^cluster\.h2_default/web\."
    try:
        mesh.serve_a(mesh.resources_a(quic=False, idle_timeout_s=1.5))
        wait_for(lambda: TWIN not in mesh.a.admin("/clusters"), 30, "twins gone")
        wait_for(lambda: '"1.500s"' in mesh.a.active_config("dynamic_active_clusters"), 30, "the idle timeout applied")
        closed = mesh.a.stat_sum(h2 + r"upstream_cx_idle_timeout$")
        for pod, sid in ((mesh.client, CLIENT), (mesh.other, OTHER)):
            assert [(s, xfcc_uri(b)) for s, b in mesh.until_200(pod)][-1] == (200, sid)
        assert mesh.a.stat_sum(h2 + r"upstream_cx_active$") == 2  # one per source: the pool is keyed by identity
        wait_for(lambda: mesh.a.stat_sum(h2 + r"upstream_cx_idle_timeout$") >= closed + 2, 15, "both idle-closed")
        assert mesh.a.stat_sum(h2 + r"upstream_cx_active$") == 0
        wait_for(lambda: mesh.b.stat_sum(r"^http\.inbound_http2\.downstream_cx_active$") == 0, 15, "node B's side")
        assert [(s, xfcc_uri(b)) for s, b in mesh.get(mesh.other, n=2)] == [(200, OTHER)] * 2
    finally:
        mesh.serve_a()
        mesh.wait_routed_to(f'"{TWIN}"')
