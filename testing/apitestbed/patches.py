"""JSON merge patch (RFC 7386), JSON patch (RFC 6902, with `test`), and the strategic-merge approximation."""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    """A patch that cannot be applied: the API answers 422 (or 409 for a failed `test`)."""

    def __init__(self, message: str, *, conflict: bool = False) -> None:
        super().__init__(message)
        self.conflict = conflict


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: dicts merge recursively, `null` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strip_directives(patch: Any) -> Any:
    """Strategic-merge patches as a merge patch: drop the `$patch`/`$setElementOrder/...` directive keys.

    Lists are then replaced wholesale, which is what kubectl's client-side apply needs for our objects."""
    if isinstance(patch, dict):
        return {k: strip_directives(v) for k, v in patch.items() if not k.startswith("$")}
    if isinstance(patch, list):
        return [strip_directives(v) for v in patch]
    return patch


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer must start with '/': {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"path {path!r} does not exist")
    return node


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(f"path {path!r} does not exist")


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise PatchError(f"bad list index in {path!r}")
    else:
        raise PatchError(f"cannot add under a scalar at {path!r}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise PatchError(f"path {path!r} does not exist")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 over a deep copy; a failed `test` raises PatchError(conflict=True)."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"bad JSON patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = _add(_remove(doc, path), path, copy.deepcopy(op.get("value"))) if _pointer(path) else op.get("value")
        elif kind == "move":
            value = _get(doc, op["from"])
            doc = _add(_remove(doc, op["from"]), path, value)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif kind == "test":
            try:
                actual = _get(doc, path)
            except PatchError as exc:
                raise PatchError(f"test failed: {exc}", conflict=True) from exc
            if actual != op.get("value"):
                raise PatchError(f"test failed at {path!r}: {actual!r} != {op.get('value')!r}", conflict=True)
        else:
            raise PatchError(f"unknown JSON patch op {kind!r}")
    return doc


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
