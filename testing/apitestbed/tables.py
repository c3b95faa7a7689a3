"""Server-side printing (`kubectl get` asks for a meta.k8s.io/v1 Table) for CRDs with additionalPrinterColumns,
with the small JSONPath subset printer columns use: `.a.b`, `[N]`, `[?(@.k=="v")]`."""

from __future__ import annotations

import datetime
import re
from typing import Any

_FILTER = re.compile(r'^\?\(@\.([A-Za-z0-9_]+)\s*==\s*["\']([^"\']*)["\']\)$')


def _tokens(path: str) -> list[str]:
    out: list[str] = []
    for part in re.findall(r"\[[^\]]*\]|[^.\[]+", path.strip().lstrip(".")):
        out.append(part)
    return out


def jsonpath(obj: Any, path: str) -> Any:
    values = [obj]
    for tok in _tokens(path):
        nxt: list[Any] = []
        for v in values:
            if tok.startswith("["):
                inner = tok[1:-1]
                m = _FILTER.match(inner)
                if m and isinstance(v, list):
                    nxt += [x for x in v if isinstance(x, dict) and str(x.get(m.group(1))) == m.group(2)]
                elif inner.isdigit() and isinstance(v, list) and int(inner) < len(v):
                    nxt.append(v[int(inner)])
                elif inner == "*" and isinstance(v, list):
                    nxt += v
            elif isinstance(v, dict) and tok in v:
                nxt.append(v[tok])
        values = nxt
    if not values:
        return None
    return values[0] if len(values) == 1 else ",".join(str(x) for x in values)


def _age(stamp: Any) -> str:
    try:
        then = datetime.datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return "<unknown>"
    secs = int((datetime.datetime.now(tz=datetime.UTC) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size * 2:
            return f"{secs // size}{unit}"
    return f"{max(secs, 0)}s"


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def table(columns: tuple[tuple[str, str, str], ...], items: list[dict[str, Any]], rv: str) -> dict[str, Any]:
    """columns: (name, type, jsonPath) from a CRD version's additionalPrinterColumns."""
    defs = [{"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}]
    defs += [
        {"name": n, "type": "string" if t == "date" else t, "format": "", "description": "", "priority": 0}
        for n, t, _ in columns
    ]
    rows = []
    for item in items:
        cells: list[Any] = [item.get("metadata", {}).get("name")]
        for _, t, path in columns:
            value = jsonpath(item, path)
            cells.append(_age(value) if t == "date" and value is not None else value)
        meta = {k: v for k, v in (item.get("metadata") or {}).items() if k != "managedFields"}
        rows.append(
            {
                "cells": cells,
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta},
            }
        )
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
        "columnDefinitions": defs,
        "rows": rows,
    }
