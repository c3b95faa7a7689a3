"""The sidecar loop without Envoy: file source, gates refusing a state, invalid files, the Programmed condition."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import yaml

from aether.api.meshnode import Condition
from aether.metrics import XDS_GATE_REFUSALS
from aether.testing.samples import node_with, records_for
from aether.testing.wait import wait_for
from aether.xds.ads.cache import SnapshotCache
from aether.xds.resources import LISTENER, TranslateOptions
from aether.xds.sidecar.loop import Sidecar
from aether.xds.sidecar.sources import FileSource, FileStatusSink, read_status_file

L4 = TranslateOptions(areas=("udp", "tcp-floor"))


class Sink:
    def __init__(self) -> None:
        self.seen: list[Condition] = []

    def publish(self, node_name: str, conditions: list[Condition]) -> None:
        self.seen.append(conditions[0])


def written(sink: Sink, sc: Sidecar) -> Condition:
    """The sidecar's condition once the sink has it: an ACK/NACK hook leaves the write to the publisher thread."""
    wait_for(lambda: bool(sink.seen) and sink.seen[-1] == sc.condition, 10, "the condition written")
    assert sc.condition is not None
    return sc.condition


def _sidecar(sink: Sink) -> tuple[Sidecar, SnapshotCache]:
    cache = SnapshotCache()
    sc = Sidecar("node-a", cache, sink, options=L4, path_exists=lambda p: "missing" not in p)
    return sc, cache


def test_a_gate_refusal_refuses_the_resource_serves_the_rest_and_says_why() -> None:
    sink = Sink()
    sc, cache = _sidecar(sink)
    good = node_with(3, 2)
    sc.on_records(records_for(good))
    sc.on_state(good)
    served = cache.get("node-a")
    assert served is not None and sink.seen[-1].reason == "Pending"
    before = XDS_GATE_REFUSALS.labels(gate="duplicate-vip")._value.get()
    bad = node_with(3, 2)
    bad.status.udp.services[1] = bad.status.udp.services[1].model_copy(update={"vip": bad.status.udp.services[0].vip})
    sc.on_state(bad)
    now = cache.get("node-a")
    assert now is not None and now is not served  # the rest of the new state is served
    cond = sink.seen[-1]
    assert (cond.status, cond.reason) == ("Unknown", "Pending")
    assert "duplicate-vip" in cond.message and "refused, the rest served" in cond.message
    assert XDS_GATE_REFUSALS.labels(gate="duplicate-vip")._value.get() == before + 1


def test_a_missing_netns_refuses_its_listeners() -> None:
    sink = Sink()
    sc, cache = _sidecar(sink)
    node = node_with(2, 1)
    sc.on_records(records_for(node, "/run/netns/missing"))
    sc.on_state(node)
    snap = cache.get("node-a")
    assert snap is not None and snap.resources[LISTENER] == {}
    assert sink.seen[-1].reason == "Pending" and "netns-exists" in sink.seen[-1].message


def test_invalid_state_and_wrong_node_keep_serving() -> None:
    sink = Sink()
    sc, cache = _sidecar(sink)
    sc.on_state(node_with(1, 1))
    served = cache.get("node-a")
    sc.on_state(None, "state.yaml: status.udp.services.0.vip: Field required")
    assert sink.seen[-1].reason == "InvalidState" and "status.udp.services.0.vip" in sink.seen[-1].message
    sc.on_state(node_with(1, 1, name="node-b"))
    assert sink.seen[-1].reason == "InvalidState" and "node-b" in sink.seen[-1].message
    assert cache.get("node-a") is served
    sc.on_state(node_with(2, 1))  # a good state recovers
    assert sink.seen[-1].reason == "Pending" and cache.get("node-a") is not served


def test_file_source_rereads_on_change_and_reports_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "mn.yaml"
    path.write_text(yaml.safe_dump(node_with(1, 1).wire()))
    stop = threading.Event()
    updates = FileSource(path, interval=0.02).updates(stop)
    first = next(updates)
    assert first.node is not None and len(first.node.status.udp.services) == 1
    path.write_text("status: [not, a, mapping\n")
    bad = next(updates)
    assert bad.node is None and bad.error is not None and str(path) in bad.error
    path.write_text(yaml.safe_dump(node_with(2, 1).wire()))
    again = next(updates)
    assert again.node is not None and len(again.node.status.udp.services) == 2
    stop.set()


def test_file_status_sink_writes_a_meshnode_shaped_status(tmp_path: Path) -> None:
    out = tmp_path / "mn.yaml.status.json"
    cond = Condition(type="Programmed", status="True", reason="Accepted", message="m")
    FileStatusSink(out).publish("node-a", [cond])
    doc = json.loads(out.read_text())
    assert doc["kind"] == "MeshNode" and doc["metadata"] == {"name": "node-a"}
    assert read_status_file(out) == [cond]


def test_a_missing_slice_is_served_without_and_said_in_programmed() -> None:
    """What the source could not supply (a MeshServiceSlice named but absent) keeps Programmed False even once
    Envoy holds what is served; the state made whole turns it True."""
    sink = Sink()
    sc, cache = _sidecar(sink)
    node = node_with(2, 1)
    sc.on_records(records_for(node))
    sc.on_state(node, None, problems=("1 MeshServiceSlices missing: default.1",))
    assert cache.get("node-a") is not None and sink.seen[-1].reason == "Pending"
    assert sc.served_version is not None
    sc.on_ack("node-a", LISTENER, sc.served_version)
    cond = written(sink, sc)
    assert (cond.status, cond.reason) == ("False", "SlicesIncomplete")
    assert "missing: default.1" in cond.message and "the rest served" in cond.message
    sc.on_state(node_with(3, 1))
    sc.on_ack("node-a", LISTENER, sc.served_version)
    cond = written(sink, sc)
    assert (cond.status, cond.reason) == ("True", "Accepted")


def test_an_ack_never_waits_for_the_api() -> None:
    """The ACK that turns Programmed True runs on the ADS stream's thread: the write goes to the publisher thread,
    so the stream's next request (a pair's fetch in a burst of first uses) never queues behind the API. Red when
    on_ack writes in place: it would block here until the API answered."""
    release = threading.Event()
    blocking = False

    class SlowApi(Sink):
        def publish(self, node_name: str, conditions: list[Condition]) -> None:
            if blocking:
                release.wait(30)
            super().publish(node_name, conditions)

    sink = SlowApi()
    sc, _ = _sidecar(sink)
    node = node_with(2, 1)
    sc.on_records(records_for(node))
    sc.on_state(node)
    blocking = True  # the API stops answering
    acked = threading.Thread(target=sc.on_ack, args=("node-a", LISTENER, sc.served_version), daemon=True)
    acked.start()
    acked.join(5)
    try:
        assert not acked.is_alive(), "on_ack waited for the API"
        assert sc.condition is not None and (sc.condition.status, sc.condition.reason) == ("True", "Accepted")
    finally:
        release.set()
    assert written(sink, sc).reason == "Accepted"
