"""The pair state in MeshNode status: `status.quic.pairs` / `dormantPairs` to and from the machine's
`PersistedPair` (pure), and `PairWriter`, the thread that writes the latest `Persist` without ever blocking the
serving path.

On the wire a pair's source is its SPIFFE ID and times are RFC 3339 (UTC, seconds); the machine's are
`<ns>/<sa>` and float seconds. A record the sidecar cannot read back (a foreign SPIFFE ID, a bad time) is
skipped with a log line: the machine prunes pairs whose names do not make their twin (`MalformedRecord`).

`PairWriter` keeps only the latest view (a newer one replaces one not yet written; writes are at least 0.2 s
apart, so a burst of first uses is one write), retries a failed write with backoff (`PAIRS_WRITE_RETRY`: 1 s
doubling to 30 s), and reports the `PairsPersisted` condition: True once the view in memory is written, False with
the reason while writes fail. Traffic never waits for it: the snapshot is served from memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Final, Protocol, runtime_checkable

from aether.api.meshnode import Condition, PairEvidence, QuicPair
from aether.api.naming import ref, spiffe_id
from aether.backoff import Backoff
from aether.metrics import QUIC_PAIR_WRITE_FAILURES
from aether.xds.identity.svid import parse_spiffe_id
from aether.xds.pairs.values import Evidence, EvidenceKind, Persist, PersistedPair

log = logging.getLogger("aether.xds.pairs")
PAIRS_PERSISTED: Final = "PairsPersisted"
_TIME = "%Y-%m-%dT%H:%M:%SZ"
PAIRS_WRITE_RETRY = Backoff(first=1.0, cap=30.0)  # a failed write of the pairs, retried while it fails


def wire_time(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime(_TIME)


def parse_time(text: str) -> float:
    return datetime.strptime(text, _TIME).replace(tzinfo=UTC).timestamp()


def to_wire(p: PersistedPair, trust_domain: str) -> QuicPair:
    ns, _, sa = p.source.partition("/")
    last = PairEvidence(kind=p.evidence.kind.value, time=wire_time(p.evidence.at)) if p.evidence else None
    return QuicPair(
        source=spiffe_id(ns, sa, trust_domain),
        destination=p.destination,
        twin=p.twin,
        since=wire_time(p.since),
        evidence=p.admitted.value if p.admitted else None,
        last_evidence=last,
    )


class WireMemo:
    """`to_wire` over a whole list, an unchanged pair converted once: it keeps the last list's conversions only,
    so what it holds is bounded by the live pairs. (An LRU over every pair seen kept each one with each of its
    evidence times, 16,384 of them: the sidecar's RSS grew with every use of a pair, issue 28.) One per owner."""

    def __init__(self, trust_domain: str) -> None:
        self.trust_domain = trust_domain
        self._last: dict[PersistedPair, QuicPair] = {}

    def __len__(self) -> int:
        return len(self._last)

    def convert(self, pairs: Iterable[PersistedPair]) -> list[QuicPair]:
        last = self._last
        kept: dict[PersistedPair, QuicPair] = {}
        out: list[QuicPair] = []
        for p in pairs:
            q = kept.get(p) or last.get(p) or to_wire(p, self.trust_domain)
            kept[p] = q
            out.append(q)
        self._last = kept
        return out


def from_wire(q: QuicPair, trust_domain: str) -> PersistedPair | None:
    """The machine's record of a stored pair, or None (logged) when it cannot be read."""
    try:
        sid = parse_spiffe_id(q.source)
        if sid.trust_domain != trust_domain:
            raise ValueError(f"trust domain {sid.trust_domain!r}, not {trust_domain!r}")
        since = parse_time(q.since) if q.since else 0.0
        evidence = None
        if q.last_evidence is not None:
            evidence = Evidence(EvidenceKind(q.last_evidence.kind), parse_time(q.last_evidence.time))
        admitted = EvidenceKind(q.evidence) if q.evidence else None
    except ValueError as exc:
        log.warning("stored QUIC pair %s skipped: %s", q.twin, exc)
        return None
    return PersistedPair(ref(sid.namespace, sid.service_account), q.destination, q.twin, since, evidence, admitted)


def stored(pairs: list[QuicPair], trust_domain: str) -> tuple[PersistedPair, ...]:
    return tuple(p for p in (from_wire(q, trust_domain) for q in pairs) if p is not None)


@runtime_checkable
class PairSink(Protocol):
    def publish_pairs(self, node_name: str, pairs: list[QuicPair], dormant: list[QuicPair]) -> None: ...


class PairWriter:
    """Writes the latest `Persist` through `sink` on its own thread; `condition(c)` hears PairsPersisted."""

    def __init__(
        self,
        node_name: str,
        sink: PairSink,
        trust_domain: str,
        condition: Callable[[Condition], None],
        retry: Backoff = PAIRS_WRITE_RETRY,
        min_interval: float = 0.2,
        settle: float = 0.05,
    ) -> None:
        self.node_name, self.sink, self.trust_domain = node_name, sink, trust_domain
        self._wire_pairs, self._wire_dormant = WireMemo(trust_domain), WireMemo(trust_domain)
        self.condition_cb, self.retry = condition, retry
        self.min_interval = min_interval
        # a write starts `settle` after the first view it carries: the view comes from an ADS stream's hook
        # (a fetch), and the write's Python work would otherwise share the GIL with that fetch's answer
        self.settle = settle
        self._last_write = 0.0
        self._since = 0.0  # when the oldest unwritten view was submitted
        self._cv = threading.Condition()
        self._pending: Persist | None = None
        self._stop = False
        self.written: Persist | None = None
        self.last_error: str | None = None
        self.writes = 0
        self._status: tuple[str, str] | None = None
        self._thread = threading.Thread(target=self._run, name="pair-writer", daemon=True)
        self._thread.start()

    def submit(self, view: Persist) -> None:
        with self._cv:
            if self._pending is None:
                self._since = time.monotonic()
            self._pending = view
            self._cv.notify()

    def idle(self) -> bool:
        """Nothing waiting to be written (tests and the shutdown path)."""
        with self._cv:
            return self._pending is None

    def close(self, timeout: float = 2.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout)

    def _report(self, status: str, reason: str, message: str) -> None:
        if self._status == (status, reason):
            return
        self._status = (status, reason)
        level = logging.INFO if status == "True" else logging.WARNING
        log.log(level, "%s=%s %s: %s", PAIRS_PERSISTED, status, reason, message)
        try:
            self.condition_cb(Condition(type=PAIRS_PERSISTED, status=status, reason=reason, message=message))
        except Exception:  # the condition is best effort: the API may be the thing that is down
            log.debug("cannot publish %s", PAIRS_PERSISTED, exc_info=True)

    def _run(self) -> None:
        failures = 0  # consecutive failed writes
        while True:
            with self._cv:
                while self._pending is None and not self._stop:
                    self._cv.wait()
                if self._pending is None:
                    return
                wait = max(self._last_write + self.min_interval, self._since + self.settle) - time.monotonic()
                if wait > 0 and not self._stop:
                    self._cv.wait(wait)  # coalesce: whatever arrives meanwhile replaces the view
                    continue
                view = self._pending
                self._pending = None
            self._last_write = time.monotonic()
            try:
                self.sink.publish_pairs(
                    self.node_name,
                    self._wire_pairs.convert(view.pairs),
                    self._wire_dormant.convert(view.dormant),
                )
            except Exception as exc:
                QUIC_PAIR_WRITE_FAILURES.inc()
                failures += 1
                delay = self.retry.delay(failures)
                self.last_error = f"{type(exc).__name__}: {getattr(exc, 'reason', None) or exc}"
                log.warning("writing QUIC pairs failed (retry in %.0f s): %s", delay, self.last_error)
                self._report("False", "WriteFailed", f"{self.last_error}; serving {len(view.pairs)} pairs from memory")
                with self._cv:
                    if self._pending is None:
                        self._pending = view  # retry it unless a newer view came meanwhile
                    if self._stop:
                        return
                    self._cv.wait(delay)
                continue
            failures = 0
            self.written, self.last_error = view, None
            self.writes += 1
            self._report("True", "Persisted", "status.quic.pairs and dormantPairs hold the sidecar's pair state")
