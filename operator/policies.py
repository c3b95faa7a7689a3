"""MeshAuthorizationPolicy status and the MeshNode counts (pure): what the operator writes about policies.

The operator validates policies and reports; it does not compile them (each node's sidecar reads the policies and
compiles those of its local Services, `aether.xds.translate.eastwest.rbac`). Both use `aether.api.authz.check`, so
what a policy's status says is what the sidecars enforce.

- `policy_status`: conditions `Accepted` (True: Accepted or DenyAll; False: NoTargets, InvalidSource, TooManyRules,
  InvalidSpec) and `ResolvedRefs` (False: ServiceNotFound, PortNotFound), `services` (the existing Services it
  selects, `<ns>/<name>`), `errors` (every problem, each naming its field), `observedGeneration`.
- `node_counts`: per node, `status.authorization` of its MeshNode: `guardedServices` (Services with an endpoint, ready
  or not, on a pod of the node that a policy targets), `policies` (the policies targeting them), `notAccepted` (of those,
  the ones failing closed).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from aether.api import authz
from aether.api.naming import ref
from aether.operator.reconcile.views import PodView, ServiceView, SliceView

MAX_MESSAGE = 2000


def _condition(type_: str, ok: bool, reason: str, message: str, generation: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type_, "status": "True" if ok else "False", "reason": reason, "message": message}
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def _generation(body: Mapping[str, Any]) -> int | None:
    gen = (body.get("metadata") or {}).get("generation")
    return gen if isinstance(gen, int) else None


def policy_status(body: Mapping[str, Any], services: Mapping[str, ServiceView], trust_domain: str) -> dict[str, Any]:
    """The status of one policy; `services`: the Services of its namespace by name."""
    generation = _generation(body)
    try:
        policy = authz.parse_policy(body, "spec")
    except authz.PolicyParseError as exc:
        msg = f"does not fit the schema: {exc}; it allows nothing (fails closed)"[:MAX_MESSAGE]
        return {
            "observedGeneration": generation,
            "conditions": [_condition("Accepted", False, authz.INVALID_SPEC, msg, generation)],
            "services": [ref(exc.namespace or "", t) for t in exc.targets if t in services],
            "errors": [str(exc)],
        }
    ns = policy.metadata.namespace
    verdict = authz.check(policy, trust_domain)
    errors = list(verdict.errors)
    found = [name for name in verdict.services if name in services]
    missing = [name for name in verdict.services if name not in services]
    resolution: list[str] = [f"Service {ref(ns, n)} does not exist (the policy applies once it does)" for n in missing]
    ports = sorted({p for rule in policy.spec.rules for p in rule.ports})
    have = {p.port for n in found for p in services[n].ports}
    absent = [p for p in ports if p not in have] if found else []
    if absent:
        resolution.append(f"port(s) {', '.join(map(str, absent))} are ports of no selected Service")
    if verdict.accepted:
        if verdict.reason == authz.DENY_ALL:
            message = f"no rules: every caller of {', '.join(verdict.services)} is denied"
        else:
            sources = sum(len(r.sources) for r in policy.spec.rules)
            message = f"{len(policy.spec.rules)} rule(s), {sources} source(s); everything else is denied"
    else:
        message = f"{len(errors)} error(s), it allows nothing (fails closed): " + "; ".join(errors)
    if missing:
        resolved = _condition("ResolvedRefs", False, authz.SERVICE_NOT_FOUND, "; ".join(resolution), generation)
    elif absent:
        resolved = _condition("ResolvedRefs", False, authz.PORT_NOT_FOUND, "; ".join(resolution), generation)
    else:
        selected = ", ".join(ref(ns, n) for n in found) or "nothing"
        resolved = _condition("ResolvedRefs", True, authz.RESOLVED, f"selects {selected}", generation)
    return {
        "observedGeneration": generation,
        "conditions": [
            _condition("Accepted", verdict.accepted, verdict.reason, message[:MAX_MESSAGE], generation),
            resolved,
        ],
        "services": [ref(ns, n) for n in found],
        "errors": [*errors, *resolution],
    }


def same_status(current: Any, want: Mapping[str, Any]) -> bool:
    """Whether a stored status already says `want` (condition transition times aside)."""
    if not isinstance(current, Mapping):
        return False
    strip = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in current.get("conditions") or []]
    return dict(current, conditions=strip) == dict(want)


def with_times(want: Mapping[str, Any], current: Any, now: str) -> dict[str, Any]:
    """`want` with each condition's lastTransitionTime kept while its status is unchanged."""
    old = {}
    if isinstance(current, Mapping):
        old = {c.get("type"): c for c in current.get("conditions") or [] if isinstance(c, Mapping)}
    out = dict(want)
    conds = []
    for c in want.get("conditions", []):
        prev = old.get(c["type"])
        keep = prev.get("lastTransitionTime") if prev and prev.get("status") == c["status"] else None
        conds.append({**c, "lastTransitionTime": keep or now})
    out["conditions"] = conds
    return out


def node_counts(
    policies: Iterable[authz.CompiledPolicy],
    pods: Iterable[PodView],
    slices: Iterable[SliceView],
    nodes: Iterable[str],
) -> dict[str, dict[str, int]]:
    """`status.authorization` for each of `nodes`."""
    targeted: dict[tuple[str, str], list[authz.CompiledPolicy]] = defaultdict(list)
    for p in policies:
        for svc in p.services:
            targeted[(p.namespace, svc)].append(p)
    where = {(p.namespace, p.name): p.node for p in pods if p.node}
    guarded: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for sl in slices:
        key = (sl.namespace, sl.service or "")
        if key not in targeted:
            continue
        for ep in sl.endpoints:
            node = where.get((sl.namespace, ep.pod or ""))
            if node:  # ready or not: a policy guards every pod of the Service
                guarded[node].add(key)
    out = {}
    for node in nodes:
        refs = {(p.namespace, p.name): p for key in guarded.get(node, ()) for p in targeted[key]}
        out[node] = {
            "guardedServices": len(guarded.get(node, ())),
            "policies": len(refs),
            "notAccepted": sum(1 for p in refs.values() if not p.accepted),
        }
    return out
