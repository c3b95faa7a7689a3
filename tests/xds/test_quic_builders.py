"""The east-west builders (pure): inbound h2 + QUIC per pod, outbound HTTP per pod, h2 clusters and twins."""

from __future__ import annotations

import copy
from typing import Any

from aether.testing.eastwest_sample import two_sources_one_destination
from aether.xds.resources import CLUSTER, ENDPOINT, LISTENER, ROUTE, Resources, TranslateOptions
from aether.xds.translate.eastwest.build import EastWestOptions, build, required_secrets

OPTS = TranslateOptions(mesh_domain="mesh.example", trust_domain="cluster.local")
CLIENT = "spiffe://cluster.local/ns/default/sa/client"
OTHER = "spiffe://cluster.local/ns/default/sa/other"
WEB = "spiffe://cluster.local/ns/default/sa/web-sa"


def _build(**kw: Any) -> Resources:
    node, records = two_sources_one_destination()
    return build(node, records, OPTS, EastWestOptions(**kw))


def test_resource_names_and_counts() -> None:
    res = _build()
    assert sorted(res[LISTENER]) == [
        "http-outbound:default/client-0",
        "http-outbound:default/other-0",
        "inbound-h2:default/client-0",
        "inbound-h2:default/other-0",
        "inbound-h3:default/client-0",
        "inbound-h3:default/other-0",
    ]
    assert sorted(res[CLUSTER]) == [
        "h2:default/web",
        "inbound:default/client-0:8080",
        "inbound:default/other-0:8080",
        "quic:default/web@client",
        "quic:default/web@other",
    ]
    # each twin has its own EDS name, and so does the h2 cluster
    assert sorted(res[ENDPOINT]) == ["h2:default/web", "quic:default/web@client", "quic:default/web@other"]
    for name in res[ENDPOINT]:
        assert res[CLUSTER][name]["edsClusterConfig"]["serviceName"] == name
    # the outbound route, and one inbound route per local pod's app port (RDS: where a policy's rules go)
    assert sorted(res[ROUTE]) == ["http-outbound", "inbound:default/client-0:8080", "inbound:default/other-0:8080"]


def test_build_is_deterministic_and_pure() -> None:
    node, records = two_sources_one_destination()
    before = copy.deepcopy(node.wire())
    assert build(node, records, OPTS) == build(node, records, OPTS)
    assert node.wire() == before


def test_inbound_tcp_and_quic_share_one_downstream_tls_context() -> None:
    res = _build()
    tcp = res[LISTENER]["inbound-h2:default/client-0"]
    quic = res[LISTENER]["inbound-h3:default/client-0"]
    for lst, proto in ((tcp, "TCP"), (quic, "UDP")):
        sa = lst["address"]["socketAddress"]
        assert (sa["protocol"], sa["address"], sa["portValue"]) == (proto, "10.200.1.2", 18008)
        assert sa["networkNamespaceFilepath"] == "/run/netns/sample-client"
    tcp_ctx = tcp["filterChains"][0]["transportSocket"]["typedConfig"]
    quic_ts = quic["filterChains"][0]["transportSocket"]["typedConfig"]
    # the same certificate and peer rules; TCP adds its own switches (QUIC has enableResumption) and ALPN h2
    tcp_only = ("disableStatelessSessionResumption", "disableStatefulSessionResumption")
    assert {k: v for k, v in tcp_ctx.items() if k not in ("@type", *tcp_only, "commonTlsContext")} == {
        k: v for k, v in quic_ts["downstreamTlsContext"].items() if k != "commonTlsContext"
    }
    assert {k: v for k, v in tcp_ctx["commonTlsContext"].items() if k != "alpnProtocols"} == quic_ts[
        "downstreamTlsContext"
    ]["commonTlsContext"]
    assert [tcp_ctx[k] for k in tcp_only] == [True, True]
    assert tcp_ctx["commonTlsContext"]["alpnProtocols"] == ["h2"]
    assert tcp_ctx["requireClientCertificate"] is True
    common = tcp_ctx["commonTlsContext"]
    assert common["tlsCertificateSdsSecretConfigs"] == [
        {"name": "svid:" + CLIENT, "sdsConfig": {"ads": {}, "resourceApiVersion": "V3"}}
    ]
    cvc = common["combinedValidationContext"]
    assert cvc["validationContextSdsSecretConfig"]["name"] == "bundle:cluster.local"
    assert cvc["defaultValidationContext"]["matchTypedSubjectAltNames"] == [
        {"sanType": "URI", "matcher": {"prefix": "spiffe://cluster.local/"}}
    ]
    # R4, written explicitly; GRO on the QUIC socket
    assert quic_ts["enableEarlyData"] is False and quic_ts["enableResumption"] is False
    assert quic["udpListenerConfig"] == {"quicOptions": {}, "downstreamSocketConfig": {"preferGro": True}}


def test_inbound_sets_xfcc_from_the_verified_peer_and_routes_by_sni() -> None:
    res = _build(app_ports={"u-client": (8080, 9090)})
    for name, codec in (("inbound-h2:default/client-0", "HTTP2"), ("inbound-h3:default/client-0", "HTTP3")):
        chains = res[LISTENER][name]["filterChains"]
        by_sni = {tuple(c.get("filterChainMatch", {}).get("serverNames", [])): c for c in chains}
        assert set(by_sni) == {("8080.client.default.mesh.example",), ("9090.client.default.mesh.example",), ()}
        for sni, port in ((("9090.client.default.mesh.example",), 9090), ((), 8080)):
            hcm = by_sni[sni]["filters"][0]["typedConfig"]
            assert hcm["codecType"] == codec
            assert hcm["forwardClientCertDetails"] == "SANITIZE_SET"
            assert hcm["setCurrentClientCertDetails"] == {"uri": True}
            route = res[ROUTE][hcm["rds"]["routeConfigName"]]["virtualHosts"][0]["routes"][0]["route"]
            assert route == {"cluster": f"inbound:default/client-0:{port}"}
    app = res[CLUSTER]["inbound:default/client-0:9090"]
    ep = app["loadAssignment"]["endpoints"][0]["lbEndpoints"][0]["endpoint"]["address"]["socketAddress"]
    assert (ep["address"], ep["portValue"]) == ("10.200.1.2", 9090)


def test_outbound_listener_stamps_the_pod_identity_hashable_then_on_demand_before_router() -> None:
    res = _build()
    lst = res[LISTENER]["http-outbound:default/other-0"]
    sa = lst["address"]["socketAddress"]
    assert (sa["address"], sa["portValue"], sa["networkNamespaceFilepath"]) == (
        "0.0.0.0",
        18080,
        "/run/netns/sample-other",
    )
    assert lst["transparent"] is True
    stamp, hcm = lst["filterChains"][0]["filters"]
    assert stamp["name"] == "envoy.filters.network.set_filter_state"
    assert stamp["typedConfig"]["onNewConnection"] == [
        {
            "objectKey": "envoy.tls.certificate_mappers.on_demand_secret",
            "factoryKey": "envoy.hashable_string",
            "formatString": {"textFormatSource": {"inlineString": OTHER}},
            "sharedWithUpstream": "ONCE",
        }
    ]
    cfg = hcm["typedConfig"]
    assert [f["name"] for f in cfg["httpFilters"]] == ["envoy.filters.http.on_demand", "envoy.filters.http.router"]
    assert cfg["rds"]["routeConfigName"] == "http-outbound"


def test_routes_pick_the_twin_per_source_identity_and_h2_otherwise() -> None:
    rc = _build()[ROUTE]["http-outbound"]
    assert rc["validateClusters"] is False
    (vh,) = rc["virtualHosts"]
    assert vh["domains"] == ["web.default", "web.default.mesh.example", "10.96.0.20"]
    spec = vh["routes"][0]["route"]["inlineClusterSpecifierPlugin"]["extension"]["typedConfig"]["clusterMatcher"]
    tree = spec["matcherTree"]
    assert tree["input"]["typedConfig"]["key"] == "envoy.tls.certificate_mappers.on_demand_secret"
    arms = {k: v["action"]["typedConfig"]["cluster"] for k, v in tree["exactMatchMap"]["map"].items()}
    assert arms == {CLIENT: "quic:default/web@client", OTHER: "quic:default/web@other"}
    assert spec["onNoMatch"]["action"]["typedConfig"]["cluster"] == "h2:default/web"


def test_without_quic_there_are_no_twins_and_routes_go_to_h2() -> None:
    res = _build(quic=False)
    assert not [c for c in res[CLUSTER] if c.startswith("quic:")]
    (vh,) = res[ROUTE]["http-outbound"]["virtualHosts"]
    assert vh["routes"][0]["route"] == {"cluster": "h2:default/web"}


def test_twin_carries_the_source_svid_sni_from_the_destination_service_account_and_pins_its_id() -> None:
    twin = _build()[CLUSTER]["quic:default/web@client"]
    assert twin["connectionPoolPerDownstreamConnection"] is False
    ts = twin["transportSocket"]
    assert ts["name"] == "envoy.transport_sockets.quic"
    utc = ts["typedConfig"]["upstreamTlsContext"]
    # <primary port>.<destination ServiceAccount>.<ns>.<mesh-domain>: not the Service name ("web")
    assert utc["sni"] == "8080.web-sa.default.mesh.example"
    common = utc["commonTlsContext"]
    assert [s["name"] for s in common["tlsCertificateSdsSecretConfigs"]] == ["svid:" + CLIENT]
    assert "customTlsCertificateSelector" not in common  # QUIC rejects the selector at load
    assert common["combinedValidationContext"]["defaultValidationContext"]["matchTypedSubjectAltNames"] == [
        {"sanType": "URI", "matcher": {"exact": WEB}}
    ]
    http = twin["typedExtensionProtocolOptions"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert http["explicitHttpConfig"] == {"http3ProtocolOptions": {}}
    ep = [
        e["endpoint"]["address"]["socketAddress"]
        for e in _build()[ENDPOINT]["quic:default/web@client"]["endpoints"][0]["lbEndpoints"]
    ]
    assert ep == [{"address": "10.200.2.7", "portValue": 18008}]


def test_h2_cluster_selects_the_certificate_per_connection_from_filter_state() -> None:
    h2 = _build()[CLUSTER]["h2:default/web"]
    utc = h2["transportSocket"]["typedConfig"]
    assert utc["sni"] == "8080.web-sa.default.mesh.example"
    sel = utc["commonTlsContext"]["customTlsCertificateSelector"]
    assert sel["name"] == "envoy.tls.certificate_selectors.on_demand_secret"
    mapper = sel["typedConfig"]["certificateMapper"]
    assert mapper["name"] == "envoy.tls.upstream_certificate_mappers.filter_state_override"
    assert mapper["typedConfig"]["defaultValue"] == "aether:no-source-identity"
    assert "tlsCertificateSdsSecretConfigs" not in utc["commonTlsContext"]


def test_pods_without_a_record_get_nothing_and_required_secrets_are_the_local_identities() -> None:
    node, records = two_sources_one_destination()
    del records["u-other"]
    res = build(node, records, OPTS)
    assert not [n for n in res[LISTENER] if "other-0" in n]
    assert "quic:default/web@other" not in res[CLUSTER]
    assert required_secrets(node, records, OPTS) == [CLIENT]


def test_every_resource_and_secret_encodes_for_ads() -> None:
    """The codec packs everything we build, including the two messages xds-protos lacks (the on_demand_secret
    selector and the filter_state_override mapper) and QuicDownstreamTransport.enable_resumption."""
    from aether.xds.codec.protojson import decode_json, encode
    from aether.xds.identity.ca import BuiltinCA
    from aether.xds.identity.sds import secrets
    from aether.xds.resources import merge

    res = merge(_build(access_log_path="/dev/null"), secrets(BuiltinCA(), [CLIENT, OTHER]))
    for type_url, named in res.items():
        for name, resource in named.items():
            assert encode(type_url, resource, name)
    h2 = decode_json(CLUSTER, encode(CLUSTER, res[CLUSTER]["h2:default/web"], "h2"))
    sel = h2["transportSocket"]["typedConfig"]["commonTlsContext"]["customTlsCertificateSelector"]["typedConfig"]
    assert sel["certificateMapper"]["typedConfig"]["defaultValue"] == "aether:no-source-identity"
    quic = decode_json(LISTENER, encode(LISTENER, res[LISTENER]["inbound-h3:default/client-0"], "h3"))
    ts = quic["filterChains"][0]["transportSocket"]["typedConfig"]
    assert ts["enableResumption"] is False and ts["enableEarlyData"] is False


def test_secrets_for_names_every_secret_the_resources_reference() -> None:
    import json

    from aether.xds.identity.ca import BuiltinCA
    from aether.xds.resources import SECRET
    from aether.xds.translate.eastwest.build import secrets_for

    node, records = two_sources_one_destination()
    res = build(node, records, OPTS)
    served = set(secrets_for(node, records, OPTS, BuiltinCA())[SECRET])
    text = json.dumps(res)
    referenced = {n for n in served if json.dumps(n) in text}
    # every TLS-context reference is served; the selector-only names are the stamped identities
    assert served == referenced | {CLIENT, OTHER}
    assert {"svid:" + CLIENT, "svid:" + OTHER, "bundle:cluster.local"} <= referenced


def test_app_ports_come_from_destinations_naming_the_pod_then_options_then_the_default() -> None:
    from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
    from aether.xds.translate.eastwest.plan import local_pods

    pods = [
        SamplePod("u1", "web-0", "10.200.1.2", "web", "/run/netns/w"),
        SamplePod("u2", "api-0", "10.200.1.3", "api", "/run/netns/a"),
        SamplePod("u3", "db-0", "10.200.1.4", "db", "/run/netns/d"),
    ]
    node, records = sample_node("n", pods, [SampleDestination("default/web", "web", (8443, 8080), ("10.200.1.2",))])
    got = {p.name: p.app_ports for p in local_pods(node, records, "td", EastWestOptions(app_ports={"u2": (9000,)}))}
    assert got == {"web-0": (8443, 8080), "api-0": (9000,), "db-0": (8080,)}


def test_float_timeouts_encode_as_valid_durations() -> None:
    """A timeout computed as a float (1.999999999985448 s) has more fractional digits than a protobuf Duration takes:
    every builder rounds it to microseconds (seen red: `f"{x}s"` in the east-west builders was refused by the codec)."""
    from aether.xds.codec.protojson import encode

    res = _build(connect_timeout_s=1.999999999985448, odcds_timeout_s=0.30000000000000004)
    for type_url, named in res.items():
        for name, resource in named.items():
            assert encode(type_url, resource, name)
    assert {c.get("connect_timeout", c.get("connectTimeout")) for c in res[CLUSTER].values()} == {"2s"}
