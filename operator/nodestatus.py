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


def ours_with_times(current: Any, ours: list[dict[str, Any]], now: str) -> list[dict[str, Any]]:
    """Our conditions, each keeping its stored lastTransitionTime while its status is unchanged."""
    by_type = {c.get("type"): c for c in current or [] if isinstance(c, dict)}
    out = []
    for c in ours:
        old = by_type.get(c["type"])
        stamp = old.get("lastTransitionTime") if old and old.get("status") == c["status"] else None
        out.append({**c, "lastTransitionTime": stamp or now})
    return out


def applied_status(owned: dict[str, Any], current: Any, now: str) -> dict[str, Any]:
    """The status the operator applies (server-side apply, field manager `aether-operator`): every field it owns,
    its conditions (Ready, Degraded) with their transition times kept. The sidecar's fields (quic.pairs and the
    rest of SIDECAR_QUIC_FIELDS, its own condition types) are not in it, so the server keeps them: conditions are a
    list-map keyed by type, and a field this manager stops sending is removed."""
    cur = current if isinstance(current, dict) else {}
    body = {k: v for k, v in owned.items() if k != "conditions"}
    body["conditions"] = ours_with_times(cur.get("conditions"), owned.get("conditions", []), now)
    return body
