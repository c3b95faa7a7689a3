"""Translation on both IP families (issue 27 item 2): the capture listeners' IPv6 twins, IPv6 arms, the TCP floor's
/128 chains, IPv6 endpoints; golden output and the real Envoy's `--mode validate`.

A node whose arms are all IPv4 renders exactly as before (tests/xds/test_xds_translate.py's golden is unchanged).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aether.api.meshnode import MeshNode, load_meshnode_file
from aether.netns.records import PodRecord
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.envoy import validate
from aether.testing.golden import check_golden, golden_json
from aether.xds.resources import ENDPOINT, LISTENER, Resources, TranslateOptions
from aether.xds.sidecar.bootstrap import static_bootstrap
from aether.xds.translate.compose import translate as translate_all
from aether.xds.translate.eastwest.build import build

DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent / "golden" / "translate_dual_stack.json"
L4 = TranslateOptions(areas=("udp", "tcp-floor"))


def dual_node() -> MeshNode:
    return load_meshnode_file(DATA / "meshnode-dual-stack.yaml")


def records() -> dict[str, PodRecord]:
    return {"u1": PodRecord(uid="u1", namespace="default", name="client-0", netns="/run/netns/test-client-0")}


def translate(node: MeshNode) -> Resources:
    return translate_all(node, records(), L4)


def test_golden_dual_stack() -> None:
    check_golden(GOLDEN, golden_json(translate(dual_node())))


def _matcher_map(listener: dict) -> dict[str, str]:  # type: ignore[type-arg]
    tree = listener["listenerFilters"][0]["typedConfig"]["matcher"]["matcherTree"]
    return {vip: m["action"]["typedConfig"]["cluster"] for vip, m in tree["exactMatchMap"]["map"].items()}


def test_ipv6_vips_get_an_ipv6_capture_listener_with_the_same_matcher() -> None:
    res = translate(dual_node())
    v4, v6 = res[LISTENER]["capture-udp:default/client-0"], res[LISTENER]["capture-udp6:default/client-0"]
    assert v4["address"]["socketAddress"]["address"] == "0.0.0.0"
    assert v6["address"]["socketAddress"] | {"address": "::"} == v6["address"]["socketAddress"]
    assert "ipv4Compat" not in v6["address"]["socketAddress"]  # IPv6 only: both sockets bind :18082
    assert v6["transparent"] is True
    assert (
        _matcher_map(v6)
        == _matcher_map(v4)
        == {
            "10.96.0.10": "udp:default/a",
            "fd00:96::a": "udp:default/a@ipv6",
            "fd00:96::b": "udp:default/b6@ipv6",  # FD00:96:0:0::B as Envoy prints a datagram's destination
            "fd00:96::c": "blackhole",
        }
    )


def test_the_tcp_floor_puts_ipv6_chains_on_an_ipv6_listener_with_128_bit_prefixes() -> None:
    res = translate(dual_node())
    v4, v6 = res[LISTENER]["capture-tcp:default/client-0"], res[LISTENER]["capture-tcp6:default/client-0"]
    assert [c["filterChainMatch"]["prefixRanges"] for c in v4["filterChains"]] == [
        [{"addressPrefix": "10.96.0.20", "prefixLen": 32}]
    ]
    assert [c["filterChainMatch"]["prefixRanges"] for c in v6["filterChains"]] == [
        [{"addressPrefix": "fd00:96::14", "prefixLen": 128}]
    ]
    assert v6["address"]["socketAddress"]["address"] == "::"


def test_ipv6_endpoints_are_load_assignments_like_any_other() -> None:
    res = translate(dual_node())
    lbs = res[ENDPOINT]["udp:default/a@ipv6"]["endpoints"][0]["lbEndpoints"]
    assert [(lb["endpoint"]["address"]["socketAddress"]["address"], lb.get("healthStatus")) for lb in lbs] == [
        ("fd00:200:2::5", None),
        ("fd00:200:2::8", "DRAINING"),
    ]


def test_an_ipv4_only_node_gets_no_ipv6_listener_and_an_ipv6_only_one_no_ipv4_tcp_listener() -> None:
    node = dual_node()
    v4_only = node.model_copy(deep=True)
    v4_only.status.udp.services = [a for a in v4_only.status.udp.services if ":" not in a.vip]
    v4_only.status.tcp.services = [a for a in v4_only.status.tcp.services if ":" not in a.vip]
    assert sorted(translate(v4_only)[LISTENER]) == ["capture-tcp:default/client-0", "capture-udp:default/client-0"]
    v6_only = node.model_copy(deep=True)
    v6_only.status.udp.services = [a for a in v6_only.status.udp.services if ":" in a.vip]
    v6_only.status.tcp.services = [a for a in v6_only.status.tcp.services if ":" in a.vip]
    assert sorted(translate(v6_only)[LISTENER]) == [
        "capture-tcp6:default/client-0",
        "capture-udp6:default/client-0",
        "capture-udp:default/client-0",  # the pod's wildcard UDP listener always exists (blackholes the rest)
    ]


@pytest.mark.envoy
def test_envoy_validates_the_dual_stack_resources() -> None:
    out = validate(static_bootstrap("node-a", translate(dual_node())))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK" in out.stdout


def test_a_dual_stack_pod_gets_inbound_and_outbound_listeners_on_both_families() -> None:
    """East-west: web-0 with an IPv4 and an IPv6 address gets a second pair of inbound listeners on its IPv6
    address (same chains), a second outbound listener on [::]:18080, and both addresses count as its own traffic."""
    node, recs = sample_node(
        "node-b",
        [SamplePod("u-web", "web-0", "10.200.2.7", "web-sa", "/run/netns/web")],
        [SampleDestination("default/web", "web-sa", (8080,), ("fd00:200:2::7",), vip="fd00:96::20")],
    )
    node.status.pods[0].ips = ["10.200.2.7", "fd00:200:2::7"]
    res = build(node, recs, TranslateOptions(areas=("eastwest",)))
    lst = res[LISTENER]
    pairs = [("inbound-h2:default/web-0", "TCP"), ("inbound-h3:default/web-0", "UDP")]
    for name, proto in pairs:
        v4, v6 = lst[name], lst[name + "@ipv6"]
        assert v4["address"]["socketAddress"]["address"] == "10.200.2.7"
        assert (
            v6["address"]["socketAddress"] | {"address": "fd00:200:2::7", "protocol": proto}
            == v6["address"]["socketAddress"]
        )
        assert v6["filterChains"] == v4["filterChains"]
    out4, out6 = lst["http-outbound:default/web-0"], lst["http-outbound6:default/web-0"]
    assert (out4["address"]["socketAddress"]["address"], out6["address"]["socketAddress"]["address"]) == (
        "0.0.0.0",
        "::",
    )
    own = out6["filterChains"][0]["filterChainMatch"]["directSourcePrefixRanges"]
    assert own[:2] == [
        {"addressPrefix": "10.200.2.7", "prefixLen": 32},
        {"addressPrefix": "fd00:200:2::7", "prefixLen": 128},
    ]
    single, _ = sample_node("node-b", [SamplePod("u-web", "web-0", "10.200.2.7", "web-sa", "/run/netns/web")], [])
    assert not [
        n
        for n in build(single, recs, TranslateOptions(areas=("eastwest",)))[LISTENER]
        if "6" in n.split(":")[0] or "@" in n
    ]


@pytest.mark.envoy
def test_an_ipv6_service_with_its_own_idle_timeout_gets_a_listener_on_its_vip() -> None:
    node = dual_node()
    arm = node.status.udp.services[1]  # default/a at fd00:96::a
    node.status.udp.services[1] = arm.model_copy(update={"idle_timeout_seconds": 5.0})
    res = translate(node)
    vip = res[LISTENER]["capture-udp:default/client-0@fd00:96::a"]
    assert vip["address"]["socketAddress"]["address"] == "fd00:96::a"
    assert vip["socketOptions"] == res[LISTENER]["capture-udp6:default/client-0"]["socketOptions"]  # 65,527 B
    assert vip["listenerFilters"][0]["typedConfig"]["idleTimeout"] == "5s"
    assert validate(static_bootstrap("node-a", res)).returncode == 0
