"""The east-west gates pass on what we build, and each is seen red on the bad shape it guards against."""

from __future__ import annotations

import copy
from typing import Any

from aether.api.meshnode import parse_meshnode
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node, two_sources_one_destination
from aether.xds.gates.quic import (
    classes_separated,
    identity_hashable,
    quic_no_resumption,
    run_quic_gates,
    tcp_no_resumption,
    twin_per_identity,
)
from aether.xds.resources import CLUSTER, LISTENER, ROUTE, Resources, TranslateOptions
from aether.xds.translate.eastwest.build import EastWestOptions, build


def _res(**kw: Any) -> Resources:
    node, records = two_sources_one_destination()
    return build(node, records, TranslateOptions(), EastWestOptions(**kw))


def _quic_transport(res: Resources) -> dict[str, Any]:
    chain = res[LISTENER]["inbound-h3:default/client-0"]["filterChains"][0]
    cfg: dict[str, Any] = chain["transportSocket"]["typedConfig"]
    return cfg


def test_gates_pass_on_the_built_state() -> None:
    assert run_quic_gates(_res()) == []
    assert run_quic_gates(_res(quic=False)) == []


def test_r4_gate_is_red_without_explicit_falses() -> None:
    for field, value in (("enableResumption", None), ("enableEarlyData", None), ("enableEarlyData", True)):
        res = _res()
        qt = _quic_transport(res)
        if value is None:
            del qt[field]
        else:
            qt[field] = value
        failures = quic_no_resumption(res)
        assert len(failures) == 1 and field in failures[0].reason and failures[0].gate == "quic-no-resumption"


def test_r4_gate_reads_proto_field_names_too() -> None:
    res = _res()
    qt = _quic_transport(res)
    qt["enable_resumption"] = qt.pop("enableResumption")
    assert quic_no_resumption(res) == []
    qt["enable_resumption"] = True
    assert len(quic_no_resumption(res)) == 1


def _udp_proxy_listener(name: str, port: int, netns: str) -> dict[str, Any]:
    return {
        "name": name,
        "address": {
            "socketAddress": {
                "protocol": "UDP",
                "address": "0.0.0.0",
                "portValue": port,
                "networkNamespaceFilepath": netns,
            }
        },
        "listenerFilters": [{"name": "envoy.filters.udp_listener.udp_proxy", "typedConfig": {}}],
    }


def test_r5_gate_is_red_when_plaintext_and_quic_share_a_port() -> None:
    res = _res()
    res[LISTENER]["capture-udp:ok"] = _udp_proxy_listener("capture-udp:ok", 18082, "/run/netns/sample-client")
    assert classes_separated(res) == []
    # plaintext udp_proxy on the QUIC port
    bad = copy.deepcopy(res)
    bad[LISTENER]["capture-udp:bad"] = _udp_proxy_listener("capture-udp:bad", 18008, "/run/netns/sample-client")
    reasons = [f.reason for f in classes_separated(bad)]
    assert any("both classes" in r for r in reasons) and any("not its role" in r for r in reasons)
    # a QUIC listener on the plaintext port
    bad = copy.deepcopy(res)
    bad[LISTENER]["inbound-h3:default/client-0"]["address"]["socketAddress"]["portValue"] = 18082
    reasons = [f.reason for f in classes_separated(bad)]
    assert any("both classes" in r for r in reasons) and any("quic listener" in r for r in reasons)
    # one listener carrying both
    bad = copy.deepcopy(res)
    bad[LISTENER]["inbound-h3:default/client-0"]["listenerFilters"] = _udp_proxy_listener("x", 1, "")["listenerFilters"]
    assert any("carries udp_proxy and QUIC" in f.reason for f in classes_separated(bad))


def test_identity_gate_is_red_for_envoy_string() -> None:
    """The identity-leak shape (negative control): `envoy.string` does not partition upstream pools."""
    failures = identity_hashable(_res(identity_factory="envoy.string"))
    assert len(failures) == 2  # both local pods' outbound listeners
    assert all("envoy.string" in f.reason and f.gate == "identity-hashable" for f in failures)
    res = _res()
    stamp = res[LISTENER]["http-outbound:default/client-0"]["filterChains"][0]["filters"][0]
    stamp["typedConfig"]["onNewConnection"][0]["sharedWithUpstream"] = "NONE"
    assert [f.reason for f in identity_hashable(res)] == [
        "listener 'http-outbound:default/client-0': envoy.tls.certificate_mappers.on_demand_secret not shared with upstream"
    ]


def test_same_named_service_accounts_in_two_namespaces_get_a_twin_each() -> None:
    """`default` in team-a and in team-b are two identities: two twins (the source namespace is in the name when it
    differs from the destination's), two matcher arms, each twin carrying its own SVID. The gate is red on the bad
    shape (two identities mapped to one twin), made by hand."""
    node, records = sample_node(
        "node-a",
        [
            SamplePod("u1", "a-0", "10.200.1.2", "default", "/run/netns/s1", namespace="team-a"),
            SamplePod("u2", "b-0", "10.200.1.3", "default", "/run/netns/s2", namespace="team-b"),
            SamplePod("u3", "c-0", "10.200.1.4", "web-client", "/run/netns/s3", namespace="team-a"),
            SamplePod("u4", "d-0", "10.200.1.5", "default", "/run/netns/s4", namespace="shop"),
        ],
        [SampleDestination("shop/web", "web", (8080,), ("10.200.2.7",))],
    )
    res = build(node, records, TranslateOptions())
    assert twin_per_identity(res) == []
    twins = {n: c for n, c in res[CLUSTER].items() if n.startswith("quic:")}
    assert sorted(twins) == [
        "quic:shop/web@default",
        "quic:shop/web@team-a/default",
        "quic:shop/web@team-a/web-client",
        "quic:shop/web@team-b/default",
    ]
    (vh,) = res[ROUTE]["http-outbound"]["virtualHosts"]
    spec = vh["routes"][0]["route"]["inlineClusterSpecifierPlugin"]["extension"]["typedConfig"]["clusterMatcher"]
    arms = spec["matcherTree"]["exactMatchMap"]["map"]
    picked = {sid: arm["action"]["typedConfig"]["cluster"] for sid, arm in arms.items()}
    assert picked == {
        "spiffe://cluster.local/ns/shop/sa/default": "quic:shop/web@default",
        "spiffe://cluster.local/ns/team-a/sa/default": "quic:shop/web@team-a/default",
        "spiffe://cluster.local/ns/team-a/sa/web-client": "quic:shop/web@team-a/web-client",
        "spiffe://cluster.local/ns/team-b/sa/default": "quic:shop/web@team-b/default",
    }
    for sid, twin in picked.items():  # each twin presents its own source's SVID, and only that one
        tls = twins[twin]["transportSocket"]["typedConfig"]["upstreamTlsContext"]["commonTlsContext"]
        assert [c["name"] for c in tls["tlsCertificateSdsSecretConfigs"]] == [f"svid:{sid}"], twin
    # the bad shape, by hand: both default SAs mapped to one twin
    one = arms["spiffe://cluster.local/ns/team-a/sa/web-client"]
    arms["spiffe://cluster.local/ns/team-a/sa/default"] = copy.deepcopy(one)
    arms["spiffe://cluster.local/ns/team-b/sa/default"] = copy.deepcopy(one)
    failures = twin_per_identity(res)
    assert len(failures) == 2 and all("quic:shop/web@team-a/web-client" in f.reason for f in failures)
    assert parse_meshnode(node.wire()) == node


def _tcp_inbound_contexts(res: Resources) -> list[dict[str, Any]]:
    chains = res[LISTENER]["inbound-h2:default/client-0"]["filterChains"]
    return [c["transportSocket"]["typedConfig"] for c in chains]


def test_tcp_resumption_gate_is_red_when_a_switch_is_missing_or_false() -> None:
    assert tcp_no_resumption(_res()) == []
    ctx = _tcp_inbound_contexts(_res())[0]
    assert ctx["disableStatelessSessionResumption"] is ctx["disableStatefulSessionResumption"] is True
    assert ctx["commonTlsContext"]["alpnProtocols"] == ["h2"]
    for field in ("disableStatelessSessionResumption", "disableStatefulSessionResumption"):
        for value in (None, False):
            res = _res()
            ctx = _tcp_inbound_contexts(res)[0]
            if value is None:
                del ctx[field]
            else:
                ctx[field] = value
            failures = tcp_no_resumption(res)
            assert [f.gate for f in failures] == ["tcp-no-resumption"] and field in failures[0].reason
            assert "tcp-no-resumption" in {f.gate for f in run_quic_gates(res)}


def test_tcp_resumption_gate_ignores_tls_without_client_certificates() -> None:
    res = _res()
    for ctx in _tcp_inbound_contexts(res):
        ctx["requireClientCertificate"] = False
        del ctx["disableStatelessSessionResumption"]
    assert tcp_no_resumption(res) == []
