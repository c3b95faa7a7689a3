"""The pair lifecycle's rules, one test (or a few) each, against the pure machine (aether.xds.pairs.machine)."""

from __future__ import annotations

import pytest

from aether.xds.pairs import machine
from aether.xds.pairs.machine import PairState, start, step
from aether.xds.pairs.values import (
    AbsentWhy,
    Admit,
    AnswerAbsent,
    ClockAdvanced,
    Decision,
    Dormant,
    Environment,
    EnvironmentChanged,
    Evidence,
    EvidenceKind,
    Fetched,
    Pair,
    PairConfig,
    Persist,
    PersistedPair,
    Prune,
    PruneCause,
    Publish,
    RefusalReason,
    Refuse,
    RemovalCause,
    SidecarStarted,
    StreamOpened,
    Withdraw,
)

T0 = 1_000_000.0
HOUR = 3600.0
CLIENT = Pair("shop/client", "shop/web")  # twin quic:shop/web@client
OTHER = Pair("team-b/default", "shop/web")  # twin quic:shop/web@team-b/default
ENV = Environment(sources=frozenset({"shop/client", "team-b/default"}), destinations=frozenset({"shop/web"}))


def env(
    sources: set[str] | None = None, destinations: set[str] | None = None, ineligible: frozenset[str] = frozenset()
) -> Environment:
    return Environment(
        frozenset(ENV.sources if sources is None else sources),
        frozenset(ENV.destinations if destinations is None else destinations),
        ineligible,
    )


def persisted(pair: Pair, evidence: Evidence | None = None) -> PersistedPair:
    return PersistedPair(pair.source, pair.destination, pair.twin, T0 - HOUR, evidence)


def boot(
    e: Environment = ENV,
    pairs: tuple[Pair, ...] = (),
    dormant: tuple[Pair, ...] = (),
    window: float = HOUR,
    stream: tuple[frozenset[str], frozenset[str]] | None = (frozenset(), frozenset()),
) -> PairState:
    """A started sidecar (with what it read from its MeshNode) and, unless `stream` is None, its first stream."""
    s = start(
        SidecarStarted(T0, e, tuple(map(persisted, pairs)), tuple(map(persisted, dormant)), PairConfig(window))
    ).state
    if stream is not None:
        s = step(s, StreamOpened(stream[0], stream[1], T0)).state
    return s


def fetch(s: PairState, *names: str, at: float = T0 + 1) -> tuple[PairState, tuple[Decision, ...]]:
    r = step(s, Fetched(frozenset(names), at))
    return r.state, r.decisions


def kinds(decisions: tuple[Decision, ...]) -> list[str]:
    return [type(d).__name__ for d in decisions]


# -- admission only on evidence ----------------------------------------------------------------------------------------


def test_a_fetch_admits_the_pair_and_publishes_twin_and_load_assignment() -> None:
    s, out = fetch(boot(), CLIENT.twin)
    assert out[:2] == (Admit(CLIENT, Evidence(EvidenceKind.FETCH, T0 + 1)), Publish(CLIENT))
    assert isinstance(out[2], Persist) and [p.twin for p in out[2].pairs] == ["quic:shop/web@client"]
    assert s.twins() == {"quic:shop/web@client"} and s.published() == {CLIENT}


def test_an_explicit_resubscription_on_a_fresh_stream_admits() -> None:
    s = boot(stream=None)
    r = step(s, StreamOpened(frozenset({CLIENT.twin}), frozenset({CLIENT.twin, "h2:shop/web"}), T0 + 2))
    assert r.decisions[:2] == (Admit(CLIENT, Evidence(EvidenceKind.RESUBSCRIBE, T0 + 2)), Publish(CLIENT))
    assert r.state.twins() == {CLIENT.twin}


def test_a_held_only_twin_admits_nothing_and_without_a_persisted_pair_is_answered_absent() -> None:
    """The migration case: a twin an earlier sidecar built up front, re-stated only as held."""
    s = boot(stream=None)
    r = step(s, StreamOpened(frozenset(), frozenset({CLIENT.twin, "h2:shop/web", "quic:junk"}), T0))
    assert r.decisions == (
        AnswerAbsent("quic:junk", AbsentWhy.HELD_ONLY),
        AnswerAbsent(CLIENT.twin, AbsentWhy.HELD_ONLY),
    )
    assert r.state.records == {} and r.state.twins() == frozenset()
    # the proxy drops it; the next request that routes to it is a first use
    _, out = fetch(r.state, CLIENT.twin)
    assert Admit(CLIENT, Evidence(EvidenceKind.FETCH, T0 + 1)) in out


def test_a_held_twin_of_a_persisted_pair_counts_as_used() -> None:
    s = boot(pairs=(CLIENT,), stream=(frozenset(), frozenset({CLIENT.twin})))
    assert s.records[CLIENT.twin].evidence == Evidence(EvidenceKind.HELD, T0)
    assert not s.records[CLIENT.twin].carried
    later = step(s, ClockAdvanced(T0 + 5 * HOUR))
    assert later.decisions == () and later.state.twins() == {CLIENT.twin}


# -- never answered absent while subscribed ---------------------------------------------------------------------------


def test_a_subscribed_twin_is_never_answered_absent() -> None:
    # the proxy re-subscribes a twin whose pair was never persisted (the write failed): admitted, not absent
    s = boot(stream=None)
    r = step(s, StreamOpened(frozenset({CLIENT.twin}), frozenset({CLIENT.twin}), T0))
    assert not any(isinstance(d, AnswerAbsent) for d in r.decisions)
    assert r.state.twins() == {CLIENT.twin}


def test_the_guard_never_lets_a_subscribed_name_be_answered_absent() -> None:
    s = boot(stream=(frozenset({CLIENT.twin}), frozenset()))
    w = machine._Work(s)
    assert not machine.never_absent_when_subscribed(w, CLIENT.twin)
    assert machine.never_absent_when_subscribed(w, OTHER.twin)


def test_a_refused_subscribed_name_is_admitted_on_its_fetch_when_it_passes_later() -> None:
    """A request raced the pod's arrival: the proxy will not ask again, so the fetch stays the evidence."""
    s = boot(e=env(sources=set()))
    s, out = fetch(s, CLIENT.twin)
    assert out == (Refuse(CLIENT.twin, RefusalReason.SOURCE_NOT_LOCAL),)
    r = step(s, EnvironmentChanged(ENV, T0 + 2))
    assert r.decisions[:2] == (Admit(CLIENT, Evidence(EvidenceKind.FETCH, T0 + 1)), Publish(CLIENT))


# -- carry-over and the fetch window ----------------------------------------------------------------------------------


def test_persisted_pairs_carry_over_a_sidecar_restart() -> None:
    s, _ = fetch(boot(), CLIENT.twin)
    s, _ = fetch(s, OTHER.twin)
    s = step(s, EnvironmentChanged(env(sources={"shop/client"}), T0 + 2)).state  # OTHER goes dormant
    saved = s.persist()
    again = start(SidecarStarted(T0 + 10, s.env, saved.pairs, saved.dormant))
    assert again.decisions[:2] == (Publish(CLIENT), Dormant(OTHER, RemovalCause.SOURCE_LEFT))
    assert again.state.twins() == s.twins() == {CLIENT.twin}
    assert again.state.persist() == saved and all(r.carried for r in again.state.records.values())


def test_the_fetch_window_prunes_a_persisted_pair_with_no_evidence_of_use() -> None:
    s = boot(pairs=(CLIENT,))
    assert step(s, ClockAdvanced(T0 + HOUR - 1)).decisions == ()
    r = step(s, ClockAdvanced(T0 + HOUR))
    assert r.decisions == (
        Withdraw(CLIENT, PruneCause.FETCH_WINDOW),
        Prune(CLIENT, PruneCause.FETCH_WINDOW),
        Persist((), ()),
    )
    assert r.state.twins() == frozenset()


@pytest.mark.parametrize(
    "evidence",
    [
        StreamOpened(frozenset({CLIENT.twin}), frozenset(), T0 + 5),  # re-subscribed
        StreamOpened(frozenset(), frozenset({CLIENT.twin}), T0 + 5),  # held
        Fetched(frozenset({CLIENT.twin}), T0 + 5),  # fetched (a new proxy generation's first request)
    ],
)
def test_any_evidence_within_the_window_keeps_a_persisted_pair(
    evidence: StreamOpened | Fetched,
) -> None:
    s = step(boot(pairs=(CLIENT,)), evidence).state
    assert step(s, ClockAdvanced(T0 + 10 * HOUR)).state.twins() == {CLIENT.twin}


def test_the_window_is_configurable() -> None:
    s = boot(pairs=(CLIENT,), window=60.0)
    assert kinds(step(s, ClockAdvanced(T0 + 60)).decisions) == ["Withdraw", "Prune", "Persist"]


def test_pairs_have_no_idle_expiry() -> None:
    s, _ = fetch(boot(), CLIENT.twin)
    r = step(s, ClockAdvanced(T0 + 1000 * HOUR))
    assert r.decisions == () and r.state.twins() == {CLIENT.twin}


def test_the_fetch_window_never_prunes_a_dormant_pair() -> None:
    s = boot(e=env(sources=set()), dormant=(CLIENT,), stream=None)
    r = step(s, ClockAdvanced(T0 + 5 * HOUR))
    assert r.decisions == () and CLIENT.twin in r.state.records
    # the next fresh stream decides: not re-subscribed, pruned
    r = step(r.state, StreamOpened(frozenset(), frozenset(), T0 + 5 * HOUR))
    assert r.decisions[0] == Prune(CLIENT, PruneCause.NOT_RESUBSCRIBED)


# -- removal evidence, dormancy, revival ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("after", "cause"),
    [
        (env(sources={"team-b/default"}), RemovalCause.SOURCE_LEFT),
        (env(destinations=set()), RemovalCause.DESTINATION_LEFT),
        (env(destinations=set(), ineligible=frozenset({"shop/web"})), RemovalCause.DESTINATION_INELIGIBLE),
    ],
)
def test_removal_evidence_makes_a_subscribed_pair_dormant(after: Environment, cause: RemovalCause) -> None:
    s, _ = fetch(boot(), CLIENT.twin)
    r = step(s, EnvironmentChanged(after, T0 + 2))
    assert r.decisions[:2] == (Withdraw(CLIENT, machine.DORMANT), Dormant(CLIENT, cause))
    assert r.decisions[2] == Persist((), (r.state.persist().dormant[0],))
    assert r.state.twins() == frozenset() and r.state.dormant(CLIENT.twin)


def test_removal_evidence_drops_a_pair_that_is_not_subscribed() -> None:
    s = boot(pairs=(CLIENT,), stream=(frozenset(), frozenset({CLIENT.twin})))  # held only (wildcard)
    r = step(s, EnvironmentChanged(env(destinations=set()), T0 + 2))
    assert r.decisions[:2] == (
        Withdraw(CLIENT, PruneCause.DESTINATION_LEFT),
        Prune(CLIENT, PruneCause.DESTINATION_LEFT),
    )
    assert r.state.records == {}


def test_removal_before_the_first_stream_is_dormant_because_subscriptions_are_unknown() -> None:
    s = boot(pairs=(CLIENT,), stream=None)
    r = step(s, EnvironmentChanged(env(sources=set()), T0 + 2))
    assert kinds(r.decisions) == ["Withdraw", "Dormant", "Persist"]


def test_a_dormant_pair_is_republished_with_no_request_when_the_source_returns() -> None:
    s, _ = fetch(boot(), CLIENT.twin)
    s = step(s, EnvironmentChanged(env(sources=set()), T0 + 2)).state
    r = step(s, EnvironmentChanged(ENV, T0 + 3))
    assert r.decisions[0] == Publish(CLIENT) and not any(isinstance(d, Admit) for d in r.decisions)
    assert r.state.twins() == {CLIENT.twin}
    persisted = r.decisions[1]
    assert isinstance(persisted, Persist)
    assert [p.twin for p in persisted.pairs] == [CLIENT.twin]


def test_a_dormant_pair_is_pruned_when_a_fresh_stream_does_not_resubscribe_it() -> None:
    s, _ = fetch(boot(), CLIENT.twin)
    s = step(s, EnvironmentChanged(env(sources=set()), T0 + 2)).state
    r = step(s, StreamOpened(frozenset(), frozenset(), T0 + 3))  # a new proxy generation holds nothing
    assert r.decisions == (Prune(CLIENT, PruneCause.NOT_RESUBSCRIBED), Persist((), ()))


def test_a_dormant_pair_a_fresh_stream_resubscribes_stays_dormant() -> None:
    s, _ = fetch(boot(), CLIENT.twin)
    s = step(s, EnvironmentChanged(env(sources=set()), T0 + 2)).state
    r = step(s, StreamOpened(frozenset({CLIENT.twin}), frozenset(), T0 + 3))
    assert r.state.dormant(CLIENT.twin) and r.state.twins() == frozenset()
    assert not any(isinstance(d, Prune | AnswerAbsent | Refuse) for d in r.decisions)


def test_active_pairs_survive_a_new_proxy_generation() -> None:
    s, _ = fetch(boot(), CLIENT.twin)
    r = step(s, StreamOpened(frozenset(), frozenset(), T0 + 3))
    assert r.decisions == () and r.state.twins() == {CLIENT.twin}  # the wildcard delivers it again


# -- refusals -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "e", "reason"),
    [
        ("quic:shop/web", ENV, RefusalReason.MALFORMED_NAME),
        ("h2:shop/web", ENV, RefusalReason.MALFORMED_NAME),
        ("quic:shop/web@shop/client", ENV, RefusalReason.MALFORMED_NAME),
        ("quic:shop/web@ghost", ENV, RefusalReason.SOURCE_NOT_LOCAL),
        ("quic:shop/db@client", ENV, RefusalReason.DESTINATION_NOT_A_DEPENDENCY),
        ("quic:shop/db@client", env(ineligible=frozenset({"shop/db"})), RefusalReason.DESTINATION_INELIGIBLE),
    ],
)
def test_a_name_failing_the_check_is_refused_with_its_reason_and_nothing_else_changes(
    name: str, e: Environment, reason: RefusalReason
) -> None:
    s = step(boot(), EnvironmentChanged(e, T0)).state
    s, _ = fetch(s, OTHER.twin)
    s2, out = fetch(s, name, CLIENT.twin, at=T0 + 2)
    assert Refuse(name, reason) in out
    assert Admit(CLIENT, Evidence(EvidenceKind.FETCH, T0 + 2)) in out
    assert s2.twins() == {OTHER.twin, CLIENT.twin}


def test_a_fetch_for_a_dormant_twin_is_refused_and_the_pair_kept() -> None:
    s, _ = fetch(boot(), CLIENT.twin)
    s = step(s, EnvironmentChanged(env(sources={"team-b/default"}), T0 + 2)).state
    s2, out = fetch(s, CLIENT.twin, at=T0 + 3)
    assert out[0] == Refuse(CLIENT.twin, RefusalReason.SOURCE_NOT_LOCAL)
    assert s2.dormant(CLIENT.twin) and s2.records[CLIENT.twin].evidence == Evidence(EvidenceKind.FETCH, T0 + 3)


def test_a_persisted_record_whose_names_do_not_make_its_twin_is_pruned() -> None:
    bad = PersistedPair("shop/client", "shop/web", "quic:shop/other@client", T0)
    r = start(SidecarStarted(T0, ENV, (bad,)))
    assert r.decisions == (Prune(CLIENT, PruneCause.MALFORMED_RECORD),)
    assert r.state.records == {}


def test_steps_never_change_the_state_they_were_given() -> None:
    s, _ = fetch(boot(), CLIENT.twin)
    before = (dict(s.records), s.subscribed, dict(s.refused), s.env, s.now)
    step(s, EnvironmentChanged(env(sources=set()), T0 + 2))
    step(s, StreamOpened(frozenset(), frozenset(), T0 + 3))
    step(s, Fetched(frozenset({"quic:shop/web@ghost"}), T0 + 4))
    assert (dict(s.records), s.subscribed, dict(s.refused), s.env, s.now) == before
    with pytest.raises(TypeError):
        s.records["x"] = s.records[CLIENT.twin]  # type: ignore[index]  # the point: the state's mapping is read-only
