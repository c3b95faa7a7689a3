"""The east-west gateway's TCP listener on 18009 (`aether.xds.translate.eastwest.gateway`), and the source side
through it (`EastWestOptions.remote_gateways`): goldens, the shape that makes it passthrough, and the real Envoy's
`--mode validate` on every generated config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aether.api.meshnode import MeshNode
from aether.netns.contract import EAST_WEST_PORT, INBOUND_PORT
from aether.netns.records import PodRecord
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.envoy import validate
from aether.testing.golden import check_golden, golden_json
from aether.xds.gates.quic import run_quic_gates
from aether.xds.resources import CLUSTER, ENDPOINT, LISTENER, ROUTE, Resources, TranslateOptions
from aether.xds.sidecar.bootstrap import static_bootstrap
from aether.xds.translate.eastwest import gateway
from aether.xds.translate.eastwest.build import EastWestOptions, build, camel, twins_for
from aether.xds.translate.eastwest.plan import Destination
from aether.xds.translate.eastwest.tls import downstream_tls, tcp_downstream_socket

GOLDEN = Path(__file__).parent / "golden"
MD, TD = "mesh.example", "cluster.local"
OPTS = TranslateOptions(mesh_domain=MD, trust_domain=TD)
GW = "10.199.0.2"


def exports() -> list[Destination]:
    """web (SA web-sa, two ports, two pods), web-canary (same SA and port 8080, a third pod: shares the SNI),
    db (SA db, one port)."""

    def dest(svc: str, sa: str, ports: tuple[int, ...], ips: tuple[str, ...]) -> Destination:
        ident = f"spiffe://{TD}/ns/default/sa/{sa}"
        return Destination("default", svc, sa, ident, ports, tuple((ip, INBOUND_PORT) for ip in ips), None)

    return [
        dest("web", "web-sa", (8080, 9090), ("10.200.2.7", "10.200.2.8")),
        dest("web-canary", "web-sa", (8080,), ("10.200.2.9", "10.200.2.7")),
        dest("db", "db", (5432,), ("10.200.3.4",)),
    ]


def gateway_resources() -> Resources:
    return gateway.build(exports(), GW, MD)


def test_golden_gateway() -> None:
    check_golden(GOLDEN / "gateway_tcp.json", golden_json(gateway_resources()))


def test_the_gateway_never_terminates_and_has_no_default() -> None:
    lst = gateway_resources()[LISTENER][gateway.LISTENER_NAME]
    assert lst["address"]["socketAddress"] == {"protocol": "TCP", "address": GW, "portValue": EAST_WEST_PORT}
    assert [f["name"] for f in lst["listenerFilters"]] == ["envoy.filters.listener.tls_inspector"]
    assert "defaultFilterChain" not in lst
    assert lst["statPrefix"] == "east_west_gateway"
    for chain in lst["filterChains"]:
        assert "transportSocket" not in chain, chain["name"]  # no TLS context: it never terminates
        assert [f["name"] for f in chain["filters"]] == ["envoy.filters.network.tcp_proxy"]
    snis = [c["filterChainMatch"]["serverNames"] for c in lst["filterChains"]]
    assert snis == [
        ["5432.db.default.mesh.example"],
        ["8080.web-sa.default.mesh.example"],
        ["9090.web-sa.default.mesh.example"],
    ]


def test_services_sharing_an_sni_share_one_cluster_on_their_inbound() -> None:
    res = gateway_resources()
    cla = res[ENDPOINT]["east-west:8080.web-sa.default.mesh.example"]
    addrs = [e["endpoint"]["address"]["socketAddress"] for e in cla["endpoints"][0]["lbEndpoints"]]
    assert [(a["address"], a["portValue"]) for a in addrs] == [
        ("10.200.2.7", INBOUND_PORT),
        ("10.200.2.8", INBOUND_PORT),
        ("10.200.2.9", INBOUND_PORT),
    ]
    assert (
        set(res[CLUSTER])
        == set(res[ENDPOINT])
        == {gateway.cluster_name(s) for s in gateway.exported_snis(exports(), MD)}
    )


def test_no_exports_is_no_listener() -> None:
    """Envoy refuses a listener without filter chains ("no filter chains specified"), so none is built."""
    assert gateway.build([], GW, MD) == {LISTENER: {}, CLUSTER: {}, ENDPOINT: {}}


def node_a() -> tuple[MeshNode, dict[str, PodRecord]]:
    """Node A with client-0, which has dialled default/web and default/local (both QUIC destinations here)."""
    return sample_node(
        "node-a",
        [SamplePod("u-client", "client-0", "10.200.1.2", "client", "/run/netns/sample-client")],
        [
            SampleDestination("default/web", "web-sa", (8080,), ("10.200.2.7",), vip="10.96.0.20"),
            SampleDestination("default/local", "local", (8080,), ("10.200.1.9",), vip="10.96.0.21"),
        ],
    )


def source_side() -> Resources:
    """Node A with client-0; default/web remote (through GW), default/local in this cluster."""
    node, records = node_a()
    return build(node, records, OPTS, EastWestOptions(remote_gateways={"default/web": (GW,)}))


def _route(res: Resources, vhost: str) -> dict[str, Any]:
    hosts = {v["name"]: v for v in res[ROUTE]["http-outbound"]["virtualHosts"]}
    route: dict[str, Any] = hosts[vhost]["routes"][0]["route"]
    return route


def test_a_remote_service_is_dialled_at_its_gateway_with_its_own_sni_and_identity() -> None:
    res = source_side()
    cla = res[ENDPOINT]["h2:default/web"]["endpoints"][0]["lbEndpoints"]
    assert [e["endpoint"]["address"]["socketAddress"] for e in cla] == [{"address": GW, "portValue": EAST_WEST_PORT}]
    tls = res[CLUSTER]["h2:default/web"]["transportSocket"]["typedConfig"]
    assert tls["sni"] == "8080.web-sa.default.mesh.example"
    sans = tls["commonTlsContext"]["combinedValidationContext"]["defaultValidationContext"]
    assert sans["matchTypedSubjectAltNames"][0]["matcher"] == {"exact": f"spiffe://{TD}/ns/default/sa/web-sa"}
    # the source's QUIC twin goes through the gateway too: its UDP 18009 (the QUIC passthrough), with the same SNI,
    # pinned destination SPIFFE ID and the source's own SVID as in-cluster
    specifier = _route(res, "default/web")["inlineClusterSpecifierPlugin"]["extension"]["typedConfig"]
    arms = specifier["clusterMatcher"]["matcherTree"]["exactMatchMap"]["map"]
    assert arms[f"spiffe://{TD}/ns/default/sa/client"]["action"]["typedConfig"]["cluster"] == "quic:default/web@client"
    twin = res[CLUSTER]["quic:default/web@client"]
    twin_tls = twin["transportSocket"]["typedConfig"]["upstreamTlsContext"]
    assert twin_tls["sni"] == "8080.web-sa.default.mesh.example"
    twin_sans = twin_tls["commonTlsContext"]["combinedValidationContext"]["defaultValidationContext"]
    assert twin_sans["matchTypedSubjectAltNames"][0]["matcher"] == {"exact": f"spiffe://{TD}/ns/default/sa/web-sa"}
    twin_cla = res[ENDPOINT]["quic:default/web@client"]["endpoints"][0]["lbEndpoints"]
    assert [e["endpoint"]["address"]["socketAddress"] for e in twin_cla] == [
        {"address": GW, "portValue": EAST_WEST_PORT}
    ]
    # a Service of this cluster keeps its twins and its pods' inbound
    assert "inlineClusterSpecifierPlugin" in _route(res, "default/local")
    assert "quic:default/local@client" in res[CLUSTER]
    local = res[ENDPOINT]["h2:default/local"]["endpoints"][0]["lbEndpoints"][0]["endpoint"]["address"]
    assert local["socketAddress"] == {"address": "10.200.1.9", "portValue": INBOUND_PORT}


def test_golden_source_side() -> None:
    res = source_side()
    picked = {
        CLUSTER: {"h2:default/web": res[CLUSTER]["h2:default/web"]},
        ENDPOINT: {"h2:default/web": res[ENDPOINT]["h2:default/web"]},
        ROUTE: {"default/web": _route(res, "default/web")},
    }
    check_golden(GOLDEN / "gateway_source_side.json", golden_json(picked))


def source_side_for_validate() -> Resources:
    """The source side's listeners, clusters and load assignments, each cluster without its transport socket: a
    cluster whose TLS context takes its secrets over SDS makes Envoy 1.40's `--mode validate` crash (SIGSEGV, for
    every h2 cluster and twin, remote or not: seen here), so the TLS half is proven where it loads over ADS, in
    tests/xds/test_gateway_datapath.py."""
    return for_validate(source_side())


def for_validate(res: Resources) -> Resources:
    """`res`'s listeners, clusters and load assignments, the clusters without their transport sockets."""
    clusters = {
        n: {k: v for k, v in c.items() if k != "transportSocket"}
        for n, c in res[CLUSTER].items()
        if not n.startswith("quic:")  # HTTP/3 needs its QUIC transport socket: twins are not this change's
    }
    return {LISTENER: res[LISTENER], CLUSTER: clusters, ENDPOINT: res[ENDPOINT]}


@pytest.mark.envoy
@pytest.mark.parametrize("which", ["gateway", "source-side"])
def test_envoy_validates(which: str) -> None:
    res = {"gateway": gateway_resources, "source-side": source_side_for_validate}
    out = validate(static_bootstrap("node-gw", res[which]()))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK" in out.stdout


@pytest.mark.envoy
def test_validate_sees_a_broken_gateway() -> None:
    """Negative control of the validation above: a chain's tcp_proxy with a misspelled field is refused."""
    res = gateway_resources()
    res[LISTENER][gateway.LISTENER_NAME]["filterChains"][0]["filters"][0]["typedConfig"]["clustr"] = "x"
    out = validate(static_bootstrap("node-gw", res))
    assert out.returncode != 0 and "clustr" in out.stderr


# -- the gateway-passthrough gate (aether.xds.gates.gateway, run with the east-west gates) --------------------------


def test_the_gate_passes_the_built_gateway_and_the_source_side() -> None:
    assert run_quic_gates(gateway_resources()) == []
    assert run_quic_gates(source_side()) == []


def _broken(change: str) -> Resources:
    res = gateway_resources()
    lst = res[LISTENER][gateway.LISTENER_NAME]
    chain = lst["filterChains"][0]
    if change == "terminating":
        chain["transportSocket"] = camel(tcp_downstream_socket(downstream_tls(f"spiffe://{TD}/ns/gw/sa/gw", TD, None)))
    elif change == "default-chain":
        lst["defaultFilterChain"] = {"filters": chain["filters"]}
    else:
        del chain["filterChainMatch"]["serverNames"]
    return res


@pytest.mark.parametrize("change", ["terminating", "default-chain", "any-sni"])
def test_the_gate_refuses_a_gateway_that_terminates_or_defaults(change: str) -> None:
    failures = run_quic_gates(_broken(change))
    assert [f.gate for f in failures] == ["gateway-passthrough"], failures


# -- the role in the node's translation (`TranslateOptions.east_west_gateway`, `aether xds --east-west-gateway`) ----


def gateway_node_state(tmp_path: Path) -> Path:
    """A gateway node's MeshNode file: no local pod, two QUIC destinations (its dependency set)."""
    node, _ = sample_node(
        "gw-node",
        [],
        [
            SampleDestination("default/web", "web-sa", (8080,), ("10.200.2.7",)),
            SampleDestination("team-b/db", "db", (5432,), ("10.200.3.4",)),
        ],
    )
    path = tmp_path / "gw-node.json"
    path.write_text(node.model_dump_json(by_alias=True, exclude_none=True))
    return path


def render(state: Path, records: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = ["xds", "render", "--state", str(state), "--records", str(records), "--mesh-domain", MD, *extra]
    return subprocess.run([sys.executable, "-m", "aether.cli", *argv], capture_output=True, text=True, timeout=120)


def test_the_role_exports_the_nodes_destinations_only_when_asked(tmp_path: Path) -> None:
    state = gateway_node_state(tmp_path)
    out = render(state, tmp_path, "--east-west-gateway", GW)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    lst = res[LISTENER][gateway.LISTENER_NAME]
    assert lst["address"]["socketAddress"]["address"] == GW
    assert [c["filterChainMatch"]["serverNames"] for c in lst["filterChains"]] == [
        ["5432.db.team-b.mesh.example"],
        ["8080.web-sa.default.mesh.example"],
    ]
    cla = res[ENDPOINT]["east-west:8080.web-sa.default.mesh.example"]["endpoints"][0]["lbEndpoints"]
    assert cla[0]["endpoint"]["address"]["socketAddress"] == {"address": "10.200.2.7", "portValue": INBOUND_PORT}
    assert "refused" not in out.stderr  # the gates passed it
    plain = render(state, tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert gateway.LISTENER_NAME not in json.loads(plain.stdout)[LISTENER]
    bad = render(state, tmp_path, "--east-west-gateway", "gw.example")
    assert bad.returncode == 2 and "not an IPv4 address" in bad.stderr


def test_a_destination_marked_remote_in_the_meshnode_goes_through_its_gateway(tmp_path: Path) -> None:
    """`status.quic.destinations[].gateways` marks a Service of another cluster: the sidecar's own translation (the
    CLI, from a MeshNode file) dials its gateway on 18009 over h2; a gateway node never re-exports it."""
    node, records = node_a()
    web = next(d for d in node.status.quic.destinations if d.service == "default/web")
    web.gateways = [GW, "10.199.0.3"]
    res = build(node, records, OPTS)
    cla = res[ENDPOINT]["h2:default/web"]["endpoints"][0]["lbEndpoints"]
    assert [e["endpoint"]["address"]["socketAddress"] for e in cla] == [
        {"address": GW, "portValue": EAST_WEST_PORT},
        {"address": "10.199.0.3", "portValue": EAST_WEST_PORT},
    ]
    # its twin dials the same gateways, on UDP 18009
    twin_cla = res[ENDPOINT]["quic:default/web@client"]["endpoints"][0]["lbEndpoints"]
    assert [e["endpoint"]["address"]["socketAddress"] for e in twin_cla] == [
        {"address": GW, "portValue": EAST_WEST_PORT},
        {"address": "10.199.0.3", "portValue": EAST_WEST_PORT},
    ]
    assert "inlineClusterSpecifierPlugin" in _route(res, "default/web")
    assert "inlineClusterSpecifierPlugin" in _route(res, "default/local")
    # the sidecar's on-demand fast path makes the same twin (it too dials the gateways, not the remote pods)
    fast = twins_for(node, records, OPTS, ["quic:default/web@client"])
    assert fast[ENDPOINT]["quic:default/web@client"] == res[ENDPOINT]["quic:default/web@client"]
    assert fast[CLUSTER]["quic:default/web@client"] == res[CLUSTER]["quic:default/web@client"]
    # a gateway node exports default/local only
    state = tmp_path / "gw.json"
    state.write_text(node.model_dump_json(by_alias=True, exclude_none=True))
    out = render(state, tmp_path, "--east-west-gateway", GW)
    assert out.returncode == 0, out.stderr
    chains = json.loads(out.stdout)[LISTENER][gateway.LISTENER_NAME]["filterChains"]
    assert [c["filterChainMatch"]["serverNames"] for c in chains] == [["8080.local.default.mesh.example"]]
    # the field is written only when set
    written = json.loads(node.model_dump_json(by_alias=True))["status"]["quic"]["destinations"]
    assert [d["service"] for d in written if "gateways" in d] == ["default/web"]


# -- a peer whose gateways offer h2 only (MeshPeer spec.transports: [h2]) -------------------------------------------


def h2_only_node(transports: tuple[str, ...] = ("h2",)) -> tuple[MeshNode, dict[str, PodRecord]]:
    """Node A with client-0 (its pairs with both Services listed); default/web remote through GW, its destination
    entry's `gatewayTransports` as given ([h2]: the peer's gateway has no QUIC half), default/local here."""
    node, records = node_a()
    web = next(d for d in node.status.quic.destinations if d.service == "default/web")
    web.gateways, web.gateway_transports = [GW], list(transports)  # type: ignore[arg-type]
    return node, records


def h2_only_side() -> Resources:
    return build(*h2_only_node(), OPTS)


def test_a_gateway_without_h3_gets_no_twin_and_its_sources_use_h2() -> None:
    res = h2_only_side()
    # no twin for the remote Service, though status.quic.pairs lists client's pair with it: h2 on TCP 18009
    assert _route(res, "default/web") == {"cluster": "h2:default/web"}
    assert "quic:default/web@client" not in res[CLUSTER] and "quic:default/web@client" not in res[ENDPOINT]
    cla = res[ENDPOINT]["h2:default/web"]["endpoints"][0]["lbEndpoints"]
    assert [e["endpoint"]["address"]["socketAddress"] for e in cla] == [{"address": GW, "portValue": EAST_WEST_PORT}]
    tls = res[CLUSTER]["h2:default/web"]["transportSocket"]["typedConfig"]
    assert tls["sni"] == "8080.web-sa.default.mesh.example"
    # the on-demand fast path does not make that twin either; the local Service keeps its own
    fast = twins_for(*h2_only_node(), OPTS, ["quic:default/web@client", "quic:default/local@client"])
    assert sorted(fast[CLUSTER]) == ["quic:default/local@client"]
    assert "inlineClusterSpecifierPlugin" in _route(res, "default/local")
    # the same node with both transports (the default) has the twin: the field is what decides
    both = build(*h2_only_node(("h3", "h2")), OPTS)
    assert "quic:default/web@client" in both[CLUSTER]
    assert "inlineClusterSpecifierPlugin" in _route(both, "default/web")
    # the field is written only when not the default
    node, _ = h2_only_node()
    written = json.loads(node.model_dump_json(by_alias=True))["status"]["quic"]["destinations"]
    assert {d["service"]: d.get("gatewayTransports") for d in written} == {"default/web": ["h2"], "default/local": None}


def test_golden_h2_only_side() -> None:
    res = h2_only_side()
    picked = {
        CLUSTER: {"h2:default/web": res[CLUSTER]["h2:default/web"]},
        ENDPOINT: {"h2:default/web": res[ENDPOINT]["h2:default/web"]},
        ROUTE: {"default/web": _route(res, "default/web"), "default/local": _route(res, "default/local")},
    }
    check_golden(GOLDEN / "gateway_h2_only_side.json", golden_json(picked))


@pytest.mark.envoy
def test_envoy_validates_the_h2_only_side() -> None:
    out = validate(static_bootstrap("node-a", for_validate(h2_only_side())))  # source_side_for_validate: why
    assert out.returncode == 0, out.stderr[-3000:]
