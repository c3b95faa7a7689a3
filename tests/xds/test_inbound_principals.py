"""Identity is the peer certificate's one URI SAN (the X.509-SVID rule), on the real data path: certificates of the
mesh's own CA with a second URI SAN, or with the allowed SPIFFE ID written as a DNS SAN or as the subject's common
name, aimed straight at web-0's inbound (18008) over h2 and HTTP/3 from client-0's netns (`aether.testing.
inbound_clients`), with and without a MeshAuthorizationPolicy on the port.

Where each is stopped:
- at the handshake (both chains): no URI SAN of the trust domain at all (DNS-only, another trust domain, an
  `https://` URI only): the inbound's validation context matches URI SANs with the prefix `spiffe://<td>/`;
- by RBAC (both chains, 403 `rbac_access_denied_matched_policy[aether:not-one-spiffe-id]`): a certificate that passes
  that check but does not carry exactly one URI SAN (`aether.xds.translate.eastwest.rbac.ID_FILTER`), whether or
  not a policy guards the port;
- by RBAC (403): a policy's principal matches the one URI SAN only, never a DNS SAN or the subject.

Seen red on main before this: every certificate of the RBAC cases answered 200 (the app reached, XFCC carrying both
URI SANs where there were two), because `authenticated.principal_name` matches any URI SAN, then any DNS SAN, then
the subject.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from aether.testing.eastwest_lab import xfcc_uri
from aether.testing.inbound_clients import Pems, h2_get, h3_get, write_pems
from aether.testing.quic_mesh import CLIENT, HOST, MD, OTHER, TD, Mesh, quic_mesh
from aether.testing.wait import wait_for
from aether.xds.resources import ROUTE

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

SNI = f"8080.web-sa.default.{MD}"
ADMIN = f"spiffe://{TD}/ns/kube-system/sa/admin"
EVIL = "https://evil.example/"
POLICY = {
    "apiVersion": "mesh.aether.dev/v1alpha1",
    "kind": "MeshAuthorizationPolicy",
    "metadata": {"name": "web-callers", "namespace": "default"},
    "spec": {"targetRefs": [{"kind": "Service", "name": "web"}], "rules": [{"from": [CLIENT], "ports": [8080]}]},
}
CLIENTS = {"h2": h2_get, "h3": h3_get}
PROTOCOL = {"h2": "HTTP/2", "h3": "HTTP/3"}

# name -> (URI SANs, DNS SANs, subject common name)
BORROWED: dict[str, tuple[list[str], list[str], str | None]] = {
    "two-uris-allowed-first": ([CLIENT, OTHER], [], None),
    "two-uris-allowed-second": ([OTHER, CLIENT], [], None),
    "spiffe-then-https": ([CLIENT, EVIL], [], None),
    "dns-san-is-the-id": ([OTHER], [CLIENT], None),
    "subject-is-the-id": ([OTHER], [], CLIENT),
}
NOT_ONE_ID: dict[str, tuple[list[str], list[str], str | None]] = {
    "two-spiffe-ids": ([OTHER, ADMIN], [], None),
    "spiffe-then-https": ([OTHER, EVIL], [], None),
}
AT_HANDSHAKE: dict[str, tuple[list[str], list[str], str | None]] = {
    "dns-only": ([], [CLIENT.removeprefix("spiffe://").replace("/", "."), "client.default.svc"], None),
    "other-trust-domain": (["spiffe://evil.example/ns/default/sa/client"], [], None),
    "https-only": ([EVIL], [], None),
}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with quic_mesh(tmp_path_factory.mktemp("principals")) as m:
        yield m


def pems(mesh: Mesh, name: str, sans: tuple[list[str], list[str], str | None]) -> Pems:
    uris, dns, cn = sans
    svid = mesh.ca.issue(uris[0] if uris else None, more_uris=uris[1:], dns_names=dns, common_name=cn)
    return write_pems(svid, mesh.ca.bundle(), mesh.workdir / "pems", name)


def serve_b_synced(mesh: Mesh, policies: list[dict[str, Any]]) -> None:
    """Serve node B `policies` (its Service default/web known) and wait until its inbound routes run them."""
    mesh.serve_b(policies=policies)
    mesh.wait_synced(mesh.b)
    snap = mesh.ads.cache.get("node-b")
    assert snap is not None
    want = {n: v for n, v in snap.versions.get(ROUTE, {}).items() if n.startswith("inbound:")}

    def active() -> dict[str, str]:
        dump = mesh.b.config_dump("dynamic_route_configs").get("configs", [])
        return {c["route_config"]["name"]: c["version_info"] for c in dump if "route_config" in c}

    wait_for(lambda: all(active().get(n) == v for n, v in want.items()), 30, "node B's inbound routes in place")


def call(mesh: Mesh, proto: str, cert: Pems) -> dict[str, object]:
    return CLIENTS[proto](mesh.client.netns, mesh.web.ip, 18008, SNI, cert, HOST)


def until_200(mesh: Mesh, proto: str, cert: Pems) -> dict[str, object]:
    def ok() -> dict[str, object] | None:
        out = call(mesh, proto, cert)
        return out if out.get("status") == 200 else None

    return wait_for(ok, 30, f"a 200 over {proto}")


def seen(out: dict[str, object]) -> str | None:
    return xfcc_uri(str(out["body"])) if out.get("status") == 200 else None


def rbac_refusals(mesh: Mesh, proto: str, certs: dict[str, Pems]) -> dict[str, object]:
    """name -> what the inbound answered, for every certificate that was not refused by RBAC (403, app not reached)."""
    wrong: dict[str, object] = {}
    for name, cert in certs.items():
        hits = mesh.app_hits()
        out = call(mesh, proto, cert)
        if out.get("status") != 403 or "RBAC" not in str(out.get("body")) or mesh.app_hits() != hits:
            wrong[name] = (out.get("status"), seen(out), str(out.get("body"))[:200])
    return wrong


@pytest.fixture(scope="module")
def guarded(mesh: Mesh) -> Mesh:
    serve_b_synced(mesh, [POLICY])
    return mesh


@pytest.mark.parametrize("proto", ["h2", "h3"])
def test_a_policy_matches_the_one_uri_san_only(guarded: Mesh, proto: str) -> None:
    mesh = guarded
    real = write_pems(mesh.ca.svid(CLIENT), mesh.ca.bundle(), mesh.workdir / "pems", "client")
    out = until_200(mesh, proto, real)
    assert seen(out) == CLIENT  # the control: the allowed SVID itself
    certs = {"other": write_pems(mesh.ca.svid(OTHER), mesh.ca.bundle(), mesh.workdir / "pems", "other")}
    certs.update({name: pems(mesh, name, sans) for name, sans in BORROWED.items()})
    assert rbac_refusals(mesh, proto, certs) == {}


@pytest.fixture(scope="module")
def open_port(mesh: Mesh, guarded: Mesh) -> Mesh:
    """No policy on web (after the guarded tests, which share the module's mesh)."""
    serve_b_synced(mesh, [])
    return mesh


def json_lines(mesh: Mesh) -> list[dict[str, Any]]:
    text = mesh.b.log_path.read_text(errors="replace")
    return [json.loads(line) for line in text.splitlines() if line.startswith("{") and '"aether-inbound"' in line]


@pytest.mark.parametrize("proto", ["h2", "h3"])
def test_without_a_policy_a_certificate_must_carry_exactly_one_spiffe_id(open_port: Mesh, proto: str) -> None:
    """Refused by the identity check, counted apart from policy denials and logged with its reason."""
    mesh = open_port
    other = write_pems(mesh.ca.svid(OTHER), mesh.ca.bundle(), mesh.workdir / "pems", "other")
    out = until_200(mesh, proto, other)
    assert seen(out) == OTHER  # any one SPIFFE ID of the trust domain, as before
    hcm = {"h2": "http.inbound_http2", "h3": "http.inbound_http3"}[proto]
    before = (mesh.b.stat(f"{hcm}.rbac.spiffe_id_.denied"), mesh.b.stat(f"{hcm}.rbac.denied"))
    certs = {name: pems(mesh, name, sans) for name, sans in NOT_ONE_ID.items()}
    assert rbac_refusals(mesh, proto, certs) == {}
    after = (mesh.b.stat(f"{hcm}.rbac.spiffe_id_.denied"), mesh.b.stat(f"{hcm}.rbac.denied"))
    assert after == (before[0] + len(certs), before[1]), (before, after)  # counted as the identity check's

    def lines() -> list[dict[str, Any]] | None:
        found = [ln for ln in json_lines(mesh) if ln["source"] in (f"{OTHER},{ADMIN}", f"{OTHER},{EVIL}")]
        return found if len({ln["source"] for ln in found if ln["protocol"] == PROTOCOL[proto]}) == 2 else None

    for line in wait_for(lines, 10, "the refused requests' lines in node B's stdout"):
        assert (line["status"], line["identity"], line["rbac"]) == (403, "denied", None), line
        assert line["responseCodeDetails"] == "rbac_access_denied_matched_policy[aether:not-one-spiffe-id]", line


def handshake_lines(mesh: Mesh) -> list[dict[str, Any]]:
    text = mesh.b.log_path.read_text(errors="replace")
    return [json.loads(ln) for ln in text.splitlines() if ln.startswith("{") and '"aether-inbound-handshake"' in ln]


@pytest.mark.parametrize("proto", ["h2", "h3"])
def test_no_uri_san_of_the_trust_domain_is_refused_at_the_handshake(open_port: Mesh, proto: str) -> None:
    """Refused before any request, counted by reason (`ssl.fail_verify_san`; QUIC also by its close code) and, over
    TCP, logged with Envoy's reason (the SAN matcher and the SANs the certificate had); Envoy logs no QUIC
    connection, so HTTP/3 has the counters only."""
    mesh = open_port
    listener = f"listener.{mesh.web.ip}_18008"
    quic_close = f"{listener}.http3.downstream.tx.quic_connection_close_error_code_QUIC_TLS_CERTIFICATE_UNKNOWN"
    before = (mesh.b.stat(f"{listener}.ssl.fail_verify_san"), mesh.b.stat(quic_close), len(handshake_lines(mesh)))
    for name, sans in AT_HANDSHAKE.items():
        hits = mesh.app_hits()
        out = call(mesh, proto, pems(mesh, name, sans))
        assert "error" in out and "status" not in out, (proto, name, out)
        assert mesh.app_hits() == hits, (proto, name)
    n = len(AT_HANDSHAKE)
    wait_for(lambda: mesh.b.stat(f"{listener}.ssl.fail_verify_san") == before[0] + n, 10, "fail_verify_san")
    if proto == "h3":
        wait_for(lambda: mesh.b.stat(quic_close) == before[1] + n, 10, "the QUIC close code counted")
        return

    def lines() -> list[dict[str, Any]] | None:
        found = handshake_lines(mesh)[before[2] :]
        return found if len(found) >= n else None

    found = wait_for(lines, 10, "a handshake line per refused TCP connection")
    assert {(ln["transport"], ln["destinationPod"], ln["sni"]) for ln in found} == {("TCP", "default/web-0", SNI)}
    reasons = [ln["reason"] for ln in found]
    assert all("CERTIFICATE_VERIFY_FAILED" in r and "SAN_matcher" in r for r in reasons), reasons
    assert any("spiffe://evil.example/ns/default/sa/client" in r for r in reasons), reasons


def test_xfcc_of_an_admitted_request_names_one_uri(open_port: Mesh) -> None:
    mesh = open_port
    for proto in CLIENTS:
        out = call(mesh, proto, write_pems(mesh.ca.svid(OTHER), mesh.ca.bundle(), mesh.workdir / "pems", "o"))
        assert out.get("status") == 200, out
        xfcc = json.loads(str(out["body"]))["xfcc"]
        assert xfcc.count("URI=") == 1, xfcc
