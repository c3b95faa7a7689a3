"""The values of the pair lifecycle: pairs and their records, the environment a twin name is checked against, the
events the machine takes and the decisions it gives back. Immutable (NamedTuples, frozen dataclasses, frozensets).

Names as the MeshNode spells them: a source is `<namespace>/<serviceaccount>` (the wiring turns it into the SPIFFE ID
that `status.quic.pairs[].source` carries), a destination `<namespace>/<service>`; a pair's twin is
`aether.api.naming.quic_twin` of the two. Times are seconds (the caller's clock, wall time: they are persisted).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import NamedTuple

from aether.api.naming import QUIC_TWIN_PREFIX, parse_quic_twin, quic_twin, ref

DEFAULT_FETCH_WINDOW_S = 3600.0  # --quic-pair-fetch-window


class Pair(NamedTuple):
    source: str  # <namespace>/<serviceaccount>
    destination: str  # <namespace>/<service>

    @property
    def twin(self) -> str:
        src_ns, _, sa = self.source.partition("/")
        ns, _, svc = self.destination.partition("/")
        return quic_twin(ns, svc, sa, src_ns)


def is_twin_name(name: str) -> bool:
    """Whether a CDS name is one of ours to judge (every other cluster name is left alone)."""
    return name.startswith(QUIC_TWIN_PREFIX)


class EvidenceKind(StrEnum):
    FETCH = "Fetch"  # the proxy asked for the twin on demand (a request routed to it)
    RESUBSCRIBE = "Resubscribe"  # a fresh stream's first CDS request subscribed it by name (an open ODCDS subscription)
    HELD = "Held"  # a fresh stream said it holds the twin (initial_resource_versions): counts as use, admits nothing


class Evidence(NamedTuple):
    kind: EvidenceKind
    at: float


class RefusalReason(StrEnum):
    MALFORMED_NAME = "MalformedName"
    SOURCE_NOT_LOCAL = "SourceNotLocal"  # no pod of that ServiceAccount on the node
    DESTINATION_INELIGIBLE = "DestinationIneligible"  # known to the node, not QUIC-eligible
    DESTINATION_NOT_A_DEPENDENCY = "DestinationNotADependency"  # not in the node's dependency set


class RemovalCause(StrEnum):
    """Removal evidence: why a pair's twin can no longer be served."""

    SOURCE_LEFT = "SourceLeft"
    DESTINATION_INELIGIBLE = "DestinationIneligible"
    DESTINATION_LEFT = "DestinationLeft"


class PruneCause(StrEnum):
    FETCH_WINDOW = "FetchWindow"  # persisted, no evidence of use within the fetch window of the sidecar starting
    NOT_RESUBSCRIBED = "NotResubscribed"  # dormant, and a fresh stream's first CDS request did not re-subscribe it
    SOURCE_LEFT = "SourceLeft"  # removal evidence on a pair the proxy holds no subscription for
    DESTINATION_INELIGIBLE = "DestinationIneligible"
    DESTINATION_LEFT = "DestinationLeft"
    MALFORMED_RECORD = "MalformedRecord"  # a persisted pair whose names do not make its twin


class AbsentWhy(StrEnum):
    HELD_ONLY = "HeldOnly"  # held through the wildcard, never subscribed, no persisted pair


@dataclass(frozen=True)
class Environment:
    """What a twin name is checked against: the node's local identities and its QUIC-eligible destinations."""

    sources: frozenset[str] = frozenset()  # <ns>/<sa> of every ServiceAccount with a pod on the node
    destinations: frozenset[str] = frozenset()  # <ns>/<svc>: QUIC-eligible and in the node's dependency set
    ineligible: frozenset[str] = frozenset()  # <ns>/<svc> the node depends on that are not QUIC-eligible

    def valid(self, pair: Pair) -> bool:
        return pair.source in self.sources and pair.destination in self.destinations

    def removal_cause(self, pair: Pair) -> RemovalCause | None:
        """None while the pair can be served; else the removal evidence. `check` asks the same, of a new name."""
        if pair.destination in self.ineligible:
            return RemovalCause.DESTINATION_INELIGIBLE
        if pair.destination not in self.destinations:
            return RemovalCause.DESTINATION_LEFT
        if pair.source not in self.sources:
            return RemovalCause.SOURCE_LEFT
        return None


# a pair's removal cause as the admission check's refusal of its twin name (the same check, said of a new name)
REFUSAL_OF_REMOVAL = {
    RemovalCause.DESTINATION_INELIGIBLE: RefusalReason.DESTINATION_INELIGIBLE,
    RemovalCause.DESTINATION_LEFT: RefusalReason.DESTINATION_NOT_A_DEPENDENCY,
    RemovalCause.SOURCE_LEFT: RefusalReason.SOURCE_NOT_LOCAL,
}


def parse_pair(name: str) -> Pair | None:
    """The pair a twin name stands for, or None for a malformed name."""
    try:
        t = parse_quic_twin(name)
    except ValueError:
        return None
    return Pair(ref(t.source_namespace, t.source_sa), ref(t.namespace, t.service))


def check(name: str, env: Environment) -> Pair | RefusalReason:
    """The admission check of a twin name: well formed, destination eligible and a dependency, source local."""
    pair = parse_pair(name)
    if pair is None:
        return RefusalReason.MALFORMED_NAME
    cause = env.removal_cause(pair)
    return pair if cause is None else REFUSAL_OF_REMOVAL[cause]


@dataclass(frozen=True)
class PairRecord:
    """An admitted pair. `carried`: loaded from the MeshNode at sidecar start and not yet seen used by this process."""

    pair: Pair
    since: float
    evidence: Evidence | None  # the last evidence of use
    carried: bool = False
    admitted: EvidenceKind | None = None  # the evidence that admitted it (None: unknown, e.g. an older record)

    @cached_property
    def stored(self) -> PersistedPair:
        """The record as persisted (made once per record: an unchanged record is the same object in every state)."""
        p = self.pair
        return PersistedPair(p.source, p.destination, p.twin, self.since, self.evidence, self.admitted)


@dataclass(frozen=True)
class PersistedPair:
    """A pair as `status.quic.pairs` / `dormantPairs` carry it (the wiring maps QuicPair to and from this)."""

    source: str
    destination: str
    twin: str
    since: float
    evidence: Evidence | None = None  # the last evidence of use (`lastEvidence`)
    admitted: EvidenceKind | None = None  # how it was admitted (`evidence`)


@dataclass(frozen=True)
class PairConfig:
    fetch_window_s: float = DEFAULT_FETCH_WINDOW_S


# -- events in -------------------------------------------------------------------------------------------------------


class SidecarStarted(NamedTuple):
    """The sidecar process starts: what it reads from its MeshNode (pairs and dormant pairs) and the environment."""

    at: float
    env: Environment
    pairs: tuple[PersistedPair, ...] = ()
    dormant: tuple[PersistedPair, ...] = ()
    config: PairConfig = PairConfig()


class Fetched(NamedTuple):
    """On-demand CDS: the proxy subscribed these names on the live stream (the ADS server's `on_demand` hook)."""

    names: frozenset[str]
    at: float


class StreamOpened(NamedTuple):
    """A fresh ADS stream's first CDS request: its explicit subscribe set (without `*`) and the names its
    `initial_resource_versions` say it holds (every cluster; the machine looks at twin names only)."""

    subscribed: frozenset[str]
    held: frozenset[str]
    at: float


class EnvironmentChanged(NamedTuple):
    env: Environment
    at: float


class ClockAdvanced(NamedTuple):
    at: float


Event = Fetched | StreamOpened | EnvironmentChanged | ClockAdvanced


# -- decisions out ---------------------------------------------------------------------------------------------------


class Admit(NamedTuple):
    pair: Pair
    evidence: Evidence


class Publish(NamedTuple):
    """The twin and its load assignment (EDS name: the twin's name) enter the snapshot, together."""

    pair: Pair


class Withdraw(NamedTuple):
    """The twin and its load assignment leave the snapshot (`why`: going dormant, or the prune cause)."""

    pair: Pair
    why: str


class Dormant(NamedTuple):
    """Removal evidence on a pair whose twin the proxy holds an ODCDS subscription for: kept, twin withdrawn."""

    pair: Pair
    cause: RemovalCause


class Prune(NamedTuple):
    pair: Pair
    cause: PruneCause


class Refuse(NamedTuple):
    """The name fails the check: answered absent, logged and counted by reason; nothing else changes."""

    name: str
    reason: RefusalReason


class AnswerAbsent(NamedTuple):
    name: str
    why: AbsentWhy


class Persist(NamedTuple):
    """What `status.quic.pairs` and `status.quic.dormantPairs` must now say (whole lists, sorted by twin)."""

    pairs: tuple[PersistedPair, ...]
    dormant: tuple[PersistedPair, ...]


Decision = Admit | Publish | Withdraw | Dormant | Prune | Refuse | AnswerAbsent | Persist


def persisted(record: PairRecord) -> PersistedPair:
    return record.stored


def persist_view(records: Mapping[str, PairRecord], env: Environment) -> Persist:
    """Both lists, sorted by twin, in one pass over the records (keyed by twin)."""
    live: list[PersistedPair] = []
    dormant: list[PersistedPair] = []
    for twin in sorted(records):
        r = records[twin]
        (live if env.valid(r.pair) else dormant).append(r.stored)
    return Persist(tuple(live), tuple(dormant))
