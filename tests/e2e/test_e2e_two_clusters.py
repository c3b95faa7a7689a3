"""One mesh over two clusters (issue 26 item 5): two real control planes, two nodes each in the netns lab, both
operators running, only A's gateway address reachable from B (e2e/clusters.py). A exports Service web
(ServiceExport, its gateway node labelled), B imports it (MeshPeer + ServiceImport), B's client-0 calls it by name.

- the request crosses A's gateway and web-0 receives client-0's own SPIFFE ID (XFCC), B's client-0 having no route
  to A's pods (a direct TCP connection and a UDP datagram to web-0's address fail). The source side gives a
  remote Service each source's QUIC twin through the gateway's UDP 18009 (since feb2ec4), so the request goes
  HTTP/3 through the QUIC passthrough; the TCP 18009 half is exercised with curl holding client-0's SVID as the
  source (h2, the destination verified), and XFCC carries client-0's ID there too;
- Service api, imported through a MeshPeer saying the same gateway offers h2 only (spec.transports: [h2]), is
  reached from client-0's node proxy over h2 through A's TCP 18009 (no twin), XFCC carrying client-0's ID;
- a MeshAuthorizationPolicy in A that does not admit client-0 gives 403 across clusters;
- a packet capture at A's gateway node shows QUIC datagrams to 18009 and 18008, never the request's marker;
- A's gateway Envoy killed and started again: only requests around the restart fail, the rest answer 200, with no
  operator action."""

from __future__ import annotations

import errno
import http.client
import json
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from aether.api.naming import mesh_host, spiffe_id
from aether.e2e.clusters import H2_ONLY, NS, TwoClusters, two_clusters
from aether.netns.contract import EAST_WEST_PORT, HTTP_OUTBOUND_PORT, INBOUND_PORT
from aether.netns.nsthread import run_in_netns
from aether.testing.packet_capture import capture, udp_payloads
from aether.testing.probe import HttpAnswer
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]
CLIENT = spiffe_id(NS, "client")


@pytest.fixture(scope="module")
def tc() -> Iterator[TwoClusters]:
    with two_clusters() as t:
        yield t


def test_cross_cluster_h2_delivers_the_sources_own_identity(tc: TwoClusters) -> None:
    got = tc.b_get("client-0", timeout=60)
    assert got == HttpAnswer(200, "web-0", CLIENT), f"{got}\n{tc.b.diagnostics()}\n{tc.a.diagnostics()}"
    b = tc.b.nodes["b-client"]
    assert b.stat("cluster.quic_shop/web@client.upstream_cx_http3_total") >= 1  # client-0's own twin, HTTP/3
    assert tc.gateway_stat("udp.east_west_gateway_quic.downstream_sess_total") >= 1  # through A's gateway


def test_h2_through_the_gateways_tcp_half_delivers_the_sources_identity(tc: TwoClusters) -> None:
    """The TCP 18009 half across the clusters: h2 with client-0's SVID (curl as the source proxy, verifying web-0's
    SVID against the shared root) through A's gateway; web-0's inbound verified client-0 and says so in XFCC."""
    before = tc.gateway_stat("tcp.east_west_gateway.downstream_cx_total")
    status, body = tc.h2_via_tcp()
    assert status == 200 and body["backend"] == "web-0", body
    assert f"URI={CLIENT}" in body["xfcc"] and f"By={spiffe_id(NS, 'web')}" in body["xfcc"], body
    assert tc.gateway_stat("tcp.east_west_gateway.downstream_cx_total") == before + 1


def test_a_peer_offering_h2_only_is_reached_over_tcp_from_the_source_proxy(tc: TwoClusters) -> None:
    """Service api, imported through a MeshPeer whose spec.transports is [h2]: B's client-0 calls it through its
    node proxy, which has no twin for it and dials A's gateway on TCP 18009 with client-0's own SVID; web-0's
    inbound verified client-0 (XFCC), and A's gateway counted the TCP connection, not a QUIC session."""
    b, before = tc.b.nodes["b-client"], tc.gateway_stat("tcp.east_west_gateway.downstream_cx_total")
    sessions = tc.gateway_stat("udp.east_west_gateway_quic.downstream_sess_total")
    got = tc.b_get("client-0", service=H2_ONLY, timeout=60)
    assert got == HttpAnswer(200, "web-0", CLIENT), f"{got}\n{tc.b.diagnostics()}\n{tc.a.diagnostics()}"
    assert b.stat(f"cluster.h2_shop/{H2_ONLY}.upstream_rq_200") >= 1
    assert b.stat(f"cluster.quic_shop/{H2_ONLY}@client.upstream_cx_http3_total") == 0
    assert tc.gateway_stat("tcp.east_west_gateway.downstream_cx_total") > before
    assert tc.gateway_stat("udp.east_west_gateway_quic.downstream_sess_total") == sessions


def test_no_pod_route_between_the_clusters(tc: TwoClusters) -> None:
    """B's client-0 cannot reach A's web-0 directly: a TCP connection to its app fails (ENETUNREACH: B's node has
    no route to it), and B's nodes have no route for a datagram to it either; only A's gateway address is."""
    web0 = tc.a.pods["web-0"].ip
    assert tc.direct_to_web0() == errno.ENETUNREACH
    for node in tc.b.nodes.values():
        route = subprocess.run(["ip", "netns", "exec", node.net.netns, "ip", "route", "get", web0], capture_output=True)
        assert route.returncode != 0 and b"unreachable" in route.stderr, (node.name, route)
    gw = ["ip", "netns", "exec", tc.b.nodes["b-client"].net.netns, "ip", "route", "get", tc.gateway]
    assert subprocess.run(gw, capture_output=True).returncode == 0  # the gateway's address is


def get_marked(tc: TwoClusters, marker: str) -> tuple[int, str]:
    """One GET from B's client-0 carrying an x-marker header (what a capture must never see in the clear)."""

    def get() -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", HTTP_OUTBOUND_PORT, timeout=5)
        try:
            conn.request("GET", "/", headers={"Host": mesh_host(NS, "web"), "x-marker": marker})
            resp = conn.getresponse()
            return resp.status, resp.read().decode(errors="replace")
        finally:
            conn.close()

    return run_in_netns(tc.b.pods["client-0"].netns_path, get)


def test_the_gateway_carries_only_tls(tc: TwoClusters) -> None:
    """A capture in A's gateway node netns (its link from B and its link to a-web) during a request with a unique
    marker header: QUIC datagrams to 18009 and to 18008 (the fixed bit set: RFC 9000 section 17), the marker
    never; control: a capture in web-0's netns (the inbound hands the request to the app over loopback) sees it."""
    tc.b_get("client-0", timeout=60)
    marker = f"aether-marker-{uuid.uuid4().hex}"
    gw, web0 = tc.a.nodes["a-gw"].net, tc.a.pods["web-0"].net
    with (
        capture(tc.a.lab, gw.netns, tc.a.dir / "a-gw.frames") as at_gw,
        capture(tc.a.lab, web0.netns, tc.a.dir / "web-0.frames") as at_app,
    ):
        status, body = get_marked(tc, marker)
        assert status == 200 and json.loads(body)["backend"] == "web-0", body
        wait_for(lambda: marker.encode() in b"".join(at_app()), 10, "the app's hop in the capture")
    frames = at_gw()
    inbound = udp_payloads(frames, EAST_WEST_PORT, to_port=True)
    onward = udp_payloads(frames, INBOUND_PORT, to_port=True)
    assert inbound and onward, "no UDP payload to 18009 and 18008 captured at the gateway"
    assert marker.encode() not in b"".join(frames)
    for payloads in (inbound, onward):
        assert all(p[0] & 0x40 for p in payloads)  # QUIC packets (fixed bit), protected


def test_a_policy_in_the_exporting_cluster_denies_across(tc: TwoClusters) -> None:
    tc.a.kube.authorization_policy(NS, "web-callers", "web", [spiffe_id(NS, "someone-else")])
    try:
        got = tc.b_get("client-0", want=403, timeout=60)
        assert got.status == 403, got
    finally:
        tc.api_a.delete("mesh.aether.dev/v1alpha1", "MeshAuthorizationPolicy", "web-callers", NS)
    assert tc.b_get("client-0", timeout=60) == HttpAnswer(200, "web-0", CLIENT)


def test_a_gateway_restart_loses_only_in_flight_requests(tc: TwoClusters) -> None:
    """A's gateway node Envoy killed and started again (same node, same sidecar: what a node pod's Envoy container
    restart does) while client-0 keeps calling: the failures are one window around the restart, every request
    after it answers 200 with client-0's identity, and nothing was applied to either cluster."""
    assert tc.b_get("client-0", timeout=60).status == 200
    node = tc.a.nodes["a-gw"]
    results: list[int | None] = []
    restarted_at = -1
    for i in range(120):
        if i == 20:
            node.running_envoy().stop()
            tc.a.restart_envoy(node)
            restarted_at = len(results)
        results.append(tc_get_status(tc))
        if i > 40 and results[-20:] == [200] * 20:
            break
    fails = [i for i, s in enumerate(results) if s != 200]
    assert results[-20:] == [200] * 20, results
    assert fails and fails == list(range(fails[0], fails[-1] + 1)), results  # one contiguous window
    assert fails[0] >= restarted_at - 1, results


def tc_get_status(tc: TwoClusters) -> int | None:
    try:
        return get_marked(tc, "restart")[0]
    except OSError:
        return None
