"""The incremental paths (translate's arm digest, make_snapshot's reuse) give exactly what a cold run gives."""

from __future__ import annotations

import json
import random

import pytest

from aether.api.meshnode import Endpoint, MeshNode
from aether.api.naming import BLACKHOLE_CLUSTER
from aether.testing.samples import node_with, records_for, udp_arm
from aether.xds.ads.cache import Snapshot, _type_mix, make_snapshot
from aether.xds.resources import CLUSTER, ENDPOINT, LISTENER, Resources, TranslateOptions, merge
from aether.xds.translate.compose import clear_memo, translate

L4 = TranslateOptions(areas=("udp", "tcp-floor"))


def _ordered(res: Resources) -> str:
    """The resources with their order (dict order is what the snapshot and the server iterate)."""
    return json.dumps(res)


def _cold(node: MeshNode, options: TranslateOptions = L4) -> Resources:
    clear_memo()
    return translate(node, records_for(node), options)


def _mutate(node: MeshNode, rng: random.Random, step: int) -> None:
    arms = node.status.udp.services
    kind = rng.choice(["endpoint", "endpoint", "add", "remove", "share", "blackhole", "multi", "rename", "none"])
    if kind == "endpoint" and arms:
        rng.choice(arms).endpoints[0].port = 20000 + step
    elif kind == "add":
        arms.insert(rng.randrange(len(arms) + 1), udp_arm(1000 + step))
    elif kind == "remove" and arms:
        del arms[rng.randrange(len(arms))]
    elif kind == "share" and len(arms) > 1:  # two VIPs naming one backend's cluster
        a, b = rng.sample(range(len(arms)), 2)
        arms[a].cluster = arms[b].cluster
    elif kind == "blackhole" and arms:
        rng.choice(arms).cluster = BLACKHOLE_CLUSTER
    elif kind == "multi" and arms:
        arm = rng.choice(arms)
        arm.endpoints = [Endpoint(ip="10.9.9.9", port=step), *arm.endpoints, Endpoint(ip="10.9.9.9", port=step)]
    elif kind == "rename" and arms:
        rng.choice(arms).service = f"default/renamed-{step}"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_incremental_translation_equals_a_cold_one(seed: int) -> None:
    """Warm translations over a random sequence of changes (endpoints, services added/removed/renamed, shared
    clusters, blackhole arms, several endpoints) equal cold ones, dict order included."""
    rng = random.Random(seed)
    node = node_with(12, 2)
    clear_memo()
    first = translate(node, records_for(node), L4)
    for step in range(60):
        state = node.model_copy(deep=True)
        _mutate(state, rng, step)
        if rng.random() < 0.5:
            node = state  # walk on; otherwise the next change starts from the same state again
        warm = translate(state, records_for(state), L4)
        assert _ordered(warm) == _ordered(_cold(state)), f"step {step}"
        translate(node, records_for(node), L4)  # warm the memo again from the walked state
    again = translate(node_with(12, 2), records_for(node_with(12, 2)), L4)
    clear_memo()
    assert _ordered(again) == _ordered(first)


def test_an_endpoint_change_touches_one_assignment_and_nothing_else() -> None:
    node = node_with(50, 2)
    clear_memo()
    base = translate(node, records_for(node), L4)
    changed = node.model_copy(deep=True)
    changed.status.udp.services[7].endpoints[0].port = 20007
    new = translate(changed, records_for(changed), L4)
    differs = {(t, n) for t in new for n in new[t] if new[t][n] is not base[t].get(n)}
    assert differs == {(ENDPOINT, "udp:default/svc-7")}
    assert (
        new[ENDPOINT]["udp:default/svc-7"]["endpoints"][0]["lbEndpoints"][0]["endpoint"]["address"]["socketAddress"][
            "portValue"
        ]
        == 20007
    )
    # back again: every other resource is still the same object; svc-7's old endpoint set is not kept (only what the
    # last translation served is, issue 28), so its assignment is a new one with the old content
    back = translate(node, records_for(node), L4)
    assert {(t, n) for t in back for n in back[t] if back[t][n] is not new[t].get(n)} == {
        (ENDPOINT, "udp:default/svc-7")
    }
    assert back[ENDPOINT]["udp:default/svc-7"] == base[ENDPOINT]["udp:default/svc-7"] and list(back) == list(base)


def test_options_changes_are_not_served_from_the_memo() -> None:
    node = node_with(3, 1)
    clear_memo()
    translate(node, records_for(node), L4)
    other = TranslateOptions(areas=("udp", "tcp-floor"), cluster_connect_timeout_s=2.5, udp_session_idle_s=7)
    assert _ordered(translate(node, records_for(node), other)) == _ordered(_cold(node, other))


def _same(a: Snapshot, b: Snapshot) -> None:
    assert (a.version, a.versions, a.encoded) == (b.version, b.versions, b.encoded)
    assert [list(v) for v in a.versions.values()] == [list(v) for v in b.versions.values()]


def test_incremental_snapshot_equals_a_cold_one() -> None:
    """make_snapshot from a previous snapshot (bytes and versions reused, version updated per change) equals one
    made from nothing, for changes, additions, removals, reorders and a type that disappears."""
    rng = random.Random(7)
    node = node_with(20, 2)
    clear_memo()
    prev = make_snapshot(translate(node, records_for(node), L4))
    for step in range(40):
        state = node.model_copy(deep=True)
        _mutate(state, rng, step)
        res = translate(state, records_for(state), L4)
        if step % 7 == 3:
            res = {t: dict(reversed(list(v.items()))) for t, v in res.items()}  # same content, another order
        if step % 11 == 5:
            res = {t: v for t, v in res.items() if t != LISTENER}
        warm = make_snapshot(res, prev)
        _same(warm, make_snapshot(res))
        prev = warm
        node = state


def test_snapshot_version_follows_content_not_order() -> None:
    res = translate(node_with(5, 1), records_for(node_with(5, 1)), L4)
    snap = make_snapshot(res)
    assert make_snapshot({t: dict(reversed(list(v.items()))) for t, v in res.items()}).version == snap.version
    fewer = {t: dict(v) for t, v in res.items()}
    del fewer[ENDPOINT]["udp:default/svc-1"]
    assert make_snapshot(fewer, snap).version != snap.version
    emptied = {t: dict(v) for t, v in res.items()}
    emptied[ENDPOINT] = {}
    assert make_snapshot(emptied, snap).version not in (snap.version, make_snapshot(fewer).version)


def test_a_hand_built_previous_snapshot_is_used_for_bytes_not_for_the_version() -> None:
    res = translate(node_with(3, 1), records_for(node_with(3, 1)), L4)
    cold = make_snapshot(res)
    hand = Snapshot("hand", cold.resources, cold.versions, cold.encoded)  # no per-type mixes
    _same(make_snapshot(res, hand), cold)


def test_merge_still_refuses_a_name_two_builders_produce() -> None:
    a: Resources = {CLUSTER: {"x": {"name": "x"}, "y": {"name": "y"}}}
    b: Resources = {CLUSTER: {"z": {"name": "z"}, "y": {"name": "y"}}}
    with pytest.raises(ValueError, match="two builders produced Cluster 'y'"):
        merge(a, b)
    merged = merge(a, {CLUSTER: {"z": {"name": "z"}}}, {LISTENER: {}})
    assert list(merged[CLUSTER]) == ["x", "y", "z"] and merged[CLUSTER] is not a[CLUSTER]


def test_the_version_mix_tells_swapped_versions_apart() -> None:
    v1, v2 = "0123456789abcdef0123", "fedcba98765432100123"
    assert _type_mix({"a": v1, "b": v2}) != _type_mix({"a": v2, "b": v1})
    assert _type_mix({"a": v1, "b": v2}) == _type_mix({"b": v2, "a": v1})


def test_a_matcher_merged_from_cached_entries_is_byte_identical(monkeypatch: pytest.MonkeyPatch) -> None:
    """fastcodec merges a matcher's arms as cached wire entries: the same bytes as filling them one by one, also
    after an arm is added (cached entries reused) and for the blackhole-only matcher; the same message as
    json_format.ParseDict (whose bytes differ in map order: it packs Anys without deterministic serialization)."""
    from aether.xds.codec import fastfill as fastcodec
    from aether.xds.codec import protojson as codec

    merged: dict[tuple[int, str], bytes] = {}
    for n in (0, 1, 300, 301):
        node = node_with(n, 1)
        for name, listener in translate(node, records_for(node), L4)[LISTENER].items():
            merged[(n, name)] = codec.encode(LISTENER, listener, name)
            slow = codec.encode(LISTENER, listener, name, fast=False)
            assert codec.decode_json(LISTENER, merged[(n, name)]) == codec.decode_json(LISTENER, slow)
    monkeypatch.setattr(fastcodec, "_merge_shared_map", lambda *args: False)
    clear_memo()
    for n in (0, 1, 300, 301):
        node = node_with(n, 1)
        for name, listener in translate(node, records_for(node), L4)[LISTENER].items():
            assert codec.encode(LISTENER, listener, name) == merged[(n, name)], (n, name)
