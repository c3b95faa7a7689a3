"""Each gate passes a good state and refuses its bad input (the negative controls, seen red once)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from aether.api.meshnode import ArmBackend, Endpoint, MeshNode, ServiceArm
from aether.api.naming import BLACKHOLE_CLUSTER
from aether.metrics import XDS_GATE_REFUSALS
from aether.netns.records import PodRecord
from aether.testing.samples import node_with, records_for
from aether.testing.wait import wait_for
from aether.xds.ads.cache import SnapshotCache
from aether.xds.gates.core import arms_resolve, clusters_named_by, netns_exist, run_gates, unique_binds, unique_vips
from aether.xds.gates.refuse import refuse_arms, refuse_listeners
from aether.xds.resources import CLUSTER, LISTENER, Resources, TranslateOptions
from aether.xds.sidecar.loop import Sidecar
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


# ---- per-resource refusal (refuse.py, the sidecar loop): one bad resource refused, the rest served ------------


class _Sink:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def publish(self, node_name: str, conditions: list[Any]) -> None:
        self.seen.append(conditions[0])


def _udp_arms(resources: Resources) -> set[str]:
    return {c for listener in resources[LISTENER].values() for c in clusters_named_by(listener)}


def test_a_duplicate_vip_refuses_both_arms_and_serves_every_other() -> None:
    node = node_with(4, 1)
    dup = copy.deepcopy(node)
    dup.status.udp.services[1] = dup.status.udp.services[1].model_copy(update={"vip": dup.status.udp.services[0].vip})
    kept, failures = refuse_arms(dup)
    assert [f.gate for f in failures] == ["duplicate-vip"]
    assert [a.service for a in kept.status.udp.services] == [a.service for a in node.status.udp.services[2:]]
    assert unique_vips(kept) == [] and refuse_arms(node) == (node, [])


def test_a_vip_no_pod_can_dial_is_refused_alone() -> None:
    node = node_with(3, 1)
    for bad in ("127.0.0.1", "0.0.0.0", "fe80::1%eth0", "169.254.0.1"):
        odd = copy.deepcopy(node)
        odd.status.udp.services[0] = odd.status.udp.services[0].model_copy(update={"vip": bad})
        kept, failures = refuse_arms(odd)
        assert [f.gate for f in failures] == ["invalid-vip"] and bad in failures[0].reason
        assert len(kept.status.udp.services) == 2


def test_a_split_arm_must_own_a_udp_split_cluster_and_is_refused_alone() -> None:
    """The split gate: a split arm naming another arm's cluster would replace that cluster's load assignment with
    its localities (the other Service's sessions then spread over the split's backends); each misfit is refused
    alone, a well-formed split passes."""
    node = node_with(3, 1)
    split = ArmBackend(backend="default/svc-1", weight=1, share=100.0, endpoints=[Endpoint(ip="10.1.0.1", port=53)])
    good = ServiceArm(service="default/s", vip="10.96.50.1", cluster="udp-split:default/s", backends=[split])
    cases = {
        "lists backends but its cluster is not a udp-split: one": good.model_copy(
            update={"cluster": node.status.udp.services[1].cluster}
        ),
        "names a udp-split: cluster without backends": good.model_copy(update={"backends": []}),
    }
    ok = copy.deepcopy(node)
    ok.status.udp.services.append(good)
    assert refuse_arms(ok) == (ok, [])
    for why, bad in cases.items():
        odd = copy.deepcopy(node)
        odd.status.udp.services.append(bad)
        kept, failures = refuse_arms(odd)
        assert [f.gate for f in failures] == ["split-arm-cluster"] and why in failures[0].reason, failures
        assert [a.service for a in kept.status.udp.services] == [a.service for a in node.status.udp.services]
    twice = copy.deepcopy(node)
    twice.status.udp.services += [good, good.model_copy(update={"service": "default/t", "vip": "10.96.50.2"})]
    kept, failures = refuse_arms(twice)
    assert [f.gate for f in failures] == ["split-arm-cluster"] * 2 and "shares its" in failures[0].reason
    assert len(kept.status.udp.services) == 3


def test_a_listener_into_a_missing_netns_is_refused_alone() -> None:
    node = node_with(2, 2)
    records = records_for(node)
    missing = next(iter(records))
    records = {k: v if k != missing else v.model_copy(update={"netns": "/run/netns/gone"}) for k, v in records.items()}
    res = translate(node, records)
    kept, failures = refuse_listeners(res, lambda p: "gone" not in p)
    assert [f.gate for f in failures] == ["netns-exists"] * len(failures) and failures
    assert 0 < len(kept[LISTENER]) < len(res[LISTENER])
    assert netns_exist(kept, lambda p: "gone" not in p) == []


def test_the_sidecar_serves_the_rest_of_a_state_with_a_duplicate_vip_and_says_so() -> None:
    cache = SnapshotCache()
    sink = _Sink()
    sc = Sidecar("node-a", cache, sink, options=L4, path_exists=_ok)
    node = node_with(4, 1)
    sc.on_records(records_for(node))
    sc.on_state(node)
    before = XDS_GATE_REFUSALS.labels(gate="duplicate-vip")._value.get()
    changed = copy.deepcopy(node)
    changed.status.udp.services[1] = changed.status.udp.services[1].model_copy(
        update={"vip": changed.status.udp.services[0].vip}
    )
    changed.status.udp.services[3] = changed.status.udp.services[3].model_copy(update={"endpoints": []})
    sc.on_state(changed)
    snap = cache.get("node-a")
    assert snap is not None and snap.version == sc.served_version  # the new state is served, less the two arms
    udp_clusters = _udp_arms(snap.resources)
    dialled = {a.service for a in changed.status.udp.services}
    assert f"udp:{changed.status.udp.services[0].service}" not in udp_clusters
    assert f"udp:{changed.status.udp.services[2].service}" in udp_clusters and len(dialled) == 4
    cond = sink.seen[-1]
    assert (cond.status, cond.reason) == ("Unknown", "Pending") and "duplicate-vip" in cond.message
    sc.on_ack("node-a", LISTENER, snap.version)
    wait_for(lambda: sink.seen[-1] == sc.condition, 10, "the ACK's condition written (publisher thread)")
    cond = sink.seen[-1]
    assert (cond.status, cond.reason) == ("True", "AcceptedWithRefusals") and "duplicate-vip" in cond.message
    sc.poll_secrets()
    sc.on_records(records_for(node))
    assert XDS_GATE_REFUSALS.labels(gate="duplicate-vip")._value.get() == before + 1, "counted once per change"
