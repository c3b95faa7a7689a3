"""The UDP capture listener's socket options (receive sizes, GRO, the GSO batch writer) and the udp clusters' circuit
breakers: what each option emits, and that the real Envoy 1.40 accepts every combination (`envoy --mode validate`).
That every size and flow count passes on the real data path is tests/xds/test_udp_real_clients.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from aether.api.meshnode import ArmBackend, Endpoint, ServiceArm
from aether.testing.envoy import validate
from aether.testing.samples import node_with, records_for
from aether.xds.resources import CLUSTER, ENDPOINT, LISTENER, ResourceDict, Resources, TranslateOptions
from aether.xds.sidecar.bootstrap import static_bootstrap
from aether.xds.translate.compose import translate
from aether.xds.translate.l4.udp import GSO_WRITER, GSO_WRITER_CONFIG

WRITER = {"name": GSO_WRITER, "typedConfig": {"@type": GSO_WRITER_CONFIG}}


def _listener(options: TranslateOptions, tmp: str = "/run/netns") -> ResourceDict:
    node = node_with(2, 1)
    res = translate(node, records_for(node, tmp), options)
    (listener,) = (v for k, v in res[LISTENER].items() if k.startswith("capture-udp:"))
    return listener


def _validate(resources: Resources) -> subprocess.CompletedProcess[str]:
    return validate(static_bootstrap("node-a", resources))


RX = {"maxRxDatagramSize": 65_535}


def _proxy(listener: ResourceDict) -> ResourceDict:
    proxy: ResourceDict = listener["listenerFilters"][0]["typedConfig"]
    return proxy


def test_defaults_set_receive_sizes_on_both_sides_gro_and_no_gso_writer() -> None:
    """Every datagram size passes by default: 64 KiB receive buffers on the listener and on udp_proxy's upstream
    sockets, and Envoy's default writer (the GSO batch writer drops replies over 1,452 bytes)."""
    listener = _listener(TranslateOptions(areas=("udp",)))
    assert listener["udpListenerConfig"] == {"downstreamSocketConfig": {**RX, "preferGro": True}}
    assert _proxy(listener)["upstreamSocketConfig"] == RX


def test_gso_writer_is_opt_in() -> None:
    listener = _listener(TranslateOptions(areas=("udp",), udp_gso_writer=True))
    assert listener["udpListenerConfig"] == {
        "downstreamSocketConfig": {**RX, "preferGro": True},
        "udpPacketPacketWriterConfig": WRITER,
    }


def test_gro_off_keeps_the_receive_size() -> None:
    """With GRO off Envoy reads one datagram per buffer of max_rx_datagram_size: it must stay 64 KiB."""
    listener = _listener(TranslateOptions(areas=("udp",), udp_prefer_gro=False, udp_upstream_prefer_gro=False))
    assert listener["udpListenerConfig"] == {"downstreamSocketConfig": RX}
    assert _proxy(listener)["upstreamSocketConfig"] == {**RX, "preferGro": False}


def test_listener_stats_are_per_pod() -> None:
    listener = _listener(TranslateOptions(areas=("udp",)))
    assert listener["statPrefix"] == _proxy(listener)["statPrefix"]
    assert listener["statPrefix"].startswith("udp_capture_")


def test_udp_clusters_are_sized_for_sessions_tcp_clusters_untouched() -> None:
    node = node_with(2, 1)
    res = translate(node, records_for(node, "/run/netns"), TranslateOptions(areas=("udp", "tcp-floor")))
    clusters = res[CLUSTER]
    udp = [c for n, c in clusters.items() if n.startswith("udp:")]
    assert udp and all(
        c["circuitBreakers"]
        == {"thresholds": [{"priority": "DEFAULT", "maxConnections": 100_000, "trackRemaining": True}]}
        for c in udp
    )
    assert all("circuitBreakers" not in c for n, c in clusters.items() if not n.startswith("udp:"))
    small = translate(node, records_for(node, "/run/netns"), TranslateOptions(areas=("udp",), udp_max_sessions=7))
    assert {
        c["circuitBreakers"]["thresholds"][0]["maxConnections"]
        for n, c in small[CLUSTER].items()
        if n.startswith("udp:")
    } == {7}


@pytest.mark.envoy
@pytest.mark.parametrize("gro", [True, False])
@pytest.mark.parametrize("gso", [True, False])
def test_envoy_validates_each_combination(envoy_bin: Path, tmp_path: Path, gro: bool, gso: bool) -> None:
    options = TranslateOptions(areas=("udp",), udp_prefer_gro=gro, udp_gso_writer=gso)
    node = node_with(3, 1)
    resources = translate(node, records_for(node, str(tmp_path / "netns")), options)
    out = _validate(resources)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK" in out.stdout


@pytest.mark.envoy
def test_validate_rejects_a_misspelled_writer(envoy_bin: Path, tmp_path: Path) -> None:
    """Negative control: the writer's typed config is checked (an unknown type fails validation)."""
    node = node_with(1, 1)
    options = TranslateOptions(areas=("udp",), udp_gso_writer=True)
    resources = translate(node, records_for(node, str(tmp_path / "netns")), options)
    (name,) = (k for k in resources[LISTENER] if k.startswith("capture-udp:"))
    listener = json.loads(json.dumps(resources[LISTENER][name]))
    listener["udpListenerConfig"]["udpPacketPacketWriterConfig"]["typedConfig"]["@type"] += "Typo"
    resources[LISTENER][name] = listener
    out = _validate(resources)
    assert out.returncode != 0


def test_preserve_source_is_opt_in_and_envoy_accepts_it() -> None:
    assert "useOriginalSrcIp" not in _proxy(_listener(TranslateOptions(areas=("udp",))))
    options = TranslateOptions(areas=("udp",), udp_preserve_source=True)
    assert _proxy(_listener(options))["useOriginalSrcIp"] is True
    node = node_with(2, 1)
    out = _validate(translate(node, records_for(node, "/run/netns"), options))
    assert out.returncode == 0, out.stderr[-3000:]


def test_a_service_with_its_own_idle_timeout_gets_a_listener_bound_to_its_vip(envoy_bin: Path) -> None:
    """One listener per (pod, timed VIP) at VIP:18082 in the pod netns with the Service's timeout; the pod's
    wildcard listener keeps the default; the real Envoy accepts both."""
    node = node_with(3, 2)
    node.status.udp.services[1].idle_timeout_seconds = 5.0
    timed = node.status.udp.services[1]
    res = translate(node, records_for(node, "/run/netns"), TranslateOptions(areas=("udp",)))
    udp = {k: v for k, v in res[LISTENER].items() if k.startswith("capture-udp:")}
    assert len(udp) == 4  # two pods x (wildcard + one VIP)
    for name, listener in udp.items():
        sa = listener["address"]["socketAddress"]
        proxy = _proxy(listener)
        if "@" in name:
            assert name.endswith(f"@{timed.vip}") and sa["address"] == timed.vip and listener["transparent"]
            assert proxy["idleTimeout"] == "5s"
            assert list(proxy["matcher"]["matcherTree"]["exactMatchMap"]["map"]) == [timed.vip]
        else:
            assert sa["address"] == "0.0.0.0" and proxy["idleTimeout"] == "60s"
        assert sa["portValue"] == 18082
    assert len({listener["statPrefix"] for listener in udp.values()}) == 4  # each listener its own stats
    out = _validate(res)
    assert out.returncode == 0, out.stderr[-3000:]


def test_a_split_arm_has_one_locality_per_backend_with_unique_names() -> None:
    """Weights as locality weights, weight 0 without one, an invalid ref's share on the drop endpoint, and a repeated
    name (a Service and an invalid ref of another kind called the same) as two localities, never one. A draining
    endpoint is DRAINING in its locality."""
    node = node_with(1, 1)
    ep = [Endpoint(ip="10.1.0.1", port=53)]
    backends = [
        ArmBackend(
            backend="default/a", weight=60, share=60.0, endpoints=[*ep, Endpoint(ip="10.1.0.2", port=53, draining=True)]
        ),
        ArmBackend(backend="default/a", weight=30, share=30.0, reason="InvalidKind"),
        ArmBackend(backend="default/b", weight=0, share=0.0, endpoints=ep, reason="Drained"),
        ArmBackend(backend="default/c", weight=10, share=10.0),  # valid, no ready endpoint: share dropped
    ]
    node.status.udp.services.append(
        ServiceArm(service="default/s", vip="10.96.9.9", cluster="udp-split:default/s", backends=backends)
    )
    res = translate(node, records_for(node, "/run/netns"), TranslateOptions(areas=("udp",)))
    assert res[CLUSTER]["udp-split:default/s"]["commonLbConfig"] == {"localityWeightedLbConfig": {}}
    locs = res[ENDPOINT]["udp-split:default/s"]["endpoints"]
    got = [
        (
            loc["locality"]["subZone"],
            loc.get("loadBalancingWeight"),
            [
                (
                    e["endpoint"]["address"]["socketAddress"]["address"],
                    e["endpoint"]["address"]["socketAddress"]["portValue"],
                    e.get("healthStatus", "-"),
                )
                for e in loc["lbEndpoints"]
            ],
        )
        for loc in locs
    ]
    assert got == [
        ("default/a", 60, [("10.1.0.1", 53, "-"), ("10.1.0.2", 53, "DRAINING")]),
        ("default/a#1", 30, [("127.0.0.1", 0, "-")]),
        ("default/b", None, [("10.1.0.1", 53, "-")]),
        ("default/c", 10, [("127.0.0.1", 0, "-")]),
    ]
    out = _validate(res)
    assert out.returncode == 0, out.stderr[-3000:]
