"""Per-stream, per-type delta-xDS state and the diff that decides what to send (pure).

Subscription rules, as Envoy 1.40 uses them: a type's first request with no names is a wildcard subscription
(Envoy asks CDS and LDS that way, EDS, RDS and SDS by name); `"*"` in subscribe/unsubscribe turns the wildcard
on/off; explicitly subscribed = subscribe minus `"*"`. `initial_resource_versions` (first request of a fresh
stream) says what the client already holds, so after a server restart only resources whose content changed are
sent: seen here with the real Envoy, a restarted sidecar pushes nothing (`tests/xds/test_xds_e2e_udp.py`,
`test_sidecar_restart_loses_nothing_and_resends_nothing`). An explicitly subscribed name that the snapshot does
not have is answered once as removed (after the on-demand hook had its chance).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

WILDCARD: Final = "*"
ABSENT: Final = ""  # `known` value for a name we answered as removed while it stays subscribed


@dataclass
class Sent:
    """One response awaiting ACK/NACK: what the client held before it, to undo on NACK."""

    snapshot_version: str
    prior: dict[str, str | None]


@dataclass
class TypeState:
    started: bool = False
    answered: bool = False  # the first response goes out even when empty: Envoy's initial fetch waits for it
    wildcard: bool = False
    subscribed: set[str] = field(default_factory=set)
    known: dict[str, str] = field(default_factory=dict)
    pending: dict[str, Sent] = field(default_factory=dict)

    def interested(self, name: str) -> bool:
        return self.wildcard or name in self.subscribed

    def apply_request(
        self, subscribe: Iterable[str], unsubscribe: Iterable[str], initial: Mapping[str, str]
    ) -> set[str]:
        """Update subscriptions; returns the names newly subscribed explicitly."""
        sub = list(subscribe)
        unsub = list(unsubscribe)
        if not self.started:
            self.started = True
            if not sub and WILDCARD not in unsub:
                self.wildcard = True
            self.known.update(initial)
        new: set[str] = set()
        for name in sub:
            if name == WILDCARD:
                self.wildcard = True
            elif name not in self.subscribed:
                self.subscribed.add(name)
                new.add(name)
        for name in unsub:
            if name == WILDCARD:
                self.wildcard = False
            else:
                self.subscribed.discard(name)
                self.known.pop(name, None)
        return new

    def diff(self, snapshot: Mapping[str, str]) -> tuple[list[str], list[str]]:
        """(names to send, names to answer as removed) given the snapshot's versions for this type."""
        send = sorted(n for n, v in snapshot.items() if self.interested(n) and self.known.get(n) != v)
        removed = sorted(n for n, v in self.known.items() if n not in snapshot and v != ABSENT and self.interested(n))
        removed += sorted(n for n in self.subscribed if n not in snapshot and n not in self.known)
        return send, sorted(set(removed))

    def record_sent(self, nonce: str, snapshot_version: str, send: Mapping[str, str], removed: Iterable[str]) -> None:
        prior: dict[str, str | None] = {}
        for name, ver in send.items():
            prior[name] = self.known.get(name)
            self.known[name] = ver
        for name in removed:
            prior[name] = self.known.get(name)
            if name in self.subscribed:
                self.known[name] = ABSENT
            else:
                self.known.pop(name, None)
        self.pending[nonce] = Sent(snapshot_version, prior)
        self.answered = True

    def record_announced(self, nonce: str, snapshot_version: str) -> None:
        """A response of names the client had not asked for: awaiting its ACK, holding nothing (`known` unchanged)."""
        self.pending[nonce] = Sent(snapshot_version, {})

    def ack(self, nonce: str) -> Sent | None:
        return self.pending.pop(nonce, None)

    def nack(self, nonce: str) -> Sent | None:
        """Envoy rejected the response: forget what it carried, so a later diff re-sends what is current."""
        sent = self.pending.pop(nonce, None)
        if sent is not None:
            for name in sent.prior:
                self.known.pop(name, None)
        return sent
