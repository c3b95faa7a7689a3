"""The weighted split of a UDPRoute's backendRefs (pure): each backend's share of new sessions, Gateway API style.

The spec: a backendRef's weight is the proportion of new flows it receives, `weight / sum(weights)`; weight 0 gets
none; the share of an invalid backendRef is dropped, not given to the valid ones ("packet drops must respect
weight"). Shares are percentages in hundredths, rounded by largest remainder so that they add up to exactly 100
whenever some weight is positive (all 0 otherwise). The result depends on the set of backendRefs, not their order:
refs naming the same backend and port with the same resolution are one entry (their weights add), and entries are
ordered by backend, port, then reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DRAINED = "Drained"
_UNITS = 10_000  # 100.00 %


@dataclass(frozen=True, slots=True)
class SplitRef:
    """One backendRef as resolved: `reason` None when valid, else its ResolvedRefs reason (share dropped)."""

    backend: str  # <namespace>/<name>
    port: int | None
    weight: int
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Share:
    backend: str  # <namespace>/<name>, or <namespace>/<name>:<port> when the route names one backend at two ports
    port: int | None
    weight: int
    share: float  # percent of new sessions, two decimals
    reason: str | None  # None: takes its share; DRAINED: valid, weight 0; else the invalid ref's reason


def compute_split(refs: Sequence[SplitRef]) -> tuple[Share, ...]:
    merged: dict[tuple[str, int, str], int] = {}
    for r in refs:
        if r.weight < 0:
            raise ValueError(f"backendRef {r.backend}: weight {r.weight} is negative")
        key = (r.backend, -1 if r.port is None else r.port, r.reason or "")
        merged[key] = merged.get(key, 0) + r.weight
    keys = sorted(merged)
    total = sum(merged.values())
    units = dict.fromkeys(keys, 0)
    if total:
        exact = {k: merged[k] * _UNITS / total for k in keys}
        for k in keys:
            units[k] = int(exact[k])
        left = _UNITS - sum(units.values())
        # largest remainder first, ties by key: deterministic and independent of the refs' order
        for k in sorted(keys, key=lambda k: (-(exact[k] - units[k]), k))[:left]:
            units[k] += 1
    ports: dict[str, set[int]] = {}
    for backend, port, _ in keys:
        ports.setdefault(backend, set()).add(port)
    out = []
    for k in keys:
        backend, port, reason = k
        name = backend if len(ports[backend]) == 1 or port < 0 else f"{backend}:{port}"
        weight = merged[k]
        why = reason or (DRAINED if weight == 0 else None)
        out.append(Share(name, None if port < 0 else port, weight, units[k] / 100, why))
    return tuple(out)
