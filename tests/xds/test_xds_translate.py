"""Pure translation: the UDP and TCP-floor shapes, listener count, pod records gating, golden output."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from aether.api.meshnode import Endpoint, MeshNode, load_meshnode_file
from aether.api.naming import BLACKHOLE_CLUSTER
from aether.netns.records import PodRecord
from aether.testing.golden import check_golden, golden_json
from aether.testing.samples import node_with, records_for
from aether.xds.codec import protojson as codec
from aether.xds.resources import CLUSTER, ENDPOINT, LISTENER, Resources, TranslateOptions, version_of
from aether.xds.translate.compose import translate as translate_all
from aether.xds.translate.l4.udp import DESTINATION_IP_INPUT, UDP_PROXY_CONFIG, UDP_ROUTE

DATA = Path(__file__).parent / "data"  # inputs; expected outputs are in golden/
GOLDEN = Path(__file__).parent / "golden" / "translate_sample.json"


L4 = TranslateOptions(areas=("udp", "tcp-floor"))


def translate(node: MeshNode, records: Mapping[str, PodRecord]) -> Resources:
    """This area's builders only (the east-west area has its own tests)."""
    return translate_all(node, records, L4)


def sample_node() -> MeshNode:
    return load_meshnode_file(DATA / "meshnode-sample.yaml")


def sample_records() -> dict[str, PodRecord]:
    return {
        uid: PodRecord(uid=uid, namespace="default", name=name, netns=f"/run/netns/test-{name}")
        for uid, name in (("u1", "client-0"), ("u2", "client-1"))
    }


def _udp_listeners(res: Resources) -> dict[str, dict]:  # type: ignore[type-arg]
    return {k: v for k, v in res[LISTENER].items() if k.startswith("capture-udp:")}


def test_golden_sample() -> None:
    """The rendered resources for the sample MeshNode; rewrite with AETHER_UPDATE_GOLDEN=1 (aether.testing.golden)."""
    check_golden(GOLDEN, golden_json(translate(sample_node(), sample_records())))


def test_udp_listener_shape() -> None:
    res = translate(sample_node(), sample_records())
    listener = res[LISTENER]["capture-udp:default/client-0"]
    sa = listener["address"]["socketAddress"]
    assert sa == {
        "protocol": "UDP",
        "address": "0.0.0.0",
        "portValue": 18082,
        "networkNamespaceFilepath": "/run/netns/test-client-0",
    }
    assert listener["transparent"] is True
    cfg = listener["listenerFilters"][0]["typedConfig"]
    assert cfg["@type"] == UDP_PROXY_CONFIG
    tree = cfg["matcher"]["matcherTree"]
    assert tree["input"]["typedConfig"]["@type"] == DESTINATION_IP_INPUT
    arms = {vip: m["action"]["typedConfig"] for vip, m in tree["exactMatchMap"]["map"].items()}
    assert arms == {
        "10.96.0.10": {"@type": UDP_ROUTE, "cluster": "udp:default/a"},
        "10.96.0.11": {"@type": UDP_ROUTE, "cluster": "udp:default/b"},
        "10.96.0.12": {"@type": UDP_ROUTE, "cluster": BLACKHOLE_CLUSTER},
    }
    assert cfg["matcher"]["onNoMatch"]["action"]["typedConfig"]["cluster"] == BLACKHOLE_CLUSTER


def test_eds_clusters_have_their_own_eds_name_and_app_port() -> None:
    res = translate(sample_node(), sample_records())
    for name in ("udp:default/a", "udp:default/b", "tcp:default/t"):
        cluster = res[CLUSTER][name]
        assert cluster["type"] == "EDS"
        assert cluster["edsClusterConfig"]["serviceName"] == name
    ep = res[ENDPOINT]["udp:default/a"]["endpoints"][0]["lbEndpoints"][0]["endpoint"]["address"]["socketAddress"]
    assert ep == {"address": "10.200.2.5", "portValue": 5353}
    assert res[CLUSTER][BLACKHOLE_CLUSTER]["type"] == "STATIC"
    assert "udp:default/c" not in res[CLUSTER]  # a blackholed arm has no cluster of its own


def test_tcp_floor_chains_by_destination() -> None:
    res = translate(sample_node(), sample_records())
    listener = res[LISTENER]["capture-tcp:default/client-1"]
    assert listener["transparent"] is True
    assert listener["address"]["socketAddress"]["networkNamespaceFilepath"] == "/run/netns/test-client-1"
    (chain,) = listener["filterChains"]
    assert chain["filterChainMatch"]["prefixRanges"] == [{"addressPrefix": "10.96.0.20", "prefixLen": 32}]
    assert chain["filters"][0]["typedConfig"]["cluster"] == "tcp:default/t"


def test_listener_count_scales_with_pods_not_services() -> None:
    for pods in (1, 3):
        counts = {
            len(_udp_listeners(translate(node_with(n, pods), records_for(node_with(n, pods))))) for n in (0, 1, 50)
        }
        assert counts == {pods}
    big = translate(node_with(500, 2), records_for(node_with(500, 2)))
    assert len(big[LISTENER]) == 2  # no TCP arms: no TCP listener
    assert len(big[CLUSTER]) == 501 and len(big[ENDPOINT]) == 500


def test_a_pod_needs_both_the_meshnode_and_a_record() -> None:
    node = sample_node()
    records = sample_records()
    del records["u2"]  # the CNI has not seen client-1 yet
    res = translate(node, records)
    assert sorted(_udp_listeners(res)) == ["capture-udp:default/client-0"]
    node.status.pods = [p for p in node.status.pods if p.uid != "u1"]  # client-0 left the MeshNode
    assert _udp_listeners(translate(node, records)) == {}


def test_translation_is_deterministic_and_versions_follow_content() -> None:
    a = translate(sample_node(), sample_records())
    b = translate(sample_node(), sample_records())
    assert a == b
    node = sample_node()
    node.status.udp.services[0].endpoints[0].port = 5354
    c = translate(node, sample_records())
    changed = {(t, n) for t in a for n in a[t] if n in c[t] and version_of(a[t][n]) != version_of(c[t][n])}
    assert changed == {(ENDPOINT, "udp:default/a")}


def test_every_rendered_resource_encodes() -> None:
    res = translate(sample_node(), sample_records())
    for type_url, named in res.items():
        for name, resource in named.items():
            assert (
                codec.decode_json(type_url, codec.encode(type_url, resource, name))[
                    "name" if type_url != ENDPOINT else "clusterName"
                ]
                == name
            )


def test_render_cli(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "aether.cli",
            "xds",
            "render",
            "--state",
            str(DATA / "meshnode-sample.yaml"),
            "--records",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[LISTENER] == {}  # no records: no listeners
    bad = tmp_path / "bad.yaml"
    bad.write_text("metadata: {name: n}\nstatus: {udp: {services: [{vip: 1}]}}\n")
    out = subprocess.run(
        [sys.executable, "-m", "aether.cli", "xds", "render", "--state", str(bad)], capture_output=True, text=True
    )
    assert out.returncode == 1
    assert "status.udp.services.0.service" in out.stderr and str(bad) in out.stderr


def test_an_address_listed_ready_and_draining_is_one_ready_endpoint() -> None:
    """Two arms naming one cluster can disagree for a moment (their slices are written one after the other): the
    address is one lbEndpoint, ready; a draining-only address is DRAINING. Both the cold and the incremental path."""
    node = node_with(2, 1)
    a, b = node.status.udp.services
    b.cluster, b.backend = a.cluster, a.backend
    a.endpoints = [Endpoint(ip="10.9.0.1", port=53), Endpoint(ip="10.9.0.2", port=53, draining=True)]
    b.endpoints = [Endpoint(ip="10.9.0.1", port=53, draining=True), Endpoint(ip="10.9.0.2", port=53, draining=True)]
    for _ in range(2):  # the second translation of the same node diffs against the first
        res = translate(node, records_for(node))
        lbs = res[ENDPOINT][a.cluster]["endpoints"][0]["lbEndpoints"]
        got = [(e["endpoint"]["address"]["socketAddress"]["address"], e.get("healthStatus")) for e in lbs]
        assert got == [("10.9.0.1", None), ("10.9.0.2", "DRAINING")]
        b.endpoints = b.endpoints[:1]  # same union: 10.9.0.2 stays draining through a
