"""A MeshServiceSlice's write, as sent (pure): the JSON patch (RFC 6902) that turns the stored slice into the
computed one and carries only the change. A merge patch would resend each list that changed whole (a slice's
`udp.services` is up to ~100 arms); here an arm whose endpoints moved is one `replace` of that arm. The first op
tests the resourceVersion the patch was computed against, so a patch built from a stale copy is refused (409/422)
and rebuilt from a fresh read instead of landing on items that moved."""

from __future__ import annotations

from typing import Any


def _pointer(parts: list[str]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _diff(path: list[str], old: Any, new: Any, ops: list[dict[str, Any]]) -> None:
    if old == new:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": _pointer([*path, key])})
        for key, value in new.items():
            if key in old:
                _diff([*path, key], old[key], value, ops)
            else:
                ops.append({"op": "add", "path": _pointer([*path, key]), "value": value})
        return
    if isinstance(old, list) and isinstance(new, list) and abs(len(old) - len(new)) == 1:
        short, long_ = (old, new) if len(old) < len(new) else (new, old)
        i = next((k for k in range(len(short)) if short[k] != long_[k]), len(short))
        if short[i:] == long_[i + 1 :]:  # one item added or removed (a Service in or out of the slice)
            if len(new) > len(old):
                ops.append({"op": "add", "path": _pointer([*path, str(i)]), "value": new[i]})
            else:
                ops.append({"op": "remove", "path": _pointer([*path, str(i)])})
            return
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        changed = [i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
        if len(changed) * 2 <= len(new):  # a few items moved: replace those; most of them: the list
            for i in changed:
                ops.append({"op": "replace", "path": _pointer([*path, str(i)]), "value": new[i]})
            return
    ops.append({"op": "replace", "path": _pointer(path), "value": new})


def same_slice(current: dict[str, Any], spec: dict[str, Any], labels: dict[str, str]) -> bool:
    meta = current.get("metadata") or {}
    raw = meta.get("labels")
    have: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return current.get("spec") == spec and all(have.get(k) == v for k, v in labels.items())


def slice_ops(current: dict[str, Any], spec: dict[str, Any], labels: dict[str, str]) -> list[dict[str, Any]]:
    """The JSON patch from `current` (the stored object) to `spec` with our `labels` (others' labels kept)."""
    meta = current.get("metadata") or {}
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")}
    ]
    have = meta.get("labels")
    if not isinstance(have, dict):
        ops.append({"op": "add", "path": "/metadata/labels", "value": dict(labels)})
    else:
        for key, value in labels.items():
            if have.get(key) != value:
                ops.append({"op": "add", "path": _pointer(["metadata", "labels", key]), "value": value})
    old = current.get("spec")
    if isinstance(old, dict):
        _diff(["spec"], old, spec, ops)
    else:
        ops.append({"op": "add", "path": "/spec", "value": spec})
    return ops
