"""`json.loads` / `json.dumps` for the CNI plugin without importing `json` (which imports `re`: ~15 ms a call).

The same C accelerator the `json` package uses (`_json`), driven directly: `loads` is `json.loads(s)` and `dumps`
is `json.dumps(obj)` (default separators, `ensure_ascii`, `allow_nan`, no indent, no sort), byte for byte and error
for error (a malformed document raises `json.JSONDecodeError`, a `ValueError`; the `json` package is imported only
then). tests/netns/test_netns_litejson.py holds them to the real functions over generated documents.
"""

from __future__ import annotations

import _json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_WHITESPACE = " \t\n\r"
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Context:
    """The attributes `_json.make_scanner` reads (what `json.JSONDecoder()` holds by default)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__
    memo: dict[str, str] = {}


_scan = _json.make_scanner(_Context())  # type: ignore[arg-type]  # typeshed: context typed as the scanner class


def _skip(s: str, idx: int) -> int:
    n = len(s)
    while idx < n and s[idx] in _WHITESPACE:
        idx += 1
    return idx


def _decode_error(msg: str, s: str, pos: int) -> ValueError:
    from json import JSONDecodeError  # error path only

    return JSONDecodeError(msg, s, pos)


def loads(s: str) -> Any:
    if not isinstance(s, str):
        raise TypeError(f"the JSON object must be str, not {type(s).__name__}")
    if s.startswith("\ufeff"):
        raise _decode_error("Unexpected UTF-8 BOM (decode using utf-8-sig)", s, 0)
    idx = _skip(s, 0)
    try:
        obj, end = _scan(s, idx)
    except StopIteration as stop:
        raise _decode_error("Expecting value", s, stop.value) from None
    except SystemError:
        # The scanner raises json.decoder.JSONDecodeError for malformed input, looking the class up in sys.modules
        # without importing it; when `json` is not loaded that lookup fails and surfaces as SystemError. Errors are
        # the slow path: let the real decoder produce the same error (or value) with its message and position.
        import json

        return json.loads(s)
    end = _skip(s, end)
    if end != len(s):
        raise _decode_error("Extra data", s, end)
    return obj


def _default(obj: Any) -> Any:
    raise TypeError(f"Object of type {obj.__class__.__name__} is not JSON serializable")


def _encoder() -> Any:
    return _json.make_encoder(
        {},  # markers (fresh per call): circular references are an error, as with check_circular=True
        _default,
        _json.encode_basestring_ascii,
        None,  # indent
        ": ",
        ", ",
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )


def dumps(obj: Any) -> str:
    if isinstance(obj, str):
        return _json.encode_basestring_ascii(obj)
    return "".join(_encoder()(obj, 0))
