"""Injected API faults: the test bed answers chosen requests with an error, cuts watch streams, or is down.

    bed.inject(Fault(500, verb="patch", plural="udproutes", subresource="status"))   # the next such PATCH fails
    bed.inject(Fault(422, verb="patch", name="bad", times=0))                        # every one, until cleared
    bed.cut_watches()                                                                 # every open watch ends
    bed.set_down(True); ...; bed.set_down(False)                                      # 503 for every request

Each answered fault is counted on its `Fault.hits` and appears in the audit with its code, so a test can wait for
"the fault happened" instead of sleeping."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

REASONS = {
    409: "Conflict",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass
class Fault:
    """Answer matching requests with `code` (None fields match anything). `times`: how many requests it answers
    (0: every one until removed)."""

    code: int
    verb: str | None = None  # get, list, watch, create, update, patch, delete
    plural: str | None = None
    name: str | None = None
    namespace: str | None = None
    subresource: str | None = None
    times: int = 1
    message: str = "injected by the API test bed"
    hits: int = 0

    @property
    def reason(self) -> str:
        return REASONS.get(self.code, "InternalError")

    @property
    def spent(self) -> bool:
        return self.times > 0 and self.hits >= self.times

    def matches(self, verb: str, plural: str, name: str | None, namespace: str | None, sub: str | None) -> bool:
        return (
            not self.spent
            and self.verb in (None, verb)
            and self.plural in (None, plural)
            and self.name in (None, name)
            and self.namespace in (None, namespace)
            and self.subresource in (None, sub)
        )


class Faults(Protocol):
    """What a test injects faults through: the API test bed itself, or the fault proxy in front of a real server
    (aether.testing.controlplane.faultproxy)."""

    def inject(self, fault: Fault) -> Fault: ...
    def clear_faults(self) -> None: ...
    def cut_watches(self) -> None: ...
    def set_down(self, down: bool) -> None: ...
