"""The pod inbound on 18008 against real clients aimed straight at it (the rig: `aether.testing.quic_mesh`, the
clients: `aether.testing.inbound_clients`): no TLS session resumption on the TCP mTLS chain (openssl s_client
`-sess_out`/`-sess_in`, TLS 1.3 tickets and TLS 1.2 sessions), ALPN h2, and XFCC set by the mesh alone (a forged
header over h2, HTTP/3 and through the source node's outbound never reaches the app).

Seen red on the config before this rule: both resumptions were `Reused` without any client certificate and reached
the app as `spiffe://cluster.local/ns/default/sa/client`; s_client said `No ALPN negotiated`.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from aether.testing.eastwest_lab import xfcc_uri
from aether.testing.inbound_clients import (
    Exchange,
    Pems,
    h2_get,
    h2_request,
    h3_get,
    openssl_resume,
    openssl_session,
    write_pems,
)
from aether.testing.quic_mesh import CLIENT, HOST, MD, TWIN, Mesh, quic_mesh
from aether.testing.wait import wait_for
from aether.xds.gates.quic import run_quic_gates, tcp_no_resumption
from aether.xds.resources import LISTENER, Resources

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

SNI = f"8080.web-sa.default.{MD}"
FORGED = {"x-forwarded-client-cert": "URI=spiffe://cluster.local/ns/kube-system/sa/admin"}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with quic_mesh(tmp_path_factory.mktemp("inbound")) as m:
        m.until_200(m.client)
        yield m


@pytest.fixture(scope="module")
def pems(mesh: Mesh) -> Pems:
    return write_pems(mesh.ca.svid(CLIENT), mesh.ca.bundle(), mesh.workdir / "pems", "client")


_STAMPS = itertools.count(1)


def _stamped(res: Resources) -> Resources:
    """A harmless field of the TCP inbound changed to a new value: Envoy 1.40 ignores an update back to a listener
    config it ran before an in-place filter-chain update (seen here: the push is acked, the old chains stay), so
    every config these tests serve is new."""
    out = copy.deepcopy(res)
    for name, listener in out[LISTENER].items():
        if name.startswith("inbound-h2:"):
            listener["perConnectionBufferLimitBytes"] = 1_048_576 + next(_STAMPS)
    return out


def _resumption_allowed(res: Resources) -> Resources:
    """Node B's resources with the TCP inbound's resumption switches removed (the config before this rule)."""
    out = _stamped(res)
    for name, listener in out[LISTENER].items():
        if name.startswith("inbound-h2:"):
            for chain in listener["filterChains"]:
                ctx = chain["transportSocket"]["typedConfig"]
                ctx.pop("disableStatelessSessionResumption")
                ctx.pop("disableStatefulSessionResumption")
    return out


def _session(mesh: Mesh, pems: Pems, tls: str, name: str) -> tuple[Path, bool]:
    path = mesh.workdir / f"session-{name}-{tls}.pem"
    first = openssl_session(mesh.client.netns, mesh.web.ip, 18008, SNI, pems, path, h2_request(HOST), tls)
    assert first.body is not None and xfcc_uri(json.dumps(first.body)) == CLIENT, first.output[-2000:]
    assert "New, TLS" in first.output
    return path, first.session_saved


def _resumed(mesh: Mesh, session: Path, tls: str) -> Exchange:
    return openssl_resume(mesh.client.netns, mesh.web.ip, 18008, SNI, session, h2_request(HOST), tls)


@pytest.mark.parametrize("tls", ["tls1_3", "tls1_2"])
def test_a_resumed_session_without_a_certificate_is_refused(mesh: Mesh, pems: Pems, tls: str) -> None:
    """Red first: the inbound as it was (no resumption switches) gives a session that, offered with no certificate
    at all, is resumed and reaches the app as the identity that first handshook, and the gate refuses that config.
    Then the inbound as built: the same session is forced to a full handshake that asks for the certificate (and,
    given none, fails), and a full handshake gives no session to resume at all."""
    reused = f"listener.{mesh.web.ip}_18008.ssl.session_reused"
    old = _resumption_allowed(mesh.resources_b())
    assert {f.gate for f in run_quic_gates(old)} == {"tcp-no-resumption"}
    assert len(tcp_no_resumption(old)) == 3  # the TCP listener's three chains (8080, 9090, primary)
    try:
        mesh.serve_b(res=old)
        mesh.wait_synced(mesh.b)
        session, saved = _session(mesh, pems, tls, "old")
        assert saved
        before = mesh.b.stat(reused)
        red = _resumed(mesh, session, tls)
        assert red.reused and not red.asked_for_a_certificate, red.output[-2000:]
        assert red.body is not None and xfcc_uri(json.dumps(red.body)) == CLIENT
        assert mesh.b.stat(reused) == before + 1
    finally:
        mesh.serve_b(res=_stamped(mesh.resources_b()))
        mesh.wait_synced(mesh.b)
    assert run_quic_gates(mesh.resources_b()) == []
    hits, before = mesh.app_hits(), mesh.b.stat(reused)
    green = _resumed(mesh, session, tls)
    assert not green.reused and green.asked_for_a_certificate, green.output[-2000:]
    assert green.body is None and mesh.app_hits() == hits
    _, saved = _session(mesh, pems, tls, "new")
    assert not saved  # no ticket (1.3) and no resumable session id (1.2): nothing to offer next time
    assert mesh.b.stat(reused) == before


def test_the_tcp_inbound_negotiates_h2(mesh: Mesh, pems: Pems, tmp_path: Path) -> None:
    first = openssl_session(
        mesh.client.netns, mesh.web.ip, 18008, SNI, pems, tmp_path / "s.pem", h2_request(HOST), "tls1_3"
    )
    assert first.alpn == "h2", first.output[-2000:]
    out = h2_get(mesh.client.netns, mesh.web.ip, 18008, SNI, pems, HOST)
    assert (out.get("status"), out.get("alpn")) == (200, "h2"), out


def _only_the_verified_peer(body: str) -> None:
    xfcc = json.loads(body)["xfcc"]
    assert "kube-system" not in xfcc and "," not in xfcc, xfcc  # one element, set by the inbound
    assert xfcc_uri(body) == CLIENT


def test_a_forged_xfcc_never_reaches_the_app_on_the_inbound(mesh: Mesh, pems: Pems) -> None:
    """Straight to node B's inbound with a valid SVID and a forged header, over h2 and HTTP/3: the app sees the
    verified peer only."""
    for get in (h2_get, h3_get):
        out = get(mesh.client.netns, mesh.web.ip, 18008, SNI, pems, HOST, FORGED)
        assert out.get("status") == 200, (get.__name__, out)
        _only_the_verified_peer(str(out["body"]))


def test_a_forged_xfcc_from_a_pod_never_reaches_the_app_through_the_mesh(mesh: Mesh) -> None:
    """The pod's own request through the source node (HTTP/3 on the twin, then h2 with the twin absent)."""
    for status, body in mesh.get(mesh.client, n=2, headers=FORGED):
        assert status == 200
        _only_the_verified_peer(body)
    try:
        mesh.serve_a(mesh.resources_a(quic=False))
        wait_for(lambda: TWIN not in mesh.a.admin("/clusters"), 30, "twins gone")
        mesh.until_200(mesh.client)
        for status, body in mesh.get(mesh.client, n=2, headers=FORGED):
            assert status == 200
            _only_the_verified_peer(body)
    finally:
        mesh.serve_a()
        mesh.wait_applied(mesh.a, TWIN)
