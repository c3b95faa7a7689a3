"""JSON merge patch (RFC 7386, the json-merge-patch library), JSON patch (RFC 6902 with `test`, the jsonpatch
library), and the approximations no library offers: strategic merge as a merge patch, and server-side apply."""

from __future__ import annotations

import copy
from typing import Any

import json_merge_patch
import jsonpatch
import jsonpointer


class PatchError(ValueError):
    """A patch that cannot be applied: the API answers 422 (or 409 for a failed `test`)."""

    def __init__(self, message: str, *, conflict: bool = False) -> None:
        super().__init__(message)
        self.conflict = conflict


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 (json-merge-patch): dicts merge recursively, `null` deletes, anything else replaces. The library
    merges into its first argument and keeps the patch's values by reference: both are copied first."""
    return json_merge_patch.merge(copy.deepcopy(target), copy.deepcopy(patch))


def strip_directives(patch: Any) -> Any:
    """Strategic-merge patches as a merge patch: drop the `$patch`/`$setElementOrder/...` directive keys.

    Lists are then replaced wholesale, which is what kubectl's client-side apply needs for our objects."""
    if isinstance(patch, dict):
        return {k: strip_directives(v) for k, v in patch.items() if not k.startswith("$")}
    if isinstance(patch, list):
        return [strip_directives(v) for v in patch]
    return patch


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 (jsonpatch) over a deep copy; a failed `test` raises PatchError(conflict=True)."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    try:
        return jsonpatch.apply_patch(target, ops)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise PatchError(f"test failed: {exc}", conflict=True) from exc
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, TypeError, KeyError) as exc:
        raise PatchError(f"bad JSON patch: {exc}") from exc


# ---- server-side apply, as much of it as our writers use --------------------------------------------------------
FieldPath = tuple[str, ...]
LIST_MAP_KEYS = {"conditions": "type"}  # the list-map fields of our CRDs (x-kubernetes-list-map-keys)


def _paths(obj: Any, prefix: FieldPath = ()) -> set[FieldPath]:
    """The field paths an applied object sets: a dict's keys recursively, a list-map's entries by key (as
    `conditions=<type>`), anything else (scalars, atomic lists) whole."""
    out: set[FieldPath] = set()
    if not isinstance(obj, dict) or not obj:
        return {prefix} if prefix else out
    for key, value in obj.items():
        item_key = LIST_MAP_KEYS.get(key)
        if item_key and isinstance(value, list):
            out |= {(*prefix, f"{key}={e.get(item_key)}") for e in value if isinstance(e, dict)}
        else:
            out |= _paths(value, (*prefix, key))
    return out


def _merge_applied(target: Any, applied: Any) -> Any:
    if not isinstance(applied, dict) or not isinstance(target, dict):
        return copy.deepcopy(applied)
    result = dict(target)
    for key, value in applied.items():
        item_key = LIST_MAP_KEYS.get(key)
        if item_key and isinstance(value, list) and isinstance(target.get(key), list):
            mine = {e.get(item_key) for e in value if isinstance(e, dict)}
            kept = [e for e in target[key] if not (isinstance(e, dict) and e.get(item_key) in mine)]
            result[key] = kept + copy.deepcopy(value)
        else:
            result[key] = _merge_applied(target.get(key), value)
    return result


def _remove_path(obj: Any, path: FieldPath) -> None:
    head, rest = path[0], path[1:]
    if not isinstance(obj, dict):
        return
    if "=" in head and not rest:
        key, value = head.split("=", 1)
        item_key = LIST_MAP_KEYS.get(key, "")
        if isinstance(obj.get(key), list):
            obj[key] = [e for e in obj[key] if not (isinstance(e, dict) and str(e.get(item_key)) == value)]
        return
    if not rest:
        obj.pop(head, None)
    else:
        _remove_path(obj.get(head), rest)


def apply_patch(current: Any, applied: dict[str, Any], owned_before: set[FieldPath]) -> tuple[Any, set[FieldPath]]:
    """Server-side apply of `applied` by one field manager over `current` (force: conflicts are taken over): the
    fields it sets are merged in (list-map entries by key, atomic lists whole), the fields this manager set last
    time and omits now are removed. -> (the new object, the paths this manager now owns). Emulation: ownership is
    per manager only; no managedFields are written."""
    body = {k: v for k, v in applied.items() if k not in ("apiVersion", "kind", "metadata")}
    owned = _paths(body)
    new = _merge_applied(copy.deepcopy(current), body)
    for path in sorted(owned_before - owned, key=len, reverse=True):
        _remove_path(new, path)
    return new, owned
