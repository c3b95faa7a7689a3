"""Retry delays. A `Backoff` is one retry policy's schedule; the loop that retries owns its policy as a named constant
(operator.reconciler.WRITE_RETRY, xds.pairs.persist.PAIRS_WRITE_RETRY, the sidecar's list+watch relist) and does its
own waiting, because each waits differently: the reconciler schedules one object's retry without waiting
(`call_later`), the pair writer waits on a condition a newer view or shutdown interrupts, a watch on its stop event.

tenacity (PyPI) was the other candidate: its retry loop owns the sleep and the call, which none of these loops can
hand it; what they share is the schedule, which is this module. Standard library only."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """The delay before retry `attempt` (1: after the first failure) is `first`, multiplied by `factor` per later
    attempt, and never more than `cap`."""

    first: float
    cap: float
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.cap:
            raise ValueError(f"a backoff needs 0 < first <= cap (first={self.first}, cap={self.cap})")
        if self.factor < 1:
            raise ValueError(f"a backoff never shrinks: factor {self.factor} < 1")

    @classmethod
    def constant(cls, delay: float) -> Backoff:
        return cls(delay, delay, 1.0)

    def delay(self, attempt: int) -> float:
        """Seconds before retry `attempt` (>= 1). Multiplied step by step up to the cap, so any attempt count is
        fine (a power of the factor would overflow a float after about a thousand attempts)."""
        if attempt < 1:
            raise ValueError(f"attempts count from 1, not {attempt}")
        d = self.first
        for _ in range(attempt - 1):
            if d >= self.cap or self.factor == 1:
                break
            d *= self.factor
        return min(d, self.cap)

    def schedule(self, attempts: int) -> tuple[float, ...]:
        """The delays before retries 1..`attempts`."""
        return tuple(self.delay(a) for a in range(1, attempts + 1))
