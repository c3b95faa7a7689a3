"""Delta-xDS per-type state: wildcard vs explicit, initial versions, removals, NACK undo."""

from __future__ import annotations

from aether.xds.ads.delta import ABSENT, TypeState


def test_first_empty_request_is_wildcard_and_initial_versions_suppress_resends() -> None:
    ts = TypeState()
    ts.apply_request([], [], {"a": "1", "b": "old", "gone": "9"})
    assert ts.wildcard
    send, removed = ts.diff({"a": "1", "b": "2", "c": "3"})
    assert send == ["b", "c"]  # `a` is held at the same version: not re-sent
    assert removed == ["gone"]


def test_explicit_names_and_absent_answers() -> None:
    ts = TypeState()
    new = ts.apply_request(["x", "y"], [], {})
    assert new == {"x", "y"} and not ts.wildcard
    send, removed = ts.diff({"x": "1", "z": "2"})
    assert (send, removed) == (["x"], ["y"])  # y does not exist: answered removed once
    ts.record_sent("n1", "v", {"x": "1"}, ["y"])
    assert ts.known["y"] == ABSENT
    assert ts.diff({"x": "1", "z": "2"}) == ([], [])
    assert ts.diff({"x": "1", "y": "5"}) == (["y"], [])  # appears later: sent


def test_star_subscribe_and_unsubscribe() -> None:
    ts = TypeState()
    ts.apply_request(["*", "odcds-a"], [], {})
    assert ts.wildcard and ts.subscribed == {"odcds-a"}
    ts.apply_request([], ["*"], {})
    assert not ts.wildcard
    assert ts.diff({"odcds-a": "1", "other": "2"}) == (["odcds-a"], [])


def test_unsubscribe_forgets() -> None:
    ts = TypeState()
    ts.apply_request(["x"], [], {})
    ts.record_sent("n", "v", {"x": "1"}, [])
    ts.apply_request([], ["x"], {})
    assert ts.diff({"x": "1"}) == ([], [])


def test_nack_forgets_what_the_rejected_response_carried() -> None:
    ts = TypeState()
    ts.apply_request([], [], {"a": "1"})
    ts.record_sent("n1", "snap2", {"a": "2", "b": "1"}, [])
    sent = ts.nack("n1")
    assert sent is not None and sent.snapshot_version == "snap2"
    # after a rollback to the old snapshot, both are re-sent so Envoy converges to exactly that state
    assert ts.diff({"a": "1", "b": "1"}) == (["a", "b"], [])
    assert ts.ack("n1") is None
