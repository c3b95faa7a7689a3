"""`PairKeeper`: the thin shell around the pair machine. It owns the state, turns the ADS server's stream events
into machine events, logs and counts the decisions (admissions by evidence, refusals by reason, prunes by cause,
the pair gauges), and hands every `Persist` to its `persist` callback.

Not thread-safe by itself: the sidecar calls it under its one lock, so steps are serialized and each one's
snapshot is installed before the request that caused it is answered. Events that arrive before `start` (a proxy
that connects before the sidecar has read its MeshNode) are kept and applied, in order, right after it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aether.metrics import (
    QUIC_DORMANT_PAIRS,
    QUIC_PAIR_ADMISSIONS,
    QUIC_PAIR_PRUNES,
    QUIC_PAIR_REFUSALS,
    QUIC_PAIRS,
)
from aether.xds.pairs.machine import PairState, start, step
from aether.xds.pairs.values import (
    Admit,
    AnswerAbsent,
    ClockAdvanced,
    Decision,
    Dormant,
    Environment,
    EnvironmentChanged,
    Event,
    Fetched,
    Pair,
    PairConfig,
    Persist,
    PersistedPair,
    Prune,
    Refuse,
    SidecarStarted,
    StreamOpened,
    is_twin_name,
)

log = logging.getLogger("aether.xds.pairs")


class PairKeeper:
    def __init__(
        self,
        config: PairConfig | None = None,
        clock: Callable[[], float] = time.time,
        persist: Callable[[Persist], None] | None = None,
    ) -> None:
        self.config = config or PairConfig()
        self.clock = clock
        self.persist = persist
        self.state: PairState | None = None
        self._early: list[Event] = []

    @property
    def started(self) -> bool:
        return self.state is not None

    def published(self) -> frozenset[Pair]:
        return self.state.published() if self.state is not None else frozenset()

    def start(
        self, env: Environment, pairs: tuple[PersistedPair, ...], dormant: tuple[PersistedPair, ...]
    ) -> list[Decision]:
        s = start(SidecarStarted(self.clock(), env, pairs, dormant, self.config))
        self.state = s.state
        log.info(
            "QUIC pairs: started with %d stored pairs and %d dormant; fetch window %.0f s",
            len(pairs),
            len(dormant),
            self.config.fetch_window_s,
        )
        out = self._note(s.decisions, initial=True)
        early, self._early = self._early, []
        for event in early:
            out += self.apply(event)
        return out

    def apply(self, event: Event) -> list[Decision]:
        if self.state is None:
            if isinstance(event, StreamOpened | Fetched):
                self._early.append(event)
            return []
        s = step(self.state, event)
        self.state = s.state
        return self._note(s.decisions)

    def stream_opened(self, subscribed: frozenset[str], held: frozenset[str]) -> list[Decision]:
        twins = frozenset(n for n in subscribed if is_twin_name(n))
        log.info(
            "QUIC pairs: fresh CDS stream re-subscribes %d twins, holds %d clusters (%d twins)",
            len(twins),
            len(held),
            sum(1 for n in held if is_twin_name(n)),
        )
        return self.apply(StreamOpened(subscribed, held, self.clock()))

    def fetched(self, names: frozenset[str]) -> list[Decision]:
        return self.apply(Fetched(names, self.clock()))

    def environment(self, env: Environment) -> list[Decision]:
        if self.state is None or self.state.env == env:
            return []
        return self.apply(EnvironmentChanged(env, self.clock()))

    def tick(self) -> list[Decision]:
        return self.apply(ClockAdvanced(self.clock())) if self.state is not None else []

    def _note(self, decisions: tuple[Decision, ...], initial: bool = False) -> list[Decision]:
        for d in decisions:
            match d:
                case Admit(pair=pair, evidence=evidence):
                    QUIC_PAIR_ADMISSIONS.labels(evidence=evidence.kind.value).inc()
                    log.info("QUIC pair admitted on %s: %s -> %s (twin %s)", evidence.kind, *pair, pair.twin)
                case Refuse(name=name, reason=reason):
                    QUIC_PAIR_REFUSALS.labels(reason=reason.value).inc()
                    log.warning("QUIC twin %s refused (answered absent): %s", name, reason)
                case Prune(pair=pair, cause=cause):
                    QUIC_PAIR_PRUNES.labels(cause=cause.value).inc()
                    log.info("QUIC pair pruned (%s): %s -> %s, twin %s withdrawn", cause, *pair, pair.twin)
                case Dormant(pair=pair, cause=cause):
                    log.info("QUIC pair dormant (%s): %s -> %s, twin %s withdrawn, pair kept", cause, *pair, pair.twin)
                case AnswerAbsent(name=name, why=why):
                    log.info("QUIC twin %s answered absent (%s): no stored pair; its next use fetches it", name, why)
                case Persist() if self.persist is not None:
                    self.persist(d)
        if self.state is not None:
            view = self.state.persist()
            QUIC_PAIRS.set(len(view.pairs))
            QUIC_DORMANT_PAIRS.set(len(view.dormant))
            if initial and self.persist is not None and not any(isinstance(d, Persist) for d in decisions):
                self.persist(view)  # a start writes what it kept (counts, and the PairsPersisted condition)
        return list(decisions)
