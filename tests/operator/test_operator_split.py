"""The pure weighted split of a UDPRoute's backendRefs (operator/reconcile/split.py): unit and property tests."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aether.operator.reconcile.split import DRAINED, SplitRef, compute_split


def _shares(refs: list[SplitRef]) -> dict[str, tuple[float, str | None]]:
    return {s.backend: (s.share, s.reason) for s in compute_split(refs)}


def test_seventy_thirty_zero() -> None:
    refs = [SplitRef("ns/a", 53, 70), SplitRef("ns/b", 53, 30), SplitRef("ns/c", 53, 0)]
    assert _shares(refs) == {"ns/a": (70.0, None), "ns/b": (30.0, None), "ns/c": (0.0, DRAINED)}


def test_an_invalid_ref_keeps_its_share_with_its_reason() -> None:
    refs = [SplitRef("ns/missing", 53, 80, "BackendNotFound"), SplitRef("ns/a", 53, 20)]
    assert _shares(refs) == {"ns/missing": (80.0, "BackendNotFound"), "ns/a": (20.0, None)}


def test_thirds_round_to_exactly_one_hundred() -> None:
    got = compute_split([SplitRef(f"ns/{n}", 53, 1) for n in "abc"])
    assert [s.share for s in got] == [33.34, 33.33, 33.33] and sum(s.share * 100 for s in got) == 10_000


def test_all_zero_gives_no_share_and_no_weights_is_empty() -> None:
    assert {s.share for s in compute_split([SplitRef("ns/a", 53, 0), SplitRef("ns/b", 53, 0)])} == {0.0}
    assert compute_split([]) == ()


def test_the_same_backend_twice_is_one_entry_and_two_ports_are_two() -> None:
    assert _shares([SplitRef("ns/a", 53, 1), SplitRef("ns/a", 53, 1), SplitRef("ns/b", 53, 2)]) == {
        "ns/a": (50.0, None),
        "ns/b": (50.0, None),
    }
    got = _shares([SplitRef("ns/a", 53, 1), SplitRef("ns/a", 54, 3, "BackendNotFound")])
    assert got == {"ns/a:53": (25.0, None), "ns/a:54": (75.0, "BackendNotFound")}


def test_a_negative_weight_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        compute_split([SplitRef("ns/a", 53, -1)])


REASONS = st.sampled_from([None, None, None, "BackendNotFound", "RefNotPermitted", "InvalidKind", "UnsupportedValue"])
REFS = st.lists(
    st.builds(
        SplitRef,
        st.sampled_from(["ns/a", "ns/b", "ns/c", "other/d", "ns/e"]),
        st.sampled_from([53, 5353, None]),
        st.integers(min_value=0, max_value=1_000_000),
        REASONS,
    ),
    max_size=16,
)


@given(REFS)
def test_property_shares_sum_to_the_weights(refs: list[SplitRef]) -> None:
    got = compute_split(refs)
    total = sum(r.weight for r in refs)
    assert sum(s.weight for s in got) == total  # merged, nothing lost
    hundredths = sum(round(s.share * 100) for s in got)
    assert hundredths == (10_000 if total else 0)
    for s in got:
        exact = 100.0 * s.weight / total if total else 0.0
        assert abs(s.share - exact) <= 0.01 + 1e-9
        assert (s.share == 0) if s.weight == 0 else True
        assert s.reason != DRAINED or s.weight == 0


@given(REFS, st.randoms())
def test_property_stable_under_reordering(refs: list[SplitRef], rnd: random.Random) -> None:
    shuffled = list(refs)
    rnd.shuffle(shuffled)
    assert compute_split(shuffled) == compute_split(refs)


@given(REFS)
def test_property_zero_and_invalid_are_labelled(refs: list[SplitRef]) -> None:
    for s in compute_split(refs):
        invalid = {r.reason for r in refs if r.reason and s.backend.startswith(r.backend)}
        if s.reason in (None, DRAINED):
            assert (s.reason == DRAINED) == (s.weight == 0)
        else:
            assert s.reason in invalid
