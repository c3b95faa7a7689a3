"""Each gate passes a good state and refuses its bad input (the negative controls, seen red once)."""

from __future__ import annotations

import copy
from collections.abc import Mapping

from aether.api.meshnode import MeshNode, ServiceArm
from aether.api.naming import BLACKHOLE_CLUSTER
from aether.netns.records import PodRecord
from aether.testing.samples import node_with, records_for
from aether.xds.gates.core import arms_resolve, netns_exist, run_gates, unique_binds, unique_vips
from aether.xds.resources import CLUSTER, LISTENER, Resources, TranslateOptions
from aether.xds.translate.compose import translate as translate_all

L4 = TranslateOptions(areas=("udp", "tcp-floor"))


def translate(node: MeshNode, records: Mapping[str, PodRecord]) -> Resources:
    """This area's builders only (the east-west area has its own tests)."""
    return translate_all(node, records, L4)


def _ok(path: str) -> bool:
    return True


def test_a_good_state_passes_every_gate() -> None:
    node = node_with(20, 3)
    assert run_gates(node, translate(node, records_for(node)), _ok) == []


def test_arm_naming_a_missing_cluster_is_refused() -> None:
    node = node_with(3, 1)
    res = translate(node, records_for(node))
    del res[CLUSTER]["udp:default/svc-1"]
    (failure,) = arms_resolve(res)
    assert failure.gate == "arm-names-cluster"
    assert "udp:default/svc-1" in failure.reason and "capture-udp:default/client-0" in failure.reason


def test_on_no_match_needs_the_blackhole_too() -> None:
    node = node_with(1, 1)
    res = translate(node, records_for(node))
    del res[CLUSTER][BLACKHOLE_CLUSTER]
    assert [f.gate for f in arms_resolve(res)] == ["arm-names-cluster"]


def test_tcp_proxy_naming_a_missing_cluster_is_refused() -> None:
    node = node_with(0, 1)
    node.status.tcp.services = [ServiceArm(service="d/t", vip="10.96.9.9", cluster="tcp:d/t")]
    res = translate(node, records_for(node))
    assert arms_resolve(res) == []  # tcp:d/t exists (no endpoints: still a cluster)
    del res[CLUSTER]["tcp:d/t"]
    assert [f.gate for f in arms_resolve(res)] == ["arm-names-cluster"]


def test_duplicate_vip_is_refused() -> None:
    node = node_with(3, 1)
    node.status.udp.services[2] = node.status.udp.services[2].model_copy(
        update={"vip": node.status.udp.services[0].vip}
    )
    (failure,) = unique_vips(node)
    assert failure.gate == "duplicate-vip" and "default/svc-0" in failure.reason and "default/svc-2" in failure.reason


def test_missing_netns_is_refused() -> None:
    node = node_with(2, 2)
    res = translate(node, records_for(node))
    failures = netns_exist(res, lambda p: not p.endswith("client-1"))
    assert [f.gate for f in failures] == ["netns-exists"]
    assert "/run/netns/test-client-1" in failures[0].reason


def test_two_listeners_in_one_netns_are_refused() -> None:
    node = node_with(2, 2)
    records = records_for(node)
    records["u1"] = records["u1"].model_copy(update={"netns": records["u0"].netns})
    res = translate(node, records)
    assert [f.gate for f in unique_binds(res)] == ["unique-bind"]


def test_run_gates_reports_all() -> None:
    node = node_with(2, 1)
    node.status.udp.services.append(node.status.udp.services[0])
    res = copy.deepcopy(translate(node, records_for(node)))  # resource dicts are shared: copy before editing
    res[LISTENER]["capture-udp:default/client-0"]["listenerFilters"][0]["typedConfig"]["matcher"]["onNoMatch"][
        "action"
    ]["typedConfig"]["cluster"] = "nowhere"
    gates = sorted(f.gate for f in run_gates(node, res, lambda p: False))
    assert gates == ["arm-names-cluster", "duplicate-vip", "netns-exists"]
