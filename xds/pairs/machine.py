"""The pair state machine: `start(SidecarStarted)` and `step(state, event)`, each giving a `Step` (the new state and
the decisions, in order). Pure: the caller owns the clock, the ADS streams, the snapshot and the MeshNode writes.

The rules (issue #12, docs/pairs.md), each a function below and named where it applies:
- `admission_on_evidence`: a pair is admitted only on evidence that a request routed to its twin: an on-demand
  fetch, or an explicit re-subscription on a fresh stream; never because a stream says it holds the twin.
- `held_only`: a twin a fresh stream only holds (wildcard) admits nothing; unless its pair is persisted it is
  answered absent (the proxy drops it; the next request that routes to it is a first use). A held twin of a
  persisted pair counts as used.
- `never_absent_when_subscribed`: a twin the proxy holds an ODCDS subscription for is never answered absent (only a
  refusal, a name that fails the check, is; and a refused name that later passes is admitted on its fetch).
- `carry_over` and `window_may_prune`: persisted pairs carry over a sidecar restart; one with no evidence of use
  (fetch, re-subscription, held) within the fetch window of the sidecar starting is pruned. Never a dormant one.
- `removal_keeps_dormant`: removal evidence makes a pair whose twin is subscribed dormant (twin withdrawn, pair kept) and
  drops one that is not; while this process has seen no stream yet the subscriptions are unknown: dormant.
- `revive`: a dormant pair whose source and destination are back is republished with no request.
- `dormant_not_resubscribed`: a dormant pair is pruned only when a fresh stream's first CDS request does not
  re-subscribe it.
- `check` (values.py): a name that fails the check is refused with a reason; other pairs are unaffected.
- No idle expiry: nothing but the fetch window prunes on time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType

from aether.xds.pairs.values import (
    AbsentWhy,
    Admit,
    AnswerAbsent,
    ClockAdvanced,
    Decision,
    Dormant,
    Environment,
    EnvironmentChanged,
    Event,
    Evidence,
    EvidenceKind,
    Fetched,
    Pair,
    PairConfig,
    PairRecord,
    Persist,
    Prune,
    PruneCause,
    Publish,
    RefusalReason,
    Refuse,
    RemovalCause,
    SidecarStarted,
    StreamOpened,
    Withdraw,
    check,
    is_twin_name,
    parse_pair,
    persist_view,
)

DORMANT = "Dormant"  # Withdraw.why when the pair goes dormant


@dataclass(frozen=True)
class PairState:
    config: PairConfig
    started_at: float
    now: float
    env: Environment
    records: Mapping[str, PairRecord]  # by twin name: every admitted pair, dormant ones included
    # The twins the proxy holds an ODCDS subscription for: what it fetched on the current stream plus what that
    # stream's first CDS request re-subscribed. None: this process has seen no stream yet (unknown).
    subscribed: frozenset[str] | None = None
    held: frozenset[str] = frozenset()  # what the current stream's first CDS request said it holds
    # Subscribed names that failed the check, with the evidence that subscribed them (not persisted: a fresh
    # stream re-states them).
    refused: Mapping[str, Evidence] = field(default_factory=lambda: MappingProxyType({}))

    def dormant(self, twin: str) -> bool:
        return twin in self.records and not self.env.valid(self.records[twin].pair)

    def published(self) -> frozenset[Pair]:
        """The pairs whose twin (and load assignment) the snapshot holds: admitted and not dormant."""
        return frozenset(r.pair for r in self.records.values() if self.env.valid(r.pair))

    def twins(self) -> frozenset[str]:
        return frozenset(p.twin for p in self.published())

    def persist(self) -> Persist:
        return self._persist

    @cached_property
    def _persist(self) -> Persist:  # computed once per state (the state is frozen)
        return persist_view(self.records, self.env)

    def is_subscribed(self, twin: str) -> bool:
        """Whether the proxy may hold an ODCDS subscription for `twin` (unknown counts as yes)."""
        return self.subscribed is None or twin in self.subscribed


@dataclass(frozen=True)
class Step:
    state: PairState
    decisions: tuple[Decision, ...]


class _Work:
    """One step's scratch space: a mutable copy that is frozen again by `done` (never escapes this module)."""

    def __init__(self, state: PairState) -> None:
        self.base = state
        self.records = dict(state.records)
        self.refused = dict(state.refused)
        self.subscribed = state.subscribed
        self.held = state.held
        self.env = state.env
        self.now = state.now
        self.out: list[Decision] = []
        self.dirty = False  # records changed: the persisted view may have

    def valid(self, pair: Pair) -> bool:
        return self.env.valid(pair)

    def is_subscribed(self, twin: str) -> bool:
        """Whether the proxy may hold an ODCDS subscription for `twin`: unknown (no stream yet) counts as yes."""
        return self.subscribed is None or twin in self.subscribed

    def admit(self, pair: Pair, evidence: Evidence) -> None:
        if evidence.kind not in admission_on_evidence():
            raise ValueError(f"{pair.twin}: {evidence.kind} is no evidence that a request routed to the twin")
        self.dirty = True
        self.records[pair.twin] = PairRecord(pair, self.now, evidence, admitted=evidence.kind)
        self.refused.pop(pair.twin, None)
        self.out.append(Admit(pair, evidence))
        if self.valid(pair):
            self.out.append(Publish(pair))

    def used(self, twin: str, evidence: Evidence) -> None:
        self.dirty = True
        self.records[twin] = replace(self.records[twin], evidence=evidence, carried=False)

    def prune(self, twin: str, cause: PruneCause) -> None:
        self.dirty = True
        record = self.records.pop(twin)
        if self.valid(record.pair):
            self.out.append(Withdraw(record.pair, cause))
        self.out.append(Prune(record.pair, cause))

    def refuse(self, name: str, reason: RefusalReason, evidence: Evidence) -> None:
        self.out.append(Refuse(name, reason))
        if reason is not RefusalReason.MALFORMED_NAME and name not in self.records:
            self.refused[name] = evidence

    def done(self) -> Step:
        state = PairState(
            config=self.base.config,
            started_at=self.base.started_at,
            now=self.now,
            env=self.env,
            records=MappingProxyType(self.records),
            subscribed=self.subscribed,
            held=self.held,
            refused=MappingProxyType(self.refused),
        )
        if self.dirty or self.env != self.base.env:
            before, after = self.base.persist(), state.persist()
            if after != before:
                self.out.append(after)
        return Step(state, tuple(self.out))


# -- the rules -------------------------------------------------------------------------------------------------------


def admission_on_evidence() -> frozenset[EvidenceKind]:
    """Rule: the evidence kinds that admit a pair (a request routed to the twin). HELD is not one of them."""
    return frozenset({EvidenceKind.FETCH, EvidenceKind.RESUBSCRIBE})


def held_only(w: _Work, name: str) -> None:
    """Rule: a twin a fresh stream holds without subscribing it admits nothing; a persisted (admitted, live) pair's
    held twin counts as used; any other held twin is answered absent."""
    record = w.records.get(name)
    if record is not None and w.valid(record.pair):
        w.used(name, Evidence(EvidenceKind.HELD, w.now))
        return
    if never_absent_when_subscribed(w, name):
        w.out.append(AnswerAbsent(name, AbsentWhy.HELD_ONLY))


def never_absent_when_subscribed(w: _Work, name: str) -> bool:
    """Rule: nothing the proxy holds an ODCDS subscription for is answered absent (a refusal aside: its name fails
    the check). The guard before every AnswerAbsent: True when `name` may be answered absent."""
    return not (w.subscribed is not None and name in w.subscribed)


def window_may_prune(record: PairRecord, dormant: bool) -> bool:
    """Rule: once the fetch window of the sidecar start has passed, a carried pair with no evidence of use in this
    process is pruned, unless it is dormant (a dormant pair waits for the next fresh stream)."""
    return record.carried and not dormant


def removal_keeps_dormant(subscribed: bool) -> bool:
    """Rule: removal evidence on a pair whose twin is (or may be) subscribed makes it dormant; otherwise it is
    dropped."""
    return subscribed


def revive(w: _Work, was: Environment) -> None:
    """Rule: a dormant pair whose source and destination are both back is republished, with no request."""
    for twin in sorted(w.records):
        pair = w.records[twin].pair
        if not was.valid(pair) and w.valid(pair):
            w.out.append(Publish(pair))


def dormant_not_resubscribed(w: _Work, subscribed: frozenset[str]) -> None:
    """Rule: on a fresh stream, a dormant pair its first CDS request does not re-subscribe is pruned."""
    for twin in sorted(w.records):
        if not w.valid(w.records[twin].pair) and twin not in subscribed:
            w.prune(twin, PruneCause.NOT_RESUBSCRIBED)


def apply_removal(w: _Work, was: Environment) -> None:
    """Removal evidence on every pair that could be served under `was` and cannot now (see `removal_keeps_dormant`)."""
    for twin in sorted(w.records):
        pair = w.records[twin].pair
        cause = w.env.removal_cause(pair)
        if cause is None or not was.valid(pair):
            continue
        if removal_keeps_dormant(w.is_subscribed(twin)):
            w.out.append(Withdraw(pair, DORMANT))
            w.out.append(Dormant(pair, cause))
        else:
            record = w.records.pop(twin)
            w.out.append(Withdraw(record.pair, _prune_cause(cause)))
            w.out.append(Prune(record.pair, _prune_cause(cause)))


def _prune_cause(cause: RemovalCause) -> PruneCause:
    return PruneCause(cause.value)


def admit_refused_now_valid(w: _Work) -> None:
    """A subscribed name refused earlier (source or destination not there yet) that now passes the check is
    admitted on the evidence that subscribed it: the proxy will never ask again on this stream."""
    for name in sorted(w.refused):
        verdict = check(name, w.env)
        if isinstance(verdict, Pair):
            w.admit(verdict, w.refused[name])


def advance(w: _Work, at: float, coming: Environment | None = None) -> None:
    """The clock (never backwards); past the fetch window, `window_may_prune` decides for each carried pair. A pair
    the event being stepped makes dormant (`coming`: its new environment) counts as dormant already: the window
    never prunes a pair in the step that takes its destination or source away."""
    w.now = max(w.now, at)
    if w.now < w.base.started_at + w.base.config.fetch_window_s:
        return
    for twin in sorted(w.records):
        record = w.records[twin]
        dormant = not w.valid(record.pair) or (coming is not None and not coming.valid(record.pair))
        if window_may_prune(record, dormant):
            w.prune(twin, PruneCause.FETCH_WINDOW)


def judge_subscribed(w: _Work, name: str, evidence: Evidence) -> None:
    """A name the proxy subscribed (fetch, or re-subscription): evidence for an existing pair, else the check."""
    if not is_twin_name(name):
        w.refuse(name, RefusalReason.MALFORMED_NAME, evidence)
        return
    record = w.records.get(name)
    if record is not None:
        w.used(name, evidence)
        if not w.valid(record.pair):  # dormant: it stays so; a fetch for it is refused (its check fails)
            verdict = check(name, w.env)
            if evidence.kind is EvidenceKind.FETCH and not isinstance(verdict, Pair):
                w.out.append(Refuse(name, verdict))
        return
    verdict = check(name, w.env)
    if isinstance(verdict, Pair):
        w.admit(verdict, evidence)
    else:
        w.refuse(name, verdict, evidence)


# -- entry points ----------------------------------------------------------------------------------------------------


def carry_over(event: SidecarStarted) -> Step:
    """Rule: the persisted pairs and dormant pairs carry over (carried: the fetch window applies to them); whatever
    the environment says now decides which are published; the subscriptions are unknown until the first stream."""
    empty = PairState(event.config, event.at, event.at, event.env, MappingProxyType({}))
    w = _Work(empty)
    w.dirty = True
    for p in (*event.pairs, *event.dormant):
        pair = parse_pair(p.twin)
        if pair is None or pair != (p.source, p.destination):
            w.out.append(Prune(Pair(p.source, p.destination), PruneCause.MALFORMED_RECORD))
            continue
        w.records.setdefault(p.twin, PairRecord(pair, p.since, p.evidence, carried=True, admitted=p.admitted))
    for twin in sorted(w.records):
        pair = w.records[twin].pair
        if w.valid(pair):
            w.out.append(Publish(pair))
        else:
            cause = w.env.removal_cause(pair)
            assert cause is not None
            w.out.append(Dormant(pair, cause))
    return w.done()


def start(event: SidecarStarted) -> Step:
    return carry_over(event)


def step(state: PairState, event: Event) -> Step:
    w = _Work(state)
    advance(w, event.at, event.env if isinstance(event, EnvironmentChanged) else None)
    match event:
        case Fetched(names=names):
            if w.subscribed is not None:
                w.subscribed = w.subscribed | names
            for name in sorted(names):
                judge_subscribed(w, name, Evidence(EvidenceKind.FETCH, w.now))
        case StreamOpened(subscribed=subscribed, held=held):
            w.subscribed, w.held, w.refused = subscribed, held, {}
            dormant_not_resubscribed(w, subscribed)
            for name in sorted(subscribed):
                judge_subscribed(w, name, Evidence(EvidenceKind.RESUBSCRIBE, w.now))
            for name in sorted(n for n in held - subscribed if is_twin_name(n)):
                held_only(w, name)
        case EnvironmentChanged(env=env):
            was, w.env = w.env, env
            apply_removal(w, was)
            revive(w, was)
            admit_refused_now_valid(w)
        case ClockAdvanced():
            pass
    return w.done()


def run(state: PairState, events: Iterable[Event]) -> tuple[PairState, list[Decision]]:
    """Several events in order (tests, replays): the final state and every decision."""
    out: list[Decision] = []
    for event in events:
        s = step(state, event)
        state = s.state
        out += s.decisions
    return state, out
