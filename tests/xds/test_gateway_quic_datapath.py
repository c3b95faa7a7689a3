"""The east-west gateway's QUIC half on the real data path (the rig: `aether.testing.quic_mesh`, two node netns and
their real Envoys, no pod route across). Node B also plays the gateway with its QUIC half
(`gateway.area` with `east_west_gateway_quic`): the `aether_quic_sni` module (built by cargo, on Envoy's
`ENVOY_DYNAMIC_MODULES_SEARCH_PATH`) and udp_proxy on 10.199.0.2:18009, exporting default/web. Node A holds
default/web as a remote Service (`EastWestOptions.remote_gateways`): each source's HTTP/3 twin dials the gateway's
UDP 18009 with the SNI, pinned SPIFFE ID and source SVID of the in-cluster path.

- client-0 -> node A's twin (HTTP/3) -> gateway UDP 18009 (module + udp_proxy) -> web-0's inbound UDP 18008 -> app:
  the app's XFCC carries client-0's SPIFFE ID (other-0's for other-0), the destination's access log says HTTP/3;
- a MeshAuthorizationPolicy on default/web applies across the gateway (403 for the source it does not name);
- a packet capture on node B's links sees only QUIC packets to 18009 (long headers, then short headers) and never a
  request's marker header (the same capture in web-0's netns does see it);
- the gateway as its own Envoy, restarted during traffic: what a source's QUIC connection does then (measured).
"""

from __future__ import annotations

import copy
import os
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from aether.api.naming import quic_sni
from aether.testing.eastwest_lab import client_result, start_client, start_envoy, xfcc_uri
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.envoy_modules import build as build_modules
from aether.testing.packet_capture import capture, udp_payloads
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
from aether.xds.identity.sds import sds_ref, secrets
from aether.xds.identity.svid import svid_secret_name
from aether.xds.resources import CLUSTER, LISTENER, TYPE_URL_PREFIX, Resources
from aether.xds.translate.eastwest import gateway, gateway_quic
from aether.xds.translate.eastwest.build import camel
from aether.xds.translate.eastwest.inbound import HCM_NAME, HCM_TYPE, ROUTER
from aether.xds.translate.eastwest.outbound import HTTP_OPTIONS
from aether.xds.translate.eastwest.tls import (
    TLS_SOCKET,
    UPSTREAM_TLS,
    downstream_tls,
    quic_downstream_socket,
    validation,
)

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

GATEWAY_IP = "10.199.0.2"  # node B's end of the node link (quic_mesh)
EAST_WEST = 18009
FORWARDED = "dynamicmodulescustom.quic_sni.quic_sni_forwarded"
SESSIONS = "udp.east_west_gateway_quic.downstream_sess_total"
TWIN_200 = r"^cluster\.quic_default/web@client\.upstream_rq_200$"
H2_VIA_TCP = "tcp.east_west_gateway.downstream_cx_total"
GATEWAY_ID = f"spiffe://{TD}/ns/aether-system/sa/east-west-gateway"  # only the negative control's listener has it
WEB_SNI = quic_sni(8080, "web-sa", "default", MD)
REORIGIN = "gw-reoriginate"
TERMINATING = "east-west-gateway-quic-terminating"


def gateway_resources(mesh: Mesh) -> Resources:
    """Node B's gateway role with its QUIC half, as the sidecar translates it where the module is."""
    node, records = sample_node(
        "node-b",
        [SamplePod("u-web", "web-0", mesh.web.ip, "web-sa", mesh.web.path)],
        [SampleDestination("default/web", "web-sa", (8080,), (mesh.web.ip,))],
    )
    opts = replace(OPTS, east_west_gateway=GATEWAY_IP, east_west_gateway_quic=True)
    return gateway.area(node, records, opts)


def serve_b(mesh: Mesh, gw: Resources, policies: list[dict[str, Any]] | None = None) -> None:
    mesh.ads.set("node-b", mesh.resources_b(policies), gw, secrets(mesh.ca, [WEB]))


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    before = os.environ.get("ENVOY_DYNAMIC_MODULES_SEARCH_PATH")
    os.environ["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"] = str(build_modules())  # the Envoys inherit it
    try:
        with quic_mesh(tmp_path_factory.mktemp("gateway-quic")) as m:
            two_clusters(m)
            m.serve_a(m.resources_a(remote_gateways={"default/web": (GATEWAY_IP,)}))
            serve_b(m, gateway_resources(m))
            m.wait_synced(m.a)
            m.wait_synced(m.b)
            yield m
    finally:
        if before is None:
            os.environ.pop("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", None)
        else:
            os.environ["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"] = before


def test_h3_through_the_gateway_carries_each_sources_identity(mesh: Mesh) -> None:
    assert gateway_quic.LISTENER_NAME in mesh.b.active_config("dynamic_listeners")
    for pod, identity in ((mesh.client, CLIENT), (mesh.other, OTHER)):
        (_status, body), *_ = mesh.until_200(pod)
        assert xfcc_uri(body) == identity, body

    # over HTTP/3 (the destination's access log), on node A's twins, through the gateway's QUIC passthrough
    def h3_from_each_source() -> bool:
        lines = mesh.access_b()
        return all(any(ln.startswith("HTTP/3 200") and f"peer={sid} " in ln for ln in lines) for sid in (CLIENT, OTHER))

    wait_for(h3_from_each_source, 10, "HTTP/3 from each source in node B's access log")
    assert mesh.a.stat_sum(TWIN_200) > 0
    assert mesh.b.stat(FORWARDED) >= 2  # one QUIC connection per source identity (its own twin)
    assert mesh.b.stat(SESSIONS) >= 2
    assert mesh.b.stats().get(H2_VIA_TCP, 0) == 0  # not over the TCP half
    # the gateway holds no certificate: node B's Envoy has only web-0's SVID and the bundle
    dumped = mesh.b.config_dump("dynamic_active_secrets")["configs"]
    assert all("east-west-gateway" not in c["name"] for c in dumped)


def test_a_policy_applies_through_the_quic_gateway(mesh: Mesh) -> None:
    gw = gateway_resources(mesh)
    try:
        serve_b(mesh, gw, [ONLY_OTHER])
        wait_for(lambda: mesh.get(mesh.client)[0][0] == 403, 30, "client-0 denied through the gateway")
        hits = mesh.app_hits()
        assert [s for s, _ in mesh.get(mesh.client, n=2)] == [403, 403]
        assert mesh.app_hits() == hits
        (_status, body), *_ = mesh.until_200(mesh.other)
        assert xfcc_uri(body) == OTHER
        assert mesh.a.stat_sum(r"^cluster\.quic_default/web@client\.upstream_rq_403$") >= 2  # on the twin
    finally:
        serve_b(mesh, gw)
    mesh.wait_synced(mesh.b)
    mesh.until_200(mesh.client)


def test_the_gateways_links_carry_only_quic(mesh: Mesh) -> None:
    """A capture in node B's netns during a request with a marker header: every datagram to 18009 is a QUIC packet
    (fixed bit set; long headers while the connection starts, short headers after), none carries the marker, and
    no TCP crosses to 18009. Control: the capture in web-0's netns sees the marker (the app's loopback hop)."""
    marker = f"aether-marker-{uuid.uuid4().hex}"
    work = mesh.workdir
    # a new connection, so the capture sees its handshake: a fresh gateway session for a new source port
    serve_b(mesh, gateway_resources(mesh))
    with (
        capture(mesh.lab, mesh.web.node.netns, work / "node-b-quic.frames") as node_b,
        capture(mesh.lab, mesh.web.netns, work / "web-0-quic.frames") as web0,
    ):
        (status, body), *_ = mesh.get(mesh.client, headers={"x-marker": marker})
        assert status == 200 and xfcc_uri(body) == CLIENT, body
        wait_for(lambda: marker.encode() in b"".join(web0()), 10, "the app's hop in the capture")
    to_gateway = udp_payloads(node_b(), EAST_WEST, to_port=True)
    assert to_gateway, "no datagram to 18009 captured on node B"
    assert all(p[0] & 0x40 for p in to_gateway), "a datagram to 18009 that is not QUIC"
    short = [p for p in to_gateway if not p[0] & 0x80]
    assert short, "no short-header (1-RTT) packet: the request did not cross the passthrough"
    assert marker.encode() not in b"".join(node_b())
    onward = udp_payloads(node_b(), 18008)
    assert onward and marker.encode() not in b"".join(onward)


def test_a_gateway_restart_loses_only_in_flight_requests(mesh: Mesh) -> None:
    """The gateway as its own Envoy (node id `gateway`, in node B's netns, on the same address), killed and started
    again while client-0 sends requests over HTTP/3: the new process has no session and no decision for the
    source's 4-tuple, so that connection's short-header packets are refused (counted, never forwarded). Measured:
    how many requests fail, and that every request after the window answers 200 with client-0's identity with
    nothing else restarted."""
    gw_res = gateway_resources(mesh)
    mesh.ads.set("node-b", mesh.resources_b(), secrets(mesh.ca, [WEB]))
    mesh.ads.set("gateway", gw_res)
    wait_for(lambda: gateway_quic.LISTENER_NAME not in mesh.b.active_config("dynamic_listeners"), 30, "B without it")
    mesh.b.wait_drained()
    own = start_envoy(mesh.lab, mesh.web.node.netns, "gateway", mesh.workdir, mesh.ads)
    try:
        own.wait_live()
        mesh.until_200(mesh.client)
        assert own.stat(FORWARDED) >= 1
        rx = "udp.east_west_gateway_quic.downstream_sess_rx_datagrams"
        before = own.stat(rx)
        load = start_client(mesh.lab, mesh.client.netns, HOST, n=150, ip=VIP, pause=0.02)
        wait_for(lambda: own.stat(rx) > before + 20, 30, "the load's requests through it")
        own.stop()
        own = start_envoy(mesh.lab, mesh.web.node.netns, "gateway", mesh.workdir, mesh.ads)  # same snapshot
        own.wait_live()
        results = client_result(load)
        refused = own.stats().get("dynamicmodulescustom.quic_sni.quic_sni_refused", 0)
    finally:
        own.stop()
        serve_b(mesh, gw_res)
        mesh.wait_synced(mesh.b)
    failed = [i for i, (s, _) in enumerate(results) if s != 200]
    after = results[failed[-1] + 1 :] if failed else results
    print(
        f"quic gateway restart: {len(failed)} of {len(results)} requests failed "
        f"({failed[:1]}..{failed[-1:]}), {len(after)} answered after, new gateway refused {refused} datagrams, "
        f"datagrams before the load {before}"
    )
    assert failed == list(range(failed[0], failed[-1] + 1)) if failed else True, failed  # one window
    assert len(after) >= 10 and all(xfcc_uri(b) == CLIENT for _, b in after), results[-3:]


def terminating(mesh: Mesh) -> Resources:
    """The negative control: in place of the passthrough, a QUIC listener on the gateway's UDP 18009 that
    terminates HTTP/3 with the gateway's own SVID and re-originates h2 to web-0's inbound with that SVID (what a
    re-originating gateway such as Linkerd's does)."""
    downstream = quic_downstream_socket(downstream_tls(GATEWAY_ID, TD, None))
    hcm = {
        "@type": HCM_TYPE,
        "stat_prefix": "gw_terminating",
        "codec_type": "HTTP3",
        "http3_protocol_options": {},
        "route_config": {
            "name": "gw-terminating",
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": REORIGIN}}],
                }
            ],
        },
        "http_filters": [ROUTER],
    }
    listener = {
        "name": TERMINATING,
        "address": {"socket_address": {"protocol": "UDP", "address": GATEWAY_IP, "port_value": EAST_WEST}},
        "udp_listener_config": {"quic_options": {}},
        "filter_chains": [{"transport_socket": downstream, "filters": [{"name": HCM_NAME, "typed_config": hcm}]}],
    }
    upstream = {
        "name": TLS_SOCKET,
        "typed_config": {
            "@type": UPSTREAM_TLS,
            "sni": WEB_SNI,
            "common_tls_context": {
                "alpn_protocols": ["h2"],
                "tls_certificate_sds_secret_configs": [sds_ref(svid_secret_name(GATEWAY_ID))],
                "combined_validation_context": validation(TD, [{"exact": WEB}], None),
            },
        },
    }
    endpoint = {"endpoint": {"address": {"socket_address": {"address": mesh.web.ip, "port_value": 18008}}}}
    cluster = {
        "name": REORIGIN,
        "type": "STATIC",
        "connect_timeout": "2s",
        "load_assignment": {"cluster_name": REORIGIN, "endpoints": [{"lb_endpoints": [endpoint]}]},
        "transport_socket": upstream,
        "typed_extension_protocol_options": {
            HTTP_OPTIONS: {
                "@type": TYPE_URL_PREFIX + HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
    }
    out = copy.deepcopy(gateway_resources(mesh))
    del out[LISTENER][gateway_quic.LISTENER_NAME]
    out[LISTENER][TERMINATING] = camel(listener)
    out[CLUSTER][REORIGIN] = camel(cluster)
    return out


def test_negative_control_a_terminating_quic_gateway_shows_its_own_identity(mesh: Mesh) -> None:
    """The same HTTP/3 request with the passthrough replaced by a terminating listener: client-0's twin, pinned to
    web-0's SPIFFE ID (and checking the SNI's DNS name), refuses the gateway's certificate (no request reaches the
    app); a twin variant that accepts the gateway's identity gets through, and the app sees the gateway's SPIFFE ID,
    not client-0's. So the tests above, where the app sees each source's own identity, can tell passthrough from
    termination."""
    remote: dict[str, Any] = {"remote_gateways": {"default/web": (GATEWAY_IP,)}}
    try:
        mesh.ads.set("node-b", mesh.resources_b(), terminating(mesh), secrets(mesh.ca, [WEB, GATEWAY_ID]))
        wait_for(
            lambda: TERMINATING in mesh.b.active_config("dynamic_listeners"),
            30,
            "node B's terminating gateway",
            diagnose=lambda: mesh.b.log_tail(),
        )
        mesh.b.wait_drained()
        hits = mesh.app_hits()
        wait_for(lambda: mesh.get(mesh.client)[0][0] != 200, 30, "client-0's pinned twin refusing the gateway")
        assert [s for s, _ in mesh.get(mesh.client, n=2)] != [200, 200]
        assert mesh.app_hits() == hits  # nothing reached the app on the pinned twin

        def accept_gateway(u: dict[str, Any]) -> None:
            # the QUIC client checks both the pinned URI SAN and the SNI's DNS name (the SVID's *.<sa>.<ns>.<domain>)
            sans = u["commonTlsContext"]["combinedValidationContext"]["defaultValidationContext"]
            sans["matchTypedSubjectAltNames"][0]["matcher"] = {"exact": GATEWAY_ID}
            u["sni"] = quic_sni(8080, "east-west-gateway", "aether-system", MD)

        mesh.serve_a(mesh.with_twin_variant("accepts-gateway", accept_gateway, **remote))
        mesh.wait_synced(mesh.a)
        (_status, body), *_ = mesh.until_200(mesh.client)
        assert xfcc_uri(body) == GATEWAY_ID, body  # the app sees the gateway, not client-0
    finally:
        mesh.serve_a(mesh.resources_a(**remote))
        serve_b(mesh, gateway_resources(mesh))
        mesh.wait_synced(mesh.a)
        mesh.wait_synced(mesh.b)
    (_status, body), *_ = mesh.until_200(mesh.client)
    assert xfcc_uri(body) == CLIENT  # passthrough again: the source's own identity
