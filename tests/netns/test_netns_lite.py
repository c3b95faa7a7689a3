"""aether.netns.lite's Record and StrChoice behave like typing.NamedTuple and enum.StrEnum where the code uses them."""

from __future__ import annotations

import copy
import pickle
from enum import StrEnum
from typing import Any, NamedTuple

import pytest

from aether.netns.contract import CaptureMode, Transport
from aether.netns.lite import Record, StrChoice


class RealPoint(NamedTuple):
    x: int
    y: int
    label: str = "p"
    tags: tuple[str, ...] = ()

    def norm1(self) -> int:
        return abs(self.x) + abs(self.y)


class LitePoint(Record):
    x: int
    y: int
    label: str = "p"
    tags: tuple[str, ...] = ()

    def norm1(self) -> int:
        return abs(self.x) + abs(self.y)


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((1, 2), {}),
    ((1,), {"y": 2}),
    ((), {"x": 1, "y": 2, "label": "q"}),
    ((1, 2, "r", ("a",)), {}),
    ((1, 2), {"tags": ("b", "c")}),
]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_record_is_a_namedtuple(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    real, lite = RealPoint(*args, **kwargs), LitePoint(*args, **kwargs)
    assert tuple(real) == tuple(lite) and lite == tuple(real) and hash(lite) == hash(real)
    assert (lite.x, lite.y, lite.label, lite.tags) == (real.x, real.y, real.label, real.tags)
    assert lite[1] == real[1] and len(lite) == len(real)
    x, y, label, tags = lite
    assert (x, y, label, tags) == tuple(real)
    assert lite._fields == real._fields
    assert lite._field_defaults == real._field_defaults
    assert lite._asdict() == real._asdict()
    assert tuple(lite._replace(y=9)) == tuple(real._replace(y=9))
    assert lite.norm1() == real.norm1()
    assert repr(lite) == repr(real).replace("RealPoint", "LitePoint")
    assert copy.deepcopy(lite) == lite and type(copy.deepcopy(lite)) is LitePoint
    assert pickle.loads(pickle.dumps(lite)) == lite
    assert isinstance(lite, tuple)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {}), ((1,), {}), ((1, 2, "a", (), "extra"), {}), ((1, 2), {"nope": 1}), ((1, 2), {"x": 3})],
)
def test_record_refuses_what_namedtuple_refuses(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        RealPoint(*args, **kwargs)
    with pytest.raises(TypeError):
        LitePoint(*args, **kwargs)


def test_record_fields_are_read_only_and_replace_refuses_unknown_fields() -> None:
    lite = LitePoint(1, 2)
    with pytest.raises(AttributeError):
        lite.x = 5
    with pytest.raises(ValueError, match="no fields"):
        lite._replace(z=1)


def test_record_refuses_a_field_without_default_after_one_with() -> None:
    with pytest.raises(TypeError, match="follows one with a default"):

        class Bad(Record):
            a: int = 1
            b: int


class RealMode(StrEnum):
    ALPHA = "alpha"
    BETA = "beta"


class LiteMode(StrChoice):
    ALPHA = "alpha"
    BETA = "beta"


def test_strchoice_is_a_strenum() -> None:
    assert [m.value for m in LiteMode] == [m.value for m in RealMode]
    assert [m.name for m in LiteMode] == [m.name for m in RealMode]
    assert len(LiteMode) == len(RealMode) == 2
    for value in ("alpha", "beta"):
        lite, real = LiteMode(value), RealMode(value)
        assert lite is LiteMode(lite) and real is RealMode(real)
        assert lite == value and real == value and hash(lite) == hash(real) == hash(value)
        assert str(lite) == str(real) == f"{lite}" == f"{real}" == value
        assert lite.value == real.value and lite.name == real.name
        assert isinstance(lite, str) and isinstance(lite, LiteMode)
        table: dict[str, int] = {value: 1}
        assert table[lite] == 1
        assert copy.deepcopy(lite) is lite and pickle.loads(pickle.dumps(lite)) is lite
        assert lite in LiteMode and value in LiteMode
    assert repr(LiteMode.ALPHA) == repr(RealMode.ALPHA).replace("RealMode", "LiteMode")
    assert LiteMode.ALPHA is LiteMode("alpha") and LiteMode.ALPHA is not LiteMode.BETA
    assert sorted([LiteMode.BETA, LiteMode.ALPHA]) == sorted([RealMode.BETA, RealMode.ALPHA])


@pytest.mark.parametrize("bad", ["gamma", "ALPHA", "", None, 1])
def test_strchoice_refuses_what_strenum_refuses(bad: Any) -> None:
    with pytest.raises(ValueError):
        RealMode(bad)
    with pytest.raises(ValueError, match="is not a valid LiteMode"):
        LiteMode(bad)
    assert bad not in LiteMode


def test_strchoice_refuses_a_repeated_value() -> None:
    with pytest.raises(TypeError, match="repeats the value"):

        class Bad(StrChoice):
            A = "x"
            B = "x"


def test_the_contract_choices_keep_their_values() -> None:
    assert [m.value for m in CaptureMode] == ["tproxy", "redirect"]
    assert [m.value for m in Transport] == ["tcp", "udp"]
    assert CaptureMode("tproxy") is CaptureMode.TPROXY
