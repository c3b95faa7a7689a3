"""Typed views of the Gateway API objects the operator reads (UDPRoute, ReferenceGrant), parsed tolerantly:
a field that cannot be used becomes a `problem`, never an exception."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aether.operator.reconcile.views import (
    GATEWAY_GROUP,
    MAX_BACKEND_REFS,
    MAX_PARENT_REFS,
    Raw,
    _d,
    _l,
    _meta,
    _port,
    _s,
)


@dataclass(frozen=True, slots=True)
class ParentRef:
    """A parentRef as written (echoed back in status) and whether it names a Service (ours)."""

    group: str
    kind: str
    name: str
    namespace: str | None
    port: int | None
    section_name: str | None
    problem: str | None = None

    @property
    def ours(self) -> bool:
        return self.kind == "Service" and self.group in ("", "core")

    def echo(self) -> Raw:
        out: Raw = {"group": self.group, "kind": self.kind, "name": self.name}
        if self.namespace is not None:
            out["namespace"] = self.namespace
        if self.port is not None:
            out["port"] = self.port
        if self.section_name is not None:
            out["sectionName"] = self.section_name
        return out


@dataclass(frozen=True, slots=True)
class BackendRef:
    group: str
    kind: str
    name: str
    namespace: str
    port: int | None
    weight: int
    problem: str | None = None  # a value problem (weight, port, name) found while parsing

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class RouteView:
    namespace: str
    name: str
    generation: int
    created: str
    parents: tuple[ParentRef, ...]
    backends: tuple[BackendRef, ...]
    problems: tuple[str, ...] = ()
    # Compared (not hashed): kopf's index keeps its old value when the new one compares equal, and the reconciler
    # compares the index's status.parents with what it computes. A view equal without them kept a stale copy, so
    # after a restart (the index filled with the written status) a wipe of status.parents was never seen.
    status_parents: tuple[Raw, ...] = field(default=(), hash=False)
    uid: str = field(default="", hash=False)
    rules: int = 1  # len(spec.rules): v1 admits one, v1alpha2 up to 16 (their backendRefs are pooled)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def order(self) -> tuple[str, str]:
        """Conflict order (Gateway API): the oldest creationTimestamp wins, then `{namespace}/{name}` alphabetically
        (as one string: `a-b/x` sorts before `a/y`)."""
        return (self.created, f"{self.namespace}/{self.name}")


def _parent_ref(raw: Any, i: int) -> ParentRef:
    if not isinstance(raw, dict):
        return ParentRef("", "Service", "", None, None, None, f"spec.parentRefs[{i}] is not an object")
    group = raw.get("group", GATEWAY_GROUP)
    kind = raw.get("kind", "Gateway")
    name = raw.get("name")
    problem = None
    if not isinstance(group, str) or not isinstance(kind, str):
        problem = f"spec.parentRefs[{i}] group/kind must be strings"
        group, kind = "", "Service"
    if not isinstance(name, str) or not name:
        problem = problem or f"spec.parentRefs[{i}].name is missing"
        name = ""
    port = raw.get("port")
    if port is not None and _port(port) is None:
        problem = problem or f"spec.parentRefs[{i}].port {port!r} is not a port number"
        port = None
    ns = raw.get("namespace")
    section = raw.get("sectionName")
    return ParentRef(
        group,
        kind,
        name,
        ns if isinstance(ns, str) and ns else None,
        port,
        section if isinstance(section, str) and section else None,
        problem,
    )


def _backend_ref(raw: Any, route_ns: str, where: str) -> BackendRef:
    if not isinstance(raw, dict):
        return BackendRef("", "Service", "", route_ns, None, 1, f"{where} is not an object")
    group, kind = raw.get("group", ""), raw.get("kind", "Service")
    name, ns = raw.get("name"), raw.get("namespace", route_ns)
    weight, port = raw.get("weight", 1), raw.get("port")
    problem = None
    if not isinstance(group, str) or not isinstance(kind, str):
        problem, group, kind = f"{where} group/kind must be strings", "", "Service"
    if not isinstance(name, str) or not name:
        problem, name = problem or f"{where}.name is missing", ""
    if not isinstance(ns, str) or not ns:
        problem, ns = problem or f"{where}.namespace must be a non-empty string", route_ns
    if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= 1_000_000:
        problem, weight = problem or f"{where}.weight {weight!r} is not an integer in [0, 1000000]", 0
    if port is not None and _port(port) is None:
        problem, port = problem or f"{where}.port {port!r} is not a port number", None
    return BackendRef(group, kind, name, ns, port, weight, problem)


def parse_route(obj: Raw) -> RouteView:
    meta, spec = _meta(obj), obj.get("spec")
    ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    problems: list[str] = []
    if not isinstance(spec, dict):
        problems.append("spec is missing or not an object")
        spec = {}
    raw_parents = spec.get("parentRefs")
    if not isinstance(raw_parents, list) or not raw_parents:
        problems.append("spec.parentRefs is missing or empty")
        raw_parents = []
    if len(raw_parents) > MAX_PARENT_REFS:
        problems.append(f"spec.parentRefs has {len(raw_parents)} entries; at most {MAX_PARENT_REFS}")
        raw_parents = raw_parents[:MAX_PARENT_REFS]
    parents = tuple(_parent_ref(p, i) for i, p in enumerate(raw_parents))
    backends: list[BackendRef] = []
    raw_rules = spec.get("rules")
    if not isinstance(raw_rules, list):
        problems.append("spec.rules is missing or not a list")
        raw_rules = []
    total = sum(len(_l(_d(r).get("backendRefs"))) for r in raw_rules)
    if total > MAX_BACKEND_REFS:
        problems.append(f"{total} backendRefs; at most {MAX_BACKEND_REFS} are supported")
    else:
        for ri, rule in enumerate(raw_rules):
            refs = _d(rule).get("backendRefs")
            if not isinstance(refs, list):
                problems.append(f"spec.rules[{ri}].backendRefs is missing or not a list")
                continue
            for bi, b in enumerate(refs):
                backends.append(_backend_ref(b, ns, f"spec.rules[{ri}].backendRefs[{bi}]"))
    if not backends and not problems:
        problems.append("the route has no backendRefs")
    generation = meta.get("generation")
    status_parents = tuple(p for p in _l(_d(obj.get("status")).get("parents")) if isinstance(p, dict))
    return RouteView(
        ns,
        name,
        generation if isinstance(generation, int) else 0,
        str(meta.get("creationTimestamp") or ""),
        parents,
        tuple(backends),
        tuple(problems),
        status_parents,
        str(meta.get("uid") or ""),
        len(raw_rules),
    )


@dataclass(frozen=True, slots=True)
class GrantView:
    namespace: str
    name: str
    from_: tuple[tuple[str, str, str], ...]  # (group, kind, namespace)
    to: tuple[tuple[str, str, str | None], ...]  # (group, kind, name or None = any)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def permits(self, route_ns: str, service: str) -> bool:
        src = any(g == GATEWAY_GROUP and k == "UDPRoute" and n == route_ns for g, k, n in self.from_)
        dst = any(g in ("", "core") and k == "Service" and n in (None, service) for g, k, n in self.to)
        return src and dst


def parse_grant(obj: Raw) -> GrantView:
    meta, spec = _meta(obj), _d(obj.get("spec"))
    from_ = tuple(
        (str(f.get("group", "")), str(f.get("kind", "")), str(f.get("namespace", "")))
        for f in map(_d, _l(spec.get("from")))
    )
    to = tuple(
        (str(t.get("group", "")), str(t.get("kind", "")), _s(t.get("name"))) for t in map(_d, _l(spec.get("to")))
    )
    return GrantView(str(meta.get("namespace", "")), str(meta.get("name", "")), from_, to)
