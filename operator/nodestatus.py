"""The operator-owned part of a MeshNode status, as written (pure): what we patch, how it merges with the
sidecar's conditions and pairs, and the digest that decides whether a write is needed."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from aether.api.meshnode import MeshNodeStatus

OPERATOR_CONDITIONS = frozenset({"Ready", "Degraded"})
SIDECAR_QUIC_FIELDS = frozenset({"pairs", "dormantPairs", "pairCount", "dormantPairCount"})


def owned_wire(status: MeshNodeStatus) -> dict[str, Any]:
    """The operator's fields of a status, camelCase; quic without the sidecar-owned pair fields."""
    wire = status.wire()
    wire["quic"] = {k: v for k, v in wire.get("quic", {}).items() if k not in SIDECAR_QUIC_FIELDS}
    wire.pop("observedGeneration", None)
    return wire


def _timeless(conditions: Any) -> list[Any]:
    return [
        {k: v for k, v in c.items() if k != "lastTransitionTime"} if isinstance(c, dict) else c
        for c in conditions or []
    ]


def digest(owned: dict[str, Any]) -> str:
    body = dict(owned)
    body["conditions"] = _timeless(body.get("conditions"))
    return hashlib.blake2b(json.dumps(body, sort_keys=True).encode(), digest_size=16).hexdigest()


def current_owned(status: Any) -> dict[str, Any]:
    """The operator-owned part of a status as stored (to compare after a restart)."""
    if not isinstance(status, dict):
        return {}
    out = {k: v for k, v in status.items() if k not in ("observedGeneration",)}
    quic = out.get("quic")
    out["quic"] = {k: v for k, v in (quic if isinstance(quic, dict) else {}).items() if k not in SIDECAR_QUIC_FIELDS}
    out["conditions"] = [
        c for c in out.get("conditions") or [] if isinstance(c, dict) and c.get("type") in OPERATOR_CONDITIONS
    ]
    return out


def same_owned(current_status: Any, owned: dict[str, Any]) -> bool:
    """Whether the stored status already holds `owned` (condition transition times aside)."""
    cur = current_owned(current_status)
    cur["conditions"] = _timeless(cur.get("conditions"))
    want = dict(owned)
    want["conditions"] = _timeless(owned.get("conditions"))
    return {k: cur.get(k) for k in want} == want


def cur_ours(status: dict[str, Any]) -> list[Any]:
    """The operator's conditions in a stored status, in our order (Ready, then Degraded)."""
    by_type = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}
    return [by_type[t] for t in ("Ready", "Degraded") if t in by_type]


def merge_conditions(current: Any, ours: list[dict[str, Any]], now: str) -> list[dict[str, Any]]:
    """Our condition types replaced (lastTransitionTime kept while status is unchanged), others kept."""
    existing = [c for c in current or [] if isinstance(c, dict)]
    by_type = {c.get("type"): c for c in existing}
    merged = [c for c in existing if c.get("type") not in OPERATOR_CONDITIONS]
    for c in ours:
        old = by_type.get(c["type"])
        stamp = old.get("lastTransitionTime") if old and old.get("status") == c["status"] else None
        merged.append({**c, "lastTransitionTime": stamp or now})
    return merged


def status_patch(owned: dict[str, Any], current: Any, resource_version: str | None, now: str) -> dict[str, Any]:
    """A merge patch for /status that leaves the sidecar's quic.pairs/dormantPairs and conditions alone, and
    carries only the top-level fields that differ from `current` (the status the patch is computed against; the
    resourceVersion precondition makes a stale `current` a 409, then re-read)."""
    cur = current if isinstance(current, dict) else {}
    have = current_owned(cur)
    body = {k: v for k, v in owned.items() if k != "conditions" and have.get(k) != v}
    if _timeless(cur_ours(cur)) != _timeless(owned.get("conditions")):
        body["conditions"] = merge_conditions(cur.get("conditions"), owned.get("conditions", []), now)
    patch: dict[str, Any] = {"status": body}
    if resource_version:
        patch["metadata"] = {"resourceVersion": resource_version}
    return patch
