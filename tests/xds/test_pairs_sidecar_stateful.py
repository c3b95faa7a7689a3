"""The pair machine as the sidecar wires it, under random histories (hypothesis): fetches (valid and bogus names),
fresh streams with random subscribe and held sets, sources and destinations leaving and returning, the clock.
No gRPC here: the hooks the ADS server calls (`on_first_request`, `on_demand`) are called directly
(tests/xds/test_pairs_wiring.py covers the server; tests/xds/test_pairs_stateful.py the machine's own rules).

Invariants after every step: the served snapshot holds exactly the twins of the machine's published pairs, each
with a load assignment under its own name; and the snapshot a fetch built on the fast path (`_add_twins`) is the
one a full reconcile of the same state builds (same version: nothing to push). Two negative controls break the
fast path (a twin built differently; a twin not added) and must be caught.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from aether.api.naming import quic_twin
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.xds.ads.cache import SnapshotCache
from aether.xds.pairs.values import PairConfig
from aether.xds.resources import CLUSTER, ENDPOINT, Resources, TranslateOptions
from aether.xds.sidecar.loop import Sidecar
from aether.xds.translate.eastwest.build import twins_for

NODE = "node-a"
PODS = {
    "client": SamplePod("u-client", "client-0", "10.200.1.2", "client", "/run/netns/s-client"),
    "other": SamplePod("u-other", "other-0", "10.200.1.3", "other", "/run/netns/s-other"),
}
DESTS = {
    "web": SampleDestination("default/web", "web-sa", (8080,), ("10.200.2.7",), vip="10.96.0.20"),
    "api": SampleDestination("default/api", "api-sa", (8080,), ("10.200.2.8",), vip="10.96.0.21"),
}
TWINS = tuple(quic_twin("default", d, sa) for d in DESTS for sa in PODS)
NAMES = (*TWINS, "quic:default/web@ghost", "quic:default/nowhere@client", "quic:bad")


class SidecarPairs(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = [1_000_000.0]
        self.pods = set(PODS)
        self.dests = set(DESTS)
        self.sidecar = Sidecar(
            NODE,
            SnapshotCache(),
            None,
            options=TranslateOptions(),
            path_exists=lambda _: True,
            pair_config=PairConfig(fetch_window_s=600),
            clock=lambda: self.clock[0],
        )
        self._apply()

    def _apply(self) -> None:
        node, records = sample_node(
            NODE, [PODS[p] for p in sorted(self.pods)], [DESTS[d] for d in sorted(self.dests)], dialled=False
        )
        self.sidecar.on_records(records)
        self.sidecar.on_state(node)

    @rule(name=st.sampled_from(NAMES))
    def fetch(self, name: str) -> None:
        self.sidecar.on_demand(NODE, CLUSTER, {name})

    @rule(subscribed=st.sets(st.sampled_from(NAMES), max_size=4), held=st.sets(st.sampled_from(TWINS), max_size=4))
    def fresh_stream(self, subscribed: set[str], held: set[str]) -> None:
        self.sidecar.on_first_request(NODE, 1, CLUSTER, frozenset(subscribed), frozenset(held | subscribed))

    @rule(pod=st.sampled_from(sorted(PODS)))
    def toggle_source(self, pod: str) -> None:
        self.pods ^= {pod}
        self._apply()

    @rule(dest=st.sampled_from(sorted(DESTS)))
    def toggle_destination(self, dest: str) -> None:
        self.dests ^= {dest}
        self._apply()

    @rule(seconds=st.sampled_from((1.0, 300.0, 700.0)))
    def tick(self, seconds: float) -> None:
        self.clock[0] += seconds
        self.sidecar.tick_pairs()

    @invariant()
    def snapshot_holds_exactly_the_published_twins(self) -> None:
        snap = self.sidecar.cache.get(NODE)
        assert snap is not None
        twins = {n for n in snap.versions.get(CLUSTER, {}) if n.startswith("quic:")}
        published = {p.twin for p in self.sidecar.pairs.published()}
        assert twins == published
        assert published <= set(snap.versions.get(ENDPOINT, {}))  # each with its own EDS name

    @invariant()
    def a_full_reconcile_changes_nothing(self) -> None:
        before = self.sidecar.cache.get(NODE)
        assert before is not None and self.sidecar.desired is not None
        self.sidecar.on_state(self.sidecar.desired)
        after = self.sidecar.cache.get(NODE)
        assert after is not None and after.version == before.version


def test_the_sidecars_pairs_under_random_histories() -> None:
    run_state_machine_as_test(
        SidecarPairs,
        settings=settings(
            max_examples=25, stateful_step_count=15, deadline=None, suppress_health_check=list(HealthCheck)
        ),
    )


def _fails(monkeypatch: pytest.MonkeyPatch, target: str, broken: Callable[..., Any]) -> None:
    monkeypatch.setattr(target, broken)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            SidecarPairs,
            settings=settings(
                max_examples=50, stateful_step_count=15, deadline=None, suppress_health_check=list(HealthCheck)
            ),
        )


def test_negative_control_a_fast_path_that_builds_a_different_twin_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = twins_for

    def drifted(*args: Any, **kw: Any) -> Resources:
        out = real(*args, **kw)
        for cluster in out.get(CLUSTER, {}).values():
            cluster["connectTimeout"] = "9s"  # not what the full translation builds
        return out

    _fails(monkeypatch, "aether.xds.sidecar.loop.twins_for", drifted)


def test_negative_control_a_fast_path_that_forgets_the_twin_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def forgets(self: Sidecar, decisions: list[Any]) -> bool:
        return True  # "handled", nothing added

    _fails(monkeypatch, "aether.xds.sidecar.loop.Sidecar._add_twins", forgets)
