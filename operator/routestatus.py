"""UDPRoute status.parents per the Gateway API (pure): our entries from verdicts, other controllers' entries
untouched, lastTransitionTime kept while a condition's status does not change, and the Events to post."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aether.operator.reconcile.routes import Verdict

CONTROLLER_NAME = "mesh.aether.dev/udproute-controller"


@dataclass(frozen=True)
class RouteEvent:
    type: str  # Normal | Warning
    reason: str
    message: str


def _conditions(v: Verdict, generation: int) -> list[dict[str, Any]]:
    conds = [
        {
            "type": "Accepted",
            "status": "True" if v.accepted else "False",
            "reason": v.accepted_reason,
            "message": v.accepted_message,
            "observedGeneration": generation,
        },
        {
            "type": "ResolvedRefs",
            "status": "True" if v.resolved else "False",
            "reason": v.resolved_reason,
            "message": v.resolved_message,
            "observedGeneration": generation,
        },
    ]
    return conds


def _times(entry: dict[str, Any] | None) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for c in (entry or {}).get("conditions") or []:
        if isinstance(c, dict) and isinstance(c.get("lastTransitionTime"), str):
            out[(str(c.get("type")), str(c.get("status")))] = c["lastTransitionTime"]
    return out


def _same_parent(a: Any, b: dict[str, Any]) -> bool:
    return isinstance(a, dict) and {k: v for k, v in a.items() if v is not None} == b


def parents_status(
    verdicts: tuple[Verdict, ...], existing: list[Any], generation: int, now: str
) -> list[dict[str, Any]]:
    """The whole new status.parents list: other controllers' entries first (as they were), then ours."""
    others = [p for p in existing if isinstance(p, dict) and p.get("controllerName") != CONTROLLER_NAME]
    ours_old = [p for p in existing if isinstance(p, dict) and p.get("controllerName") == CONTROLLER_NAME]
    result = list(others)
    seen: list[dict[str, Any]] = []
    for v in verdicts:
        ref = v.parent.echo()
        if ref in seen or unnamed(v):
            continue
        seen.append(ref)
        old = next((p for p in ours_old if _same_parent(p.get("parentRef"), ref)), None)
        times = _times(old)
        conds = _conditions(v, generation)
        for c in conds:
            c["lastTransitionTime"] = times.get((c["type"], c["status"]), now)
        result.append({"parentRef": ref, "controllerName": CONTROLLER_NAME, "conditions": conds})
    return result


def unnamed(v: Verdict) -> bool:
    """A verdict told in a Warning Event, not in status.parents: one for no nameable parent (no parentRefs, a
    parentRef without a name or not an object: the Gateway API's entry needs parentRef.name), or a hint about a
    parent that is not ours (status under our controllerName is only for parents we are responsible for)."""
    return not v.parent.name or v.hint


def unnamed_events(verdicts: tuple[Verdict, ...]) -> list[RouteEvent]:
    return [
        RouteEvent(
            "Warning",
            v.accepted_reason,
            v.accepted_message if v.hint else f"not attached to any parent: {v.accepted_message}",
        )
        for v in verdicts
        if unnamed(v)
    ]


def comparable(parents: list[Any]) -> list[Any]:
    """parents without lastTransitionTime, to decide whether a write is needed."""
    out = []
    for p in parents:
        if isinstance(p, dict):
            p = dict(p)
            p["conditions"] = [
                {k: v for k, v in c.items() if k != "lastTransitionTime"} if isinstance(c, dict) else c
                for c in p.get("conditions") or []
            ]
        out.append(p)
    return out


def transition_events(verdicts: tuple[Verdict, ...], existing: list[Any]) -> list[RouteEvent]:
    """An Event when our Accepted condition for a parent appears or changes status or reason."""
    events = []
    for v in verdicts:
        if unnamed(v):
            continue
        ref = v.parent.echo()
        old = next(
            (
                p
                for p in existing
                if isinstance(p, dict)
                and p.get("controllerName") == CONTROLLER_NAME
                and _same_parent(p.get("parentRef"), ref)
            ),
            None,
        )
        old_acc = next(
            (c for c in (old or {}).get("conditions") or [] if isinstance(c, dict) and c.get("type") == "Accepted"),
            None,
        )
        status = "True" if v.accepted else "False"
        if old_acc is None or old_acc.get("status") != status or old_acc.get("reason") != v.accepted_reason:
            target = (
                f"{ref.get('kind')} {ref.get('namespace', '')}{'/' if ref.get('namespace') else ''}{ref.get('name')}"
            )
            events.append(
                RouteEvent(
                    "Normal" if v.accepted and v.chosen is not None else "Warning",  # blackholed: a warning too
                    v.accepted_reason,
                    f"{target}: {v.accepted_message}",
                )
            )
    return events
