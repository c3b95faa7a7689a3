"""aether.backoff: the delay schedule (hypothesis over first, cap, factor and attempt) and the retry policies that
own one, pinned."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aether.backoff import Backoff
from aether.operator.reconciler import WRITE_RETRY
from aether.xds.pairs.persist import PAIRS_WRITE_RETRY
from aether.xds.sidecar.kube_source import relist_retry

seconds = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)
# a factor just above 1 (1 + 2e-16) takes millions of steps to reach the cap, and can round `d * factor` back to `d`
# so it never does: a CI run hung on one; a factor is 1 (constant) or at least 1.01 here
factors = st.sampled_from([1.0, 1.5, 2.0, 3.0]) | st.floats(min_value=1.01, max_value=10.0)
attempts = st.integers(min_value=1, max_value=200)


@st.composite
def backoffs(draw: st.DrawFn) -> Backoff:
    first, cap = sorted((draw(seconds), draw(seconds)))
    return Backoff(first, cap, draw(factors))


@given(backoffs(), attempts)
def test_the_delay_is_first_times_factor_per_attempt_up_to_the_cap(b: Backoff, attempt: int) -> None:
    exact = min(Fraction(b.first) * Fraction(b.factor) ** (attempt - 1), Fraction(b.cap))
    assert b.delay(attempt) == pytest.approx(float(exact), rel=1e-9)
    assert b.first <= b.delay(attempt) <= b.cap


@given(backoffs(), attempts)
def test_the_schedule_never_shrinks_and_starts_at_first(b: Backoff, n: int) -> None:
    schedule = b.schedule(n)
    assert len(schedule) == n and schedule[0] == b.first
    assert all(a <= z for a, z in itertools.pairwise(schedule))


@given(backoffs())
def test_the_cap_is_reached_and_kept(b: Backoff) -> None:
    if b.factor == 1.0:
        assert set(b.schedule(50)) == {b.first}
        return
    # the first attempt whose exact delay first * factor ** (attempt - 1) is at least the cap, +-1 for rounding
    at = 1 + math.ceil(math.log(b.cap / b.first) / math.log(b.factor))
    assert b.delay(at + 1) == b.cap and b.delay(at + 1000) == b.cap
    if at - 2 >= 1:
        assert b.delay(at - 2) < b.cap


@given(st.integers(min_value=1, max_value=10**7))
def test_any_attempt_count_has_a_delay(attempt: int) -> None:
    """A power of the factor overflows a float near attempt 1,025 (the reconciler's old
    `min(0.25 * 2 ** (attempt - 1), 4.0)` raised OverflowError there): the schedule stays at its cap."""
    assert WRITE_RETRY.delay(attempt) == min(0.25 * 2.0 ** min(attempt - 1, 10), 4.0)


@given(st.integers(min_value=1, max_value=60), seconds)
def test_a_doubling_schedule_is_the_pair_writers_old_recurrence(n: int, first: float) -> None:
    """The pair writer waited `delay`, then `delay = min(delay * 2, cap)`, from `first`: the same floats."""
    b, delay, old = Backoff(first, max(first, 30.0)), first, []
    for _ in range(n):
        old.append(delay)
        delay = min(delay * 2, b.cap)
    assert list(b.schedule(n)) == old


def test_the_policies() -> None:
    assert WRITE_RETRY.schedule(7) == (0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0)
    assert PAIRS_WRITE_RETRY.schedule(7) == (1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0)
    assert relist_retry(1.0).schedule(3) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize(
    ("first", "cap", "factor"), [(0.0, 1.0, 2.0), (2.0, 1.0, 2.0), (-1.0, 1.0, 2.0), (1.0, 2.0, 0.5)]
)
def test_a_schedule_that_is_not_one_is_refused(first: float, cap: float, factor: float) -> None:
    with pytest.raises(ValueError):
        Backoff(first, cap, factor)


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="from 1"):
        WRITE_RETRY.delay(0)
