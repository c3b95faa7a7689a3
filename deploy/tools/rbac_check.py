"""RBAC as pure functions: does a set of ClusterRole rules allow an API request, and is a role wildcard-free.

A request is (verb, apiGroup, resource, subresource), the way the API server's authorizer sees it (`list`
vs `watch` by the `watch` query, `patch` on `meshnodes` + `status` for the status subresource). This
follows Kubernetes' own rule matching (rbac/v1 `PolicyRule`): verb, apiGroup and resource must each be
listed or `*`; a subresource is named `resource/subresource`; `*/sub` matches that subresource of any
resource; a rule with `resourceNames` only matches requests for those names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

WILDCARD = "*"


class Request(NamedTuple):
    verb: str
    group: str
    resource: str
    subresource: str = ""
    name: str = ""


def _resource_matches(rule_resources: Sequence[str], resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for r in rule_resources:
        if r in (WILDCARD, combined):
            return True
        if subresource and r == f"*/{subresource}":
            return True
    return False


def rule_allows(rule: Mapping[str, Any], req: Request) -> bool:
    if rule.get("nonResourceURLs"):
        return False
    verbs = rule.get("verbs") or []
    groups = rule.get("apiGroups") or []
    if not (WILDCARD in verbs or req.verb in verbs):
        return False
    if not (WILDCARD in groups or req.group in groups):
        return False
    if not _resource_matches(rule.get("resources") or [], req.resource, req.subresource):
        return False
    names = rule.get("resourceNames") or []
    return not names or (bool(req.name) and req.name in names)


def allows(rules: Iterable[Mapping[str, Any]], req: Request) -> bool:
    return any(rule_allows(r, req) for r in rules)


def denied(rules: Sequence[Mapping[str, Any]], requests: Iterable[Request]) -> list[Request]:
    """The requests the rules do not allow, sorted, without duplicates."""
    return sorted({r for r in requests if not allows(rules, r)})


def wildcards(rules: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every wildcard in verbs, apiGroups or resources (including `*/sub` and `res/*`), as readable strings."""
    found: list[str] = []
    for i, rule in enumerate(rules):
        for field in ("verbs", "apiGroups", "resources", "nonResourceURLs"):
            for value in rule.get(field) or []:
                if WILDCARD in str(value):
                    found.append(f"rule {i}: {field} contains {value!r}")
    return found
