"""MeshAuthorizationPolicy status and the MeshNode counts (pure): what the operator writes about policies.

The operator validates policies and reports; it does not compile them (each node's sidecar reads the policies and
compiles those of its local Services, `aether.xds.translate.eastwest.rbac`). Both use `aether.api.authz.check`, so
what a policy's status says is what the sidecars enforce.

- `policy_status`: conditions `Accepted` (True: Accepted or DenyAll; False: NoTargets, InvalidSource, TooManyRules,
  InvalidSpec) and `ResolvedRefs` (False: ServiceNotFound, PortNotFound), `services` (the existing Services it
  selects, `<ns>/<name>`), `errors` (every problem, each naming its field), `observedGeneration`.
- `node_counts`: per node, `status.authorization` of its MeshNode: `guardedServices` (Services a policy applies to
  that are bound to a pod of the node: an endpoint of their EndpointSlices, ready or not, or a pod their selector
  selects, `bound_nodes`), `policies` (the policies applying to them: naming them, or their Namespace), `notAccepted`
  (of those, the ones failing closed).
- `unresolved`: the policies whose targets do not exist, with the message of their Warning Event.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
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
    scope = _scope(policy.metadata.namespace, verdict)
    if verdict.accepted:
        if verdict.reason == authz.DENY_ALL:
            message = f"no rules: every caller of {scope} is denied"
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
        if verdict.namespace_wide:
            selected = _scope(ns, verdict)
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


def _scope(ns: str, verdict: authz.Verdict) -> str:
    """What a policy applies to, in words."""
    parts = list(verdict.services)
    if verdict.namespace_wide:
        wide = "every pod of the mesh" if ns == authz.ROOT_NAMESPACE else f"every pod of namespace {ns}"
        parts.insert(0, wide)
    return ", ".join(parts) or "nothing"


def unresolved(status: Mapping[str, Any]) -> str | None:
    """The Warning Event's message for a policy status whose ResolvedRefs is ServiceNotFound, else None."""
    for c in status.get("conditions", []):
        if c["type"] == "ResolvedRefs" and c["reason"] == authz.SERVICE_NOT_FOUND:
            return f"{c['message']}; until then it opens nothing (a default-deny policy still denies)"
    return None


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


def bound_nodes(
    services: Iterable[ServiceView],
    pods: Iterable[PodView],
    slices: Iterable[SliceView],
    wanted: Callable[[tuple[str, str]], bool] = lambda _: True,
) -> dict[tuple[str, str], set[str]]:
    """(namespace, Service) -> the nodes of the pods bound to it: every endpoint of its EndpointSlices (ready or
    not) and every pod its selector selects (docs/identity.md, "which pods a policy guards"); only the Services
    `wanted` says (the ones a policy applies to)."""
    where: dict[tuple[str, str], str] = {}
    by_label: dict[tuple[str, str, str], set[PodView]] = defaultdict(set)
    for p in pods:
        if p.node:
            where[p.key] = p.node
        if p.node and p.ip and p.placed:  # what a selector selects (namespace.selected_ips)
            for k, v in p.labels:
                by_label[(p.namespace, k, v)].add(p)
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for sl in slices:
        key = (sl.namespace, sl.service or "")
        for ep in sl.endpoints if sl.service and wanted(key) else ():
            if node := where.get((sl.namespace, ep.pod or "")):
                out[key].add(node)
    for svc in services:
        if not svc.selector or not wanted(svc.key):
            continue
        sets = sorted((by_label.get((svc.namespace, k, v), set()) for k, v in svc.selector), key=len)
        for p in set(sets[0]).intersection(*sets[1:]):
            out[svc.key].add(where[p.key])
    return out


def node_counts(
    policies: Iterable[authz.CompiledPolicy],
    pods: Iterable[PodView],
    slices: Iterable[SliceView],
    nodes: Iterable[str],
    services: Iterable[ServiceView] = (),
) -> dict[str, dict[str, int]]:
    """`status.authorization` for each of `nodes`."""
    compiled = list(policies)
    targeted: dict[tuple[str, str], list[authz.CompiledPolicy]] = defaultdict(list)
    for p in compiled:
        for svc in p.services:
            targeted[(p.namespace, svc)].append(p)
    wide = [p for p in compiled if p.namespace_wide]
    mesh_wide = any(p.mesh_wide for p in wide)
    wide_ns = {p.namespace for p in wide}
    guarded: dict[str, set[tuple[str, str]]] = defaultdict(set)

    def wanted(key: tuple[str, str]) -> bool:
        return mesh_wide or key in targeted or key[0] in wide_ns

    for key, at in bound_nodes(services, pods, slices, wanted).items():
        applying = targeted.get(key, []) + [p for p in wide if p.covers_namespace(key[0])]
        if applying:
            targeted[key] = list(dict.fromkeys(applying))
            for node in at:
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
