"""The delta-ADS server in-process, driven by a gRPC client speaking like Envoy 1.40 (no Envoy here)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2  # type: ignore[import-untyped]

from aether.api.meshnode import MeshNode
from aether.netns.records import PodRecord
from aether.testing.ads_client import Client
from aether.testing.samples import node_with, records_for
from aether.testing.wait import wait_for
from aether.xds.ads.cache import SnapshotCache, make_snapshot
from aether.xds.ads.server import SENT_LOG, DeltaAdsServer, Events, serve
from aether.xds.resources import CLUSTER, ENDPOINT, LISTENER, Resources, TranslateOptions
from aether.xds.sidecar.loop import Sidecar
from aether.xds.translate.compose import translate as translate_all

NODE = "node-a"


L4 = TranslateOptions(areas=("udp", "tcp-floor"))


def translate(node: MeshNode, records: Mapping[str, PodRecord]) -> Resources:
    """This area's builders only (the east-west area has its own tests)."""
    return translate_all(node, records, L4)


@pytest.fixture
def ads() -> Iterator[tuple[SnapshotCache, DeltaAdsServer, int]]:
    cache = SnapshotCache()
    servicer = DeltaAdsServer(cache)
    server, port = serve(servicer, "127.0.0.1:0")
    try:
        yield cache, servicer, port
    finally:
        server.stop(grace=0).wait(5)


def _res(n: int, pods: int = 1) -> Resources:
    node = node_with(n, pods)
    return translate(node, records_for(node))


def _names(resp: discovery_pb2.DeltaDiscoveryResponse) -> list[str]:
    return sorted(r.name for r in resp.resources)


def test_wildcard_cds_then_eds_by_name_then_lds(ads: tuple[SnapshotCache, DeltaAdsServer, int]) -> None:
    cache, _, port = ads
    cache.set_snapshot(NODE, make_snapshot(_res(2)))
    c = Client(port)
    try:
        c.send(CLUSTER)
        cds = c.recv()
        assert _names(cds) == ["blackhole", "udp:default/svc-0", "udp:default/svc-1"]
        c.send(CLUSTER, response_nonce=cds.nonce)
        c.send(ENDPOINT, resource_names_subscribe=["udp:default/svc-0", "udp:default/svc-1", "udp:nope/x"])
        eds = c.recv()
        assert _names(eds) == ["udp:default/svc-0", "udp:default/svc-1"]
        assert list(eds.removed_resources) == ["udp:nope/x"]  # explicitly asked, not in the snapshot
        c.send(ENDPOINT, response_nonce=eds.nonce)
        c.send(LISTENER)
        lds = c.recv()
        assert _names(lds) == ["capture-udp:default/client-0"]
        c.send(LISTENER, response_nonce=lds.nonce)
        # one service more: only what changed goes out, per type
        cache.set_snapshot(NODE, make_snapshot(_res(3)))
        got = {r.type_url: r for r in (c.recv(), c.recv())}
        assert _names(got[CLUSTER]) == ["udp:default/svc-2"]
        assert _names(got[LISTENER]) == ["capture-udp:default/client-0"]
        assert c.nothing()  # no EDS push: svc-2's CLA is not subscribed yet (Envoy asks when the cluster warms)
        # one service fewer: removed_resources only
        for r in got.values():
            c.send(r.type_url, response_nonce=r.nonce)
        cache.set_snapshot(NODE, make_snapshot(_res(1)))
        cds2 = c.recv()
        assert cds2.type_url == CLUSTER and list(cds2.removed_resources) == ["udp:default/svc-1", "udp:default/svc-2"]
    finally:
        c.close()


def test_reconnect_with_initial_versions_resends_nothing_unchanged(
    ads: tuple[SnapshotCache, DeltaAdsServer, int],
) -> None:
    cache, servicer, port = ads
    snap = make_snapshot(_res(5))
    cache.set_snapshot(NODE, snap)
    held_cds = dict(snap.versions[CLUSTER])
    held_cds["udp:default/svc-0"] = "stale"  # one changed while we were away
    held_cds["udp:default/old"] = "1"  # one removed while we were away
    c = Client(port)
    try:
        c.send(CLUSTER, initial_resource_versions=held_cds)
        cds = c.recv()
        assert _names(cds) == ["udp:default/svc-0"]
        assert list(cds.removed_resources) == ["udp:default/old"]
        c.send(LISTENER, initial_resource_versions=snap.versions[LISTENER])
        lds = c.recv()  # the first answer of a type always goes out (Envoy's initial fetch waits for it) ...
        assert list(lds.resources) == [] and list(lds.removed_resources) == []  # ... empty: nothing re-sent
        assert c.nothing()
        records = [r for r in servicer.sent if r.type_url == LISTENER]
        assert [(r.resources, r.removed) for r in records] == [((), ())]
    finally:
        c.close()


def test_on_demand_hook_can_supply_a_missing_name(ads: tuple[SnapshotCache, DeltaAdsServer, int]) -> None:
    cache, servicer, port = ads
    base = _res(1)
    cache.set_snapshot(NODE, make_snapshot(base))
    asked: list[tuple[str, str, set[str]]] = []

    def hook(node: str, type_url: str, names: set[str]) -> None:
        asked.append((node, type_url, names))
        extra = {**base, CLUSTER: {**base[CLUSTER], "od": {"name": "od", "type": "STATIC", "connectTimeout": "1s"}}}
        cache.set_snapshot(node, make_snapshot(extra))

    servicer.on_demand = hook
    c = Client(port)
    try:
        c.send(CLUSTER, resource_names_subscribe=["*", "od"])
        first = c.recv()
        assert asked == [(NODE, CLUSTER, {"od"})]
        assert "od" in _names(first)
    finally:
        c.close()


def test_nack_rolls_back_to_the_last_good_state_and_says_why(
    ads: tuple[SnapshotCache, DeltaAdsServer, int], tmp_path: object
) -> None:
    cache, servicer, port = ads
    statuses: list[str] = []

    class Sink:
        def publish(self, node_name: str, conditions: list) -> None:  # type: ignore[type-arg]
            statuses.append(f"{conditions[0].status}/{conditions[0].reason}: {conditions[0].message}")

    sidecar = Sidecar(NODE, cache, Sink(), path_exists=lambda p: True)
    servicer.events = sidecar
    good = node_with(2, 1)
    sidecar.on_records(records_for(good))
    sidecar.on_state(good)
    good_version = sidecar.served_version
    c = Client(port)
    try:
        c.send(CLUSTER)
        cds = c.recv()
        c.send(CLUSTER, response_nonce=cds.nonce)
        c.send(ENDPOINT, resource_names_subscribe=["udp:default/svc-0", "udp:default/svc-1"])
        eds = c.recv()
        c.send(ENDPOINT, response_nonce=eds.nonce)
        # ACK and NACK hooks leave the write to the publisher thread: the stream never waits for the API
        wait_for(lambda: statuses and statuses[-1].startswith("True/Accepted"), 10, "Programmed=True written")
        bad = node_with(2, 1)
        bad.status.udp.services[1].endpoints[0].ip = "not-an-ip"
        sidecar.on_state(bad)
        bad_version = sidecar.served_version
        push = c.recv()
        assert push.type_url == ENDPOINT and _names(push) == ["udp:default/svc-1"]
        c.send(
            ENDPOINT,
            response_nonce=push.nonce,
            error_detail=status_pb2.Status(code=3, message="malformed IP address: not-an-ip"),
        )
        undo = c.recv()  # the rollback re-sends the good CLA
        assert _names(undo) == ["udp:default/svc-1"]
        assert undo.system_version_info == good_version != bad_version
        assert cache.get(NODE).version == good_version  # type: ignore[union-attr]
        wait_for(lambda: statuses[-1].startswith("False/Rejected"), 10, "Programmed=False written")
        assert good_version is not None
        assert "malformed IP address: not-an-ip" in statuses[-1] and good_version in statuses[-1]
        c.send(ENDPOINT, response_nonce=undo.nonce)
        # the next good state recovers
        better = node_with(3, 1)
        sidecar.on_state(better)
        assert c.recv().type_url == CLUSTER
    finally:
        c.close()


def test_default_events_is_quiet(caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    """The default Events only logs: an ACK says nothing, connects and disconnects are INFO, a NACK is one WARNING
    naming the node, the type, the version and Envoy's error; nothing is printed and nothing raised."""
    ev = Events()
    caplog.set_level(logging.DEBUG)
    ev.on_ack("n", CLUSTER, "v1")
    assert caplog.records == []
    ev.on_connect("n", 7)
    ev.on_disconnect("n", 7)
    assert [(r.name, r.levelno) for r in caplog.records] == [("aether.xds.ads.server", logging.INFO)] * 2
    assert all("stream 7" in r.getMessage() and "node n" in r.getMessage() for r in caplog.records)
    caplog.clear()
    ev.on_nack("n", CLUSTER, "v2", "malformed IP address")
    (nack,) = caplog.records
    assert (nack.name, nack.levelno) == ("aether.xds.ads.server", logging.WARNING)
    assert nack.getMessage() == "NACK node=n type=Cluster version=v2: malformed IP address"
    assert capsys.readouterr() == ("", "")


def test_a_request_racing_a_new_snapshot_gets_every_type_in_order() -> None:
    """A request of one type (here LDS's ACK) that arrives after a new snapshot was installed but before the
    stream's watch event is handled used to be answered with that type alone: listeners naming clusters CDS had not
    sent yet, which Envoy NACKs ("route: unknown cluster"; seen in the demo). Now the stream gets the whole new
    snapshot, CDS first. Driven without gRPC so the race is not left to timing; red with the old one-type answer."""
    from aether.xds.ads.server import _Stream

    cache = SnapshotCache()
    server = DeltaAdsServer(cache)
    stream = _Stream(id=1, node=NODE)
    cache.set_snapshot(NODE, make_snapshot(_res(2)))

    def ask(type_url: str, nonce: str = "") -> list[discovery_pb2.DeltaDiscoveryResponse]:
        req = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, response_nonce=nonce)
        return list(server._on_request(stream, req))

    (cds,) = ask(CLUSTER)
    assert ask(CLUSTER, cds.nonce) == []
    (lds,) = ask(LISTENER)
    cache.set_snapshot(NODE, make_snapshot(_res(3)))  # svc-2 arrives: a new cluster and a listener naming it
    answered = ask(LISTENER, lds.nonce)
    assert [r.type_url for r in answered] == [CLUSTER, LISTENER]
    assert "udp:default/svc-2" in _names(answered[0])
    # the watch event that follows finds nothing left to send
    snap = cache.get(NODE)
    assert snap is not None and list(server._push(stream, snap)) == []


def _eds_base() -> Resources:
    """A snapshot with one EDS cluster (`base`) and its load assignment, plus a fetchable `od` pair."""
    cla = {"clusterName": "base", "endpoints": [{"lbEndpoints": []}]}
    eds = {"name": "base", "type": "EDS", "connectTimeout": "1s", "edsClusterConfig": {"edsConfig": {"ads": {}}}}
    return {CLUSTER: {"base": eds}, ENDPOINT: {"base": cla}}


def _with_od(res: Resources) -> Resources:
    od = {**res[CLUSTER]["base"], "name": "od", "edsClusterConfig": {"serviceName": "od", "edsConfig": {"ads": {}}}}
    return {CLUSTER: {**res[CLUSTER], "od": od}, ENDPOINT: {**res[ENDPOINT], "od": {"clusterName": "od"}}}


@pytest.mark.parametrize("announce", [True, False])
def test_a_fetched_clusters_load_assignment_is_announced_and_still_answered_when_asked(announce: bool) -> None:
    """An on-demand fetch's companions (the twin's own load assignment) go out right after the fetched cluster,
    before the client subscribes to them; they are not recorded as held, so the subscription that follows is
    answered as usual (Envoy takes that copy as an update that changes nothing; a copy it dropped would cost that
    round trip, never a wait). `announce=False` is the sidecar's `--announce off`: only the cluster."""
    from aether.xds.ads.server import _Stream

    cache = SnapshotCache()
    base = _eds_base()
    cache.set_snapshot(NODE, make_snapshot(base))
    server = DeltaAdsServer(cache, announce=announce)

    def fetch(node: str, type_url: str, names: set[str]) -> Mapping[str, frozenset[str]]:
        cache.set_snapshot(node, make_snapshot(_with_od(base)))
        return {ENDPOINT: frozenset(names), LISTENER: frozenset(names)}  # LDS not started: nothing announced

    server.on_demand = fetch
    stream = _Stream(id=1, node=NODE)

    def ask(type_url: str, nonce: str = "", sub: tuple[str, ...] = ()) -> list[discovery_pb2.DeltaDiscoveryResponse]:
        req = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, response_nonce=nonce, resource_names_subscribe=sub)
        return list(server._on_request(stream, req))

    (cds,) = ask(CLUSTER)
    (eds,) = ask(ENDPOINT, sub=("base",))
    assert ask(CLUSTER, cds.nonce) == [] and ask(ENDPOINT, eds.nonce) == []
    answered = ask(CLUSTER, sub=("od",))  # the on_demand filter's fetch
    if not announce:
        assert [(r.type_url, _names(r)) for r in answered] == [(CLUSTER, ["od"])]
        return
    assert [(r.type_url, _names(r)) for r in answered] == [(CLUSTER, ["od"]), (ENDPOINT, ["od"])]
    assert [(s.type_url, s.announced) for s in list(server.sent)[-2:]] == [(CLUSTER, False), (ENDPOINT, True)]
    assert "od" not in stream.types[ENDPOINT].known  # announced, not held
    assert ask(ENDPOINT, answered[1].nonce) == []  # the announce's ACK: nothing to send
    # the cluster's EDS subscription arrives (Envoy sent it while processing the cluster): answered, a copy
    (copy,) = ask(ENDPOINT, sub=("od",))
    assert _names(copy) == ["od"] and stream.types[ENDPOINT].known["od"]
    assert ask(ENDPOINT, copy.nonce) == []


def test_the_sent_log_is_short_and_keeps_the_latest(ads: tuple[SnapshotCache, DeltaAdsServer, int]) -> None:
    """`DeltaAdsServer.sent` is for tests and debugging: 64 responses by default, the latest kept. It held 10,000,
    which the sidecar under the soak's churn (about 10 responses a minute) kept filling for 16 hours: its heap
    grew with the records and the resource names they held (tracemalloc, seed 50: +53 and +63 records in 6
    minutes, the only type of ours growing)."""
    cache, servicer, port = ads
    assert servicer.sent.maxlen == SENT_LOG == 64
    c = Client(port)
    try:
        c.send(CLUSTER)
        for i in range(SENT_LOG + 6):
            cache.set_snapshot(NODE, make_snapshot(_res(2 + i % 2)))
            r = c.recv()
            c.send(CLUSTER, response_nonce=r.nonce)
        assert len(servicer.sent) == SENT_LOG and servicer.sent[-1].nonce == r.nonce
    finally:
        c.close()
