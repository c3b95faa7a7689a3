"""The pair machine wired into the sidecar and the delta-ADS server, driven by a client that speaks like Envoy 1.40
(the real proxy is in tests/xds/test_pairs_datapath.py and the e2e): a fresh stream's first CDS request is
StreamOpened, a later explicit CDS subscription is Fetched, each applied (and its snapshot installed) before the
request is answered; twins and their own-name load assignments exist for published pairs only; refusals are
answered absent, logged and counted by reason; Persist reaches the status sink, and a failing sink never blocks
serving (PairsPersisted False with the reason)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2

from aether.api.meshnode import Condition, MeshNode, QuicPair
from aether.backoff import Backoff
from aether.metrics import QUIC_PAIR_ADMISSIONS, QUIC_PAIR_FETCH_SECONDS, QUIC_PAIR_REFUSALS, REGISTRY
from aether.netns.records import PodRecord
from aether.testing.ads_client import Client
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.wait import wait_for
from aether.xds.ads.cache import SnapshotCache
from aether.xds.ads.server import DeltaAdsServer, serve
from aether.xds.pairs.values import PairConfig
from aether.xds.resources import CLUSTER, ENDPOINT, TranslateOptions
from aether.xds.sidecar.loop import Sidecar
from aether.xds.sidecar.sources import FileStatusSink, read_status_file, read_status_pairs

NODE = "node-a"
TWIN = "quic:default/web@client"
OTHER_TWIN = "quic:default/web@other"
BOGUS = "quic:default/web@nobody"


def node_and_records(dialled: bool = False) -> tuple[MeshNode, dict[str, PodRecord]]:
    return sample_node(
        NODE,
        [
            SamplePod("u-client", "client-0", "10.200.1.2", "client", "/run/netns/s-client"),
            SamplePod("u-other", "other-0", "10.200.1.3", "other", "/run/netns/s-other"),
        ],
        [SampleDestination("default/web", "web-sa", (8080,), ("10.200.2.7",), vip="10.96.0.20")],
        dialled=dialled,
    )


class Sink:
    def __init__(self) -> None:
        self.conditions: dict[str, Condition] = {}
        self.pairs: list[tuple[list[QuicPair], list[QuicPair]]] = []
        self.fail: str | None = None

    def publish(self, node_name: str, conditions: list[Condition]) -> None:
        for c in conditions:
            self.conditions[c.type] = c

    def publish_pairs(self, node_name: str, pairs: list[QuicPair], dormant: list[QuicPair]) -> None:
        if self.fail:
            raise OSError(self.fail)
        self.pairs.append((pairs, dormant))


class Rig:
    def __init__(self, sink: Sink, clock: list[float]) -> None:
        self.cache = SnapshotCache()
        self.sink = sink
        self.clock = clock
        self.sidecar = Sidecar(
            NODE,
            self.cache,
            sink,
            options=TranslateOptions(),
            path_exists=lambda _: True,
            pair_config=PairConfig(fetch_window_s=600),
            clock=lambda: clock[0],
        )
        self.servicer = DeltaAdsServer(self.cache, events=self.sidecar, on_demand=self.sidecar.on_demand)
        self.server, self.port = serve(self.servicer, "127.0.0.1:0", max_workers=8)

    def clusters(self) -> set[str]:
        snap = self.cache.get(NODE)
        return set(snap.versions.get(CLUSTER, {})) if snap else set()

    def endpoints(self) -> set[str]:
        snap = self.cache.get(NODE)
        return set(snap.versions.get(ENDPOINT, {})) if snap else set()

    def close(self) -> None:
        self.server.stop(0)
        if self.sidecar.pair_writer is not None:
            self.sidecar.pair_writer.close()


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig(Sink(), [1_000_000.0])
    node, records = node_and_records()
    r.sidecar.on_records(records)
    r.sidecar.on_state(node)
    try:
        yield r
    finally:
        r.close()


def _names(resp: discovery_pb2.DeltaDiscoveryResponse) -> list[str]:
    return [r.name for r in resp.resources]


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_no_twin_until_a_pair_dials_then_twin_and_own_eds_name_before_the_answer(rig: Rig) -> None:
    assert not {TWIN, OTHER_TWIN} & rig.clusters()  # arms for both sources, twins for none
    before = _sample("aether_quic_pair_admissions_total", evidence="Fetch")
    fetches = _sample("aether_quic_pair_fetch_seconds_count")
    c = Client(rig.port)
    try:
        c.send(CLUSTER)
        first = c.recv()
        assert TWIN not in _names(first)
        c.send(CLUSTER, response_nonce=first.nonce, resource_names_subscribe=[TWIN])  # the on_demand filter's ask
        got = c.recv()
        assert _names(got) == [TWIN]  # the very answer to the fetch holds it
        assert TWIN in rig.endpoints() and OTHER_TWIN not in rig.clusters()
        assert _sample("aether_quic_pair_admissions_total", evidence="Fetch") == before + 1
        assert _sample("aether_quic_pair_fetch_seconds_count") == fetches + 1
    finally:
        c.close()
    wait_for(lambda: rig.sink.pairs and rig.sink.pairs[-1][0], 5, "the pair persisted")
    (pair,), dormant = rig.sink.pairs[-1]
    assert (pair.twin, pair.source, pair.destination, pair.evidence) == (
        TWIN,
        "spiffe://cluster.local/ns/default/sa/client",
        "default/web",
        "Fetch",
    )
    assert pair.last_evidence is not None and pair.last_evidence.kind == "Fetch" and dormant == []
    assert QUIC_PAIR_ADMISSIONS is not None and QUIC_PAIR_FETCH_SECONDS is not None


def test_a_refused_name_is_answered_absent_logged_and_counted_others_unaffected(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    before = _sample("aether_quic_pair_refusals_total", reason="SourceNotLocal")
    c = Client(rig.port)
    try:
        c.send(CLUSTER)
        first = c.recv()
        c.send(CLUSTER, response_nonce=first.nonce, resource_names_subscribe=[TWIN])
        c.recv()
        with caplog.at_level(logging.WARNING, logger="aether.xds.pairs"):
            c.send(CLUSTER, resource_names_subscribe=[BOGUS])
            got = c.recv()
        assert list(got.removed_resources) == [BOGUS] and _names(got) == []
        assert f"{BOGUS} refused (answered absent): SourceNotLocal" in caplog.text
        assert _sample("aether_quic_pair_refusals_total", reason="SourceNotLocal") == before + 1
        assert TWIN in rig.clusters()  # the admitted pair is untouched
    finally:
        c.close()
    assert QUIC_PAIR_REFUSALS is not None


def test_fresh_stream_held_only_twin_answered_absent_resubscribed_twin_admitted(rig: Rig) -> None:
    """A proxy reconnects holding two twins of an earlier sidecar: one it fetched (re-subscribed by name), one it
    got by the wildcard (held only, no stored pair): the first is admitted, the second answered absent."""
    c = Client(rig.port)
    try:
        c.send(
            CLUSTER,
            resource_names_subscribe=["*", TWIN],
            initial_resource_versions={TWIN: "old", OTHER_TWIN: "old", "h2:default/web": "old"},
        )
        got = c.recv()
        assert TWIN in _names(got)
        assert OTHER_TWIN in got.removed_resources
        assert TWIN in rig.clusters() and OTHER_TWIN not in rig.clusters()
    finally:
        c.close()


def test_a_stream_before_the_state_is_applied_once_the_state_arrives() -> None:
    r = Rig(Sink(), [1_000_000.0])
    c = Client(r.port)
    try:
        c.send(CLUSTER, resource_names_subscribe=["*", TWIN], initial_resource_versions={TWIN: "old"})
        assert c.nothing(0.3)  # no state yet: nothing to serve
        node, records = node_and_records()
        r.sidecar.on_records(records)
        r.sidecar.on_state(node)
        got = c.recv()
        assert TWIN in _names(got)
    finally:
        c.close()
        r.close()


def test_a_failing_status_write_never_blocks_serving_and_says_why() -> None:
    sink = Sink()
    sink.fail = "connection refused"
    r = Rig(sink, [1_000_000.0])
    assert r.sidecar.pair_writer is not None
    r.sidecar.pair_writer.retry = Backoff(first=0.05, cap=30.0)
    node, records = node_and_records()
    r.sidecar.on_records(records)
    r.sidecar.on_state(node)
    c = Client(r.port)
    try:
        c.send(CLUSTER)
        first = c.recv()
        c.send(CLUSTER, response_nonce=first.nonce, resource_names_subscribe=[TWIN])
        assert _names(c.recv()) == [TWIN]  # served from memory
        cond = wait_for(lambda: sink.conditions.get("PairsPersisted"), 5, "PairsPersisted")
        assert (cond.status, cond.reason) == ("False", "WriteFailed") and "connection refused" in cond.message
        sink.fail = None  # the API is back: the writer catches up
        wait_for(lambda: sink.pairs and sink.pairs[-1][0], 5, "the pair written after the outage")
        wait_for(lambda: sink.conditions["PairsPersisted"].status == "True", 5, "PairsPersisted True again")
        assert sink.pairs[-1][0][0].twin == TWIN
    finally:
        c.close()
        r.close()


def test_a_restarted_sidecar_carries_stored_pairs_and_the_window_prunes_unused_ones() -> None:
    """Stored pairs are published at start (no request); one with no evidence of use within the fetch window of
    the start is pruned with its twin, while one the fresh stream holds counts as used."""
    clock = [1_000_000.0]
    r = Rig(Sink(), clock)
    node, records = node_and_records(dialled=True)  # the MeshNode lists both pairs
    r.sidecar.on_records(records)
    r.sidecar.on_state(node)
    c = Client(r.port)
    try:
        assert {TWIN, OTHER_TWIN} <= r.clusters()
        c.send(CLUSTER, initial_resource_versions={TWIN: "old"})  # the proxy holds TWIN only
        c.recv()
        clock[0] += 601
        r.sidecar.tick_pairs()
        assert TWIN in r.clusters() and OTHER_TWIN not in r.clusters()
        assert _sample("aether_quic_pair_prunes_total", cause="FetchWindow") >= 1
    finally:
        c.close()
        r.close()


def test_the_fetch_fast_path_serves_exactly_what_a_full_translation_does(rig: Rig) -> None:
    """A fetch adds the twin to the served snapshot without translating everything (`Sidecar._add_twins`); the
    next full reconcile must find nothing to change (the same snapshot version, so nothing is pushed)."""
    c = Client(rig.port)
    try:
        c.send(CLUSTER)
        first = c.recv()
        c.send(CLUSTER, response_nonce=first.nonce, resource_names_subscribe=[TWIN])
        assert _names(c.recv()) == [TWIN]
    finally:
        c.close()
    fast = rig.cache.get(NODE)
    assert fast is not None
    node, _ = node_and_records()
    rig.sidecar.on_state(node)  # a full reconcile of the same state
    full = rig.cache.get(NODE)
    assert full is not None and full.version == fast.version
    assert full.versions[CLUSTER][TWIN] == fast.versions[CLUSTER][TWIN]


def test_the_sidecars_own_writes_coming_back_through_the_watch_are_no_new_desired_state() -> None:
    from aether.xds.sidecar.kube_source import desired_part

    status: dict[str, Any] = {
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "Programmed", "status": "Unknown"}],
        "quic": {"destinations": [{"service": "a/web"}], "pairs": [], "pairCount": 0},
    }
    ours: dict[str, Any] = {
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "Programmed", "status": "True"},
            {"type": "PairsPersisted", "status": "True"},
        ],
        "quic": {"destinations": [{"service": "a/web"}], "pairs": [{"twin": "quic:a/web@x"}], "pairCount": 1},
    }
    assert desired_part(ours) == desired_part(status)
    # the operator's changes are (negative control: the comparison sees them)
    theirs = {**ours, "quic": {**ours["quic"], "destinations": []}}
    assert desired_part(theirs) != desired_part(status)
    ready = {**ours, "conditions": [{"type": "Ready", "status": "False"}]}
    assert desired_part(ready) != desired_part(status)


def test_file_mode_keeps_pairs_in_the_status_file_and_a_restart_carries_them(tmp_path: Path) -> None:
    """`aether xds --state FILE`: the pairs go to the status file beside the conditions, and a sidecar started
    again with that file starts from them (the state file itself is never written)."""
    status = tmp_path / "node.status.json"
    node, records = node_and_records()
    first = Sidecar(
        NODE, SnapshotCache(), FileStatusSink(status), options=TranslateOptions(), path_exists=lambda _: True
    )
    first.on_records(records)
    first.on_state(node)
    first.on_demand(NODE, CLUSTER, {TWIN})
    assert first.pair_writer is not None
    first.pair_writer.close()  # flushes the last view
    quic = read_status_pairs(status)
    pairs = quic["pairs"]
    assert isinstance(pairs, list) and [p["twin"] for p in pairs] == [TWIN] and quic["pairCount"] == 1
    assert {c.type for c in read_status_file(status)} >= {"Programmed", "PairsPersisted"}
    again = Sidecar(
        NODE, SnapshotCache(), FileStatusSink(status), options=TranslateOptions(), path_exists=lambda _: True
    )
    again.on_records(records)
    again.on_state(node)  # the state file lists no pairs: the status file's are the carry-over
    snap = again.cache.get(NODE)
    assert snap is not None and TWIN in snap.versions[CLUSTER]
    assert again.pair_writer is not None
    again.pair_writer.close()


def test_the_fetch_window_flag() -> None:
    from aether.xds.sidecar.arguments import duration

    assert [duration(v) for v in ("3600", "90s", "30m", "1h", "0.5h")] == [3600, 90, 1800, 3600, 1800]
    for bad in ("0", "-1h", "soon", "h"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration(bad)
