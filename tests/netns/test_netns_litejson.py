"""aether.netns.litejson is json.loads / json.dumps (defaults), value for value, byte for byte, error for error."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aether
from aether.netns import litejson

SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
DOCS = st.recursive(SCALARS, lambda kids: st.lists(kids) | st.dictionaries(st.text(), kids), max_leaves=30)


def same(a: Any, b: Any) -> bool:  # NaN != NaN: compare through the canonical text
    return json.dumps(a) == json.dumps(b)


@settings(max_examples=300, deadline=None)
@given(DOCS)
def test_dumps_is_json_dumps(doc: Any) -> None:
    assert litejson.dumps(doc) == json.dumps(doc)


@settings(max_examples=300, deadline=None)
@given(DOCS, st.sampled_from(["", " ", "\n", " \t\r\n "]))
def test_loads_is_json_loads(doc: Any, pad: str) -> None:
    for text in (json.dumps(doc), json.dumps(doc, indent=2), json.dumps(doc, ensure_ascii=False)):
        assert same(litejson.loads(pad + text + pad), json.loads(pad + text + pad))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_loads_errors_like_json_loads(text: str) -> None:
    try:
        want: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        with pytest.raises(json.JSONDecodeError) as got:
            litejson.loads(text)
        assert (got.value.msg, got.value.pos) == (exc.msg, exc.pos)
    else:
        assert same(litejson.loads(text), want)


@pytest.mark.parametrize(
    "text", ["", "   ", "{oops", "[1,]", '{"a": 1} x', "\ufeff{}", "nul", '"\\x"', "[1, 2", "01", "NaN x"]
)
def test_malformed_documents_raise_the_same_error(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as want:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as got:
        litejson.loads(text)
    assert (got.value.msg, got.value.pos) == (want.value.msg, want.value.pos)


def test_constants_and_unserializable_values() -> None:
    assert math.isnan(litejson.loads("NaN")) and litejson.loads("[-Infinity]") == [float("-inf")]
    assert litejson.dumps([float("nan"), float("inf")]) == json.dumps([float("nan"), float("inf")])
    for bad in ({1, 2}, object(), {"a": b"x"}):
        with pytest.raises(TypeError, match="not JSON serializable"):
            litejson.dumps(bad)
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        litejson.dumps(loop)
    assert litejson.dumps([1, {"k": [2]}]) == json.dumps([1, {"k": [2]}])  # nothing left over from the failures
    with pytest.raises(TypeError):
        litejson.loads(b"{}")  # type: ignore[arg-type]  # the point: bytes are refused


def test_errors_without_the_json_package_loaded(tmp_path: Path) -> None:
    """The CNI plugin runs without `json` imported; a malformed document must still give JSONDecodeError."""
    (tmp_path / "aether").symlink_to(Path(aether.__file__).parent)  # only the package on the path
    code = (
        "import sys; sys.path.append(sys.argv[1]); from aether.netns import litejson\n"
        "assert 'json' not in sys.modules\n"
        "try:\n    litejson.loads('{oops')\nexcept ValueError as exc:\n    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert (
        out.stdout.strip()
        == "JSONDecodeError Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    )
