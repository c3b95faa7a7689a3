"""East-west HTTP/3 with per-source mTLS identity on the real data path.

Two node netns, each with its own real Envoy 1.40 served over delta ADS by `aether.xds.ads.server`; pods behind veths;
the capture installed in the source pods; an echo app in the destination pod that returns the XFCC header it got.
Node A: pods client-0 (SA client) and other-0 (SA other). Node B: pod web-0 (SA web-sa) behind Service default/web.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aether.api.meshnode import Endpoint, ServiceArm
from aether.netns.contract import CaptureMode
from aether.netns.install import install_capture
from aether.testing.eastwest_lab import (
    AdsHarness,
    client_result,
    http_in_netns,
    quic_probe,
    start_client,
    start_echo,
    start_envoy,
    xfcc_uri,
)
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.envoy import Envoy
from aether.testing.netlab import Lab, Pod
from aether.testing.wait import wait_for
from aether.xds.gates.quic import run_quic_gates
from aether.xds.identity.ca import BuiltinCA
from aether.xds.identity.sds import secrets, svid_secret
from aether.xds.identity.svid import Svid, selector_secret_name, svid_secret_name
from aether.xds.resources import CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, Resources, TranslateOptions, merge
from aether.xds.translate.eastwest.build import EastWestOptions, build
from aether.xds.translate.l4 import udp

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

TD, MD = "cluster.local", "mesh.example"
OPTS = TranslateOptions(mesh_domain=MD, trust_domain=TD)
CLIENT = f"spiffe://{TD}/ns/default/sa/client"
# the other source: a ServiceAccount with the same name as CLIENT's, in another namespace (`default` in every
# namespace is the common case): its own identity, so its own twin (quic:default/web@team-b/client)
OTHER = f"spiffe://{TD}/ns/team-b/sa/client"
WEB = f"spiffe://{TD}/ns/default/sa/web-sa"
VIP = "10.96.0.20"
VIP_UDP = "10.96.0.30"
HOST = f"web.default.{MD}"
TWIN = "quic:default/web@client"


@dataclass
class Mesh:
    lab: Lab
    workdir: Path
    ads: AdsHarness
    ca: BuiltinCA
    a: Envoy
    b: Envoy
    client: Pod
    other: Pod
    web: Pod
    hits: Path

    def resources_a(self, *, more_destinations: tuple[str, ...] = (), **kw: Any) -> Resources:
        """Node A's east-west resources; `more_destinations` adds Services (same SA and pod as default/web)."""
        node, records = sample_node(
            "node-a",
            [
                SamplePod("u-client", "client-0", self.client.ip, "client", self.client.path),
                SamplePod("u-other", "other-0", self.other.ip, "client", self.other.path, namespace="team-b"),
            ],
            [
                SampleDestination("default/web", "web-sa", (8080,), (self.web.ip,), vip=VIP),
                *(SampleDestination(f"default/{svc}", "web-sa", (8080,), (self.web.ip,)) for svc in more_destinations),
            ],
        )
        ew = EastWestOptions(access_log_path=str(self.workdir / "access-a.log"), **kw)
        return build(node, records, OPTS, ew)

    def resources_a_with_udp(self) -> Resources:
        """Node A plus the plaintext UDP class (aether.xds.translate.l4.udp): VIP_UDP:18082 -> web-0's app port 8080."""
        node, records = sample_node(
            "node-a",
            [
                SamplePod("u-client", "client-0", self.client.ip, "client", self.client.path),
                SamplePod("u-other", "other-0", self.other.ip, "client", self.other.path, namespace="team-b"),
            ],
            [SampleDestination("default/web", "web-sa", (8080,), (self.web.ip,), vip=VIP)],
        )
        node.status.udp.services = [
            ServiceArm(
                service="default/web-udp",
                vip=VIP_UDP,
                cluster="udp:default/web-udp",
                endpoints=[Endpoint(ip=self.web.ip, port=8080)],
            )
        ]
        return merge(self.resources_a(), udp.build(node, records, OPTS))

    def resources_b(self) -> Resources:
        node, records = sample_node("node-b", [SamplePod("u-web", "web-0", self.web.ip, "web-sa", self.web.path)], [])
        ew = EastWestOptions(access_log_path=str(self.workdir / "access-b.log"), app_ports={"u-web": (8080, 9090)})
        return build(node, records, OPTS, ew)

    def serve_a(self, res: Resources | None = None, secret_overrides: dict[str, dict[str, Any]] | None = None) -> None:
        sec = secrets(self.ca, [CLIENT, OTHER])
        sec[SECRET].update(secret_overrides or {})
        self.ads.set("node-a", res if res is not None else self.resources_a(), sec)

    def serve_b(self, secret_overrides: dict[str, dict[str, Any]] | None = None) -> None:
        sec = secrets(self.ca, [WEB])
        sec[SECRET].update(secret_overrides or {})
        self.ads.set("node-b", self.resources_b(), sec)

    def get(self, pod: Pod, n: int = 1, via_vip: bool = True) -> list[tuple[int, str]]:
        return http_in_netns(pod.netns, HOST, n=n, ip=VIP if via_vip else "127.0.0.1")

    def access_b(self) -> list[str]:
        path = self.workdir / "access-b.log"
        return path.read_text().splitlines() if path.exists() else []

    def app_hits(self) -> int:
        return len(self.hits.read_text().splitlines())

    def until_200(self, pod: Pod, timeout: float = 30.0) -> list[tuple[int, str]]:
        """Requests until one answers 200 (after a push, Envoy takes a moment to apply it)."""
        out: list[tuple[int, str]] = []

        def ok() -> bool:
            nonlocal out
            out = self.get(pod)
            return out[0][0] == 200

        try:
            wait_for(ok, timeout, f"a 200 from {pod.name}", interval=0.3)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: last answer {out}; node A log: {self.a.log_tail(3000)}") from exc
        return out


def _wait_applied(node: Envoy, needle: str, timeout: float = 30.0) -> None:
    wait_for(lambda: needle in node.admin("/config_dump?include_eds"), timeout, f"{needle!r} in {node.node_id}")


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    workdir = tmp_path_factory.mktemp("quic")
    lab = Lab()
    ads = AdsHarness(workdir)
    try:
        na, nb = lab.add_node("qa"), lab.add_node("qb")
        client = lab.add_pod(na, "client-0", "10.200.1.2")
        other = lab.add_pod(na, "other-0", "10.200.1.3")
        web = lab.add_pod(nb, "web-0", "10.200.2.7")
        lab.link_nodes(na, nb, "10.199.0.1", "10.199.0.2")
        for pod in (client, other):
            install_capture(pod.path, CaptureMode.TPROXY)
        hits = workdir / "hits.log"
        start_echo(lab, web, (8080, 9090), hits)
        ca = BuiltinCA(TD, MD)
        a = start_envoy(lab, na.netns, "node-a", workdir, ads)
        b = start_envoy(lab, nb.netns, "node-b", workdir, ads)
        m = Mesh(lab, workdir, ads, ca, a, b, client, other, web, hits)
        m.serve_a()
        m.serve_b()
        a.wait_live()
        b.wait_live()
        yield m
    finally:
        ads.close()
        lab.close()


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
        time.sleep(0.5)  # earlier requests' access log lines are flushed (every 100 ms)
        before = len(mesh.access_b())
        bodies = [mesh.until_200(mesh.client)[0][1], *(b for _, b in mesh.get(mesh.other, n=2))]
        assert [xfcc_uri(b) for b in bodies] == [CLIENT, OTHER, OTHER]
        wait_for(lambda: len(mesh.access_b()) >= before + 3, 10, "access log lines")
        new = mesh.access_b()[before:]
        assert new and all(line.startswith("HTTP/2 200") for line in new[-3:]), new
        assert f"peer={CLIENT}" in new[-3] and f"peer={OTHER}" in new[-1]
    finally:
        mesh.serve_a()
        _wait_applied(mesh.a, TWIN)


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
        _wait_applied(mesh.a, TWIN)
        wait_for(lambda: "envoy.string" not in mesh.a.active_config("dynamic_listeners"), 30, "envoy.string gone")


def _refused(mesh: Mesh, why: str) -> None:
    hits = mesh.app_hits()
    out = mesh.get(mesh.client, n=2)
    assert all(s != 200 for s, _ in out), f"{why}: expected refusal, got {out}"
    assert mesh.app_hits() == hits, f"{why}: the app was reached"


def _as(svid: Svid, spiffe_id: str) -> dict[str, dict[str, Any]]:
    """`svid` served under both of `spiffe_id`'s secret names."""
    return {n: svid_secret(svid, n) for n in (svid_secret_name(spiffe_id), selector_secret_name(spiffe_id))}


def _with_twin_variant(mesh: Mesh, tag: str, change: Any) -> Resources:
    """Node A's resources where client-0's arm points to a changed copy of its twin under a new name (a new name
    is a fresh EDS subscription: re-pushing a changed twin under its old name warms for the 15 s EDS timeout)."""
    res = copy.deepcopy(mesh.resources_a())
    name = f"{TWIN}~{tag}"
    twin = copy.deepcopy(res[CLUSTER][TWIN])
    twin["name"] = name
    twin["edsClusterConfig"]["serviceName"] = name
    change(twin["transportSocket"]["typedConfig"]["upstreamTlsContext"])
    res[CLUSTER][name] = twin
    res[ENDPOINT][name] = {**res[ENDPOINT][TWIN], "clusterName": name}
    route = res[ROUTE]["http-outbound"]["virtualHosts"][0]["routes"][0]["route"]
    tree = route["inlineClusterSpecifierPlugin"]["extension"]["typedConfig"]["clusterMatcher"]["matcherTree"]
    tree["exactMatchMap"]["map"][CLIENT]["action"]["typedConfig"]["cluster"] = name
    return res


def _wait_routed_to(mesh: Mesh, cluster: str) -> None:
    wait_for(lambda: cluster in mesh.a.active_config("dynamic_route_configs"), 30, f"route to {cluster}")


def _bounce_inbound(mesh: Mesh, overrides: dict[str, dict[str, Any]] | None = None) -> None:
    """Node B re-binds its inbound QUIC listener (a changed harmless field): the listener drains, the QUIC
    connection from node A closes, and the next request needs a new handshake."""
    stamp = 9000 + int(time.monotonic_ns() % 997)
    res = mesh.resources_b()
    for name, lst in res[LISTENER].items():
        if name.startswith("inbound-h3:"):
            lst["udpListenerConfig"]["downstreamSocketConfig"]["maxRxDatagramSize"] = stamp
    sec = secrets(mesh.ca, [WEB])
    sec[SECRET].update(overrides or {})
    mesh.ads.set("node-b", res, sec)
    wait_for(lambda: f"{stamp}" in mesh.b.active_config("dynamic_listeners"), 30, "B re-bound")
    time.sleep(3.0)  # drain time (2 s) closes the old connections


def test_no_client_certificate_is_refused(mesh: Mesh) -> None:
    # positive control of the variant mechanism: an unchanged copy of the twin under a new name answers 200
    mesh.serve_a(_with_twin_variant(mesh, "same", lambda u: None))
    _wait_routed_to(mesh, f"{TWIN}~same")
    assert xfcc_uri(mesh.until_200(mesh.client)[0][1]) == CLIENT
    try:
        mesh.serve_a(
            _with_twin_variant(mesh, "nocert", lambda u: u["commonTlsContext"].pop("tlsCertificateSdsSecretConfigs"))
        )
        _wait_routed_to(mesh, f"{TWIN}~nocert")
        _refused(mesh, "no client certificate")
    finally:
        mesh.serve_a()
        _wait_routed_to(mesh, f'"{TWIN}"')
    mesh.until_200(mesh.client)


def test_unpinned_san_is_refused(mesh: Mesh) -> None:
    """A client SVID whose URI SAN is outside the mesh trust domain (same CA): the inbound SAN match refuses it."""
    mesh.until_200(mesh.client)
    foreign = mesh.ca.issue("spiffe://elsewhere.example/ns/default/sa/client", dns_names=(f"client.default.{MD}",))
    before = mesh.b.stat_sum(r"ssl\.fail_verify_san$")
    try:
        mesh.serve_a(secret_overrides=_as(foreign, CLIENT))
        time.sleep(1.0)
        _bounce_inbound(mesh)
        _refused(mesh, "unpinned SAN")
        assert mesh.b.stat_sum(r"ssl\.fail_verify_san$") > before
    finally:
        mesh.serve_a()
        time.sleep(1.0)
        _bounce_inbound(mesh)
    mesh.until_200(mesh.client)


def test_bare_port_sni_with_uri_only_svids_is_refused(mesh: Mesh) -> None:
    """The QUIC client checks the server leaf's DNS SANs against the SNI: `8080` with URI-only SVIDs fails."""
    mesh.until_200(mesh.client)
    uri_only = mesh.ca.issue(WEB)
    try:
        mesh.serve_b(secret_overrides=_as(uri_only, WEB))
        mesh.serve_a(_with_twin_variant(mesh, "bareport", lambda u: u.__setitem__("sni", "8080")))
        _wait_routed_to(mesh, f"{TWIN}~bareport")
        time.sleep(1.0)
        _refused(mesh, "bare-port SNI with URI-only SVIDs")
    finally:
        mesh.serve_b()
        mesh.serve_a()
        _wait_routed_to(mesh, f'"{TWIN}"')
    mesh.until_200(mesh.client)


def test_plaintext_to_the_inbound_port_never_reaches_an_app(mesh: Mesh) -> None:
    mesh.until_200(mesh.client)
    hits = mesh.app_hits()
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
    time.sleep(1.0)
    assert mesh.app_hits() == hits


def test_rotation_under_traffic(mesh: Mesh) -> None:
    """New handshakes present the new SVID; every request keeps succeeding."""
    mesh.until_200(mesh.client)
    old = mesh.ca.svid(CLIENT)
    traffic = start_client(mesh.lab, mesh.client.netns, HOST, n=60, ip=VIP, pause=0.05)
    time.sleep(0.5)
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
    _bounce_inbound(mesh)
    mesh.until_200(mesh.client)
    wait_for(lambda: any(serial in line.lower() for line in mesh.access_b()[-5:]), 30, "the new serial at node B")


def _serial(chain_pem: str) -> int:
    from cryptography import x509

    return int(x509.load_pem_x509_certificates(chain_pem.encode())[0].serial_number)


def _quic_chain_counters(node: Envoy) -> int:
    """Connections any QUIC listener of this node accepted (the inbound QUIC chains)."""
    return node.stat_sum(r"^http\.inbound_http3\.downstream_cx_total$") + node.stat_sum(
        r"^listener\.[0-9.]+_18008\.http3\.downstream\.rx\..*"
    )


def test_a_quic_handshake_to_the_plaintext_port_never_reaches_a_quic_chain(mesh: Mesh) -> None:
    """R5 on the wire: a QUIC Initial sent to VIP:18082 is carried by the plaintext class as opaque datagrams
    (the app's UDP socket gets them) and no QUIC chain on either node sees it."""
    res = mesh.resources_a_with_udp()
    assert run_quic_gates(res) == []
    sni = f"8080.web-sa.default.{MD}"
    try:
        mesh.ads.set("node-a", res, secrets(mesh.ca, [CLIENT, OTHER]))
        wait_for(lambda: "capture-udp:" in mesh.a.active_config("dynamic_listeners"), 30, "UDP capture listener")
        time.sleep(0.5)
        # positive control: the probe does reach a QUIC chain when aimed at one (it is refused: no client cert)
        before = _quic_chain_counters(mesh.b)
        out = quic_probe(mesh.client.netns, mesh.web.ip, 18008, sni)
        assert out.startswith("FAILED") or out.startswith("CONNECTED"), out
        wait_for(lambda: _quic_chain_counters(mesh.b) > before, 10, "the probe reaching node B's QUIC listener")
        # the case: VIP_UDP:18082 is the plaintext class
        a0, b0 = _quic_chain_counters(mesh.a), _quic_chain_counters(mesh.b)
        udp0 = sum(1 for line in mesh.hits.read_text().splitlines() if line.startswith("udp 8080"))
        out = quic_probe(mesh.client.netns, VIP_UDP, 18082, sni)
        assert out.startswith("FAILED"), out
        time.sleep(0.5)
        udp1 = sum(1 for line in mesh.hits.read_text().splitlines() if line.startswith("udp 8080"))
        assert udp1 > udp0, "the plaintext class did not carry the datagrams (the test would prove nothing)"
        assert (_quic_chain_counters(mesh.a), _quic_chain_counters(mesh.b)) == (a0, b0)
    finally:
        mesh.serve_a()


def test_quic_sni_picks_the_app_port(mesh: Mesh) -> None:
    """The inbound matches the SNI `<port>.<sa>.<ns>.<mesh-domain>` per app port; the primary port is the default."""
    assert json.loads(mesh.until_200(mesh.client)[0][1])["port"] == 8080
    try:
        mesh.serve_a(_with_twin_variant(mesh, "port9090", lambda u: u.__setitem__("sni", f"9090.web-sa.default.{MD}")))
        _wait_routed_to(mesh, f"{TWIN}~port9090")
        body = mesh.until_200(mesh.client)[0][1]
        assert json.loads(body)["port"] == 9090 and xfcc_uri(body) == CLIENT
    finally:
        mesh.serve_a()
        _wait_routed_to(mesh, f'"{TWIN}"')


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
        _wait_routed_to(mesh, f'"{TWIN}"')


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
        mesh.serve_a(_with_twin_variant(mesh, "otherpin", repin))
        _wait_routed_to(mesh, name)
        _refused(mesh, "destination outside the SAN pin")
        assert mesh.a.stat_sum(r"^cluster\.quic_default/web@client~otherpin\.ssl\.fail_verify_san$") > 0
    finally:
        mesh.serve_a()
        _wait_routed_to(mesh, f'"{TWIN}"')
    mesh.until_200(mesh.client)
