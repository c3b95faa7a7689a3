"""labelSelector and fieldSelector, the subset clients use: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`,
`k notin (a,b)`; fields `metadata.name` and `metadata.namespace`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_SET = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split(expr: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _term(term: str) -> tuple[str, str, tuple[str, ...]]:
    m = _SET.match(term)
    if m:
        return m.group(1), m.group(2), tuple(v.strip() for v in m.group(3).split(",") if v.strip())
    if "!=" in term:
        k, v = term.split("!=", 1)
        return k.strip(), "!=", (v.strip(),)
    if "==" in term:
        k, v = term.split("==", 1)
        return k.strip(), "=", (v.strip(),)
    if "=" in term:
        k, v = term.split("=", 1)
        return k.strip(), "=", (v.strip(),)
    if term.startswith("!"):
        return term[1:].strip(), "!", ()
    return term, "exists", ()


def _ok(values: dict[str, Any], key: str, op: str, want: tuple[str, ...]) -> bool:
    have = values.get(key)
    if op == "=":
        return have is not None and str(have) == want[0]
    if op == "!=":
        return have is None or str(have) != want[0]
    if op == "in":
        return have is not None and str(have) in want
    if op == "notin":
        return have is None or str(have) not in want
    if op == "!":
        return key not in values
    return key in values


@dataclass(frozen=True)
class Selector:
    labels: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    fields: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    @classmethod
    def parse(cls, label_selector: str | None, field_selector: str | None) -> Selector:
        return cls(
            tuple(_term(t) for t in _split(label_selector or "")),
            tuple(_term(t) for t in _split(field_selector or "")),
        )

    def matches(self, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        if not all(_ok(labels, k, op, v) for k, op, v in self.labels):
            return False
        fields = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace")}
        fields = {k: v for k, v in fields.items() if v is not None}
        return all(_ok(fields, k, op, v) for k, op, v in self.fields)
