"""Authorization by identity at the destination's inbound: MeshAuthorizationPolicies -> Envoy RBAC HTTP filters (pure).

`inbound_rbac(policies, pods, guarded)` gives, for each local pod and app port a policy applies to, the RBAC
rules its inbound route carries (`RBACPerRoute` on the route of `inbound.route_configs`, served over RDS, so a
policy change is a route update: no listener drains, established connections stay). Every inbound HTTP connection
manager (h2 and HTTP/3 alike) runs `envoy.filters.http.rbac` before the router, without rules of its own: where no
policy applies it passes everything (today's behaviour: any SPIFFE ID of the trust domain, the TLS context's check).

- The local Services: the guarded Services (`plan.guarded`: the node's QUIC destinations and ineligible Services,
  each with every endpoint IP whatever its conditions) on the pod's IP, in the pod's namespace. A pod port is guarded when a policy targets any of them that has this port; then only what those
  policies' rules allow on that port gets through (deny by default), whatever Service name the caller dialled.
- One RBAC policy per MeshAuthorizationPolicy, named `<namespace>/<name>` (Envoy logs it as the effective policy
  id), its principals the union of the rules' sources that cover the port: `authenticated.principal_name`, which
  Envoy matches on the verified peer certificate's URI SAN (exact, or a prefix for `.../ns/<ns>/sa/*`).
- A policy that is not Accepted has no rules: it allows nothing and still guards its Services (fails closed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from aether.api.authz import CompiledPolicy
from aether.xds.translate.eastwest.plan import Guarded, LocalPod

RBAC_FILTER: Final = "envoy.filters.http.rbac"
RBAC_TYPE: Final = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
RBAC_PER_ROUTE_TYPE: Final = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBACPerRoute"
RBAC_METADATA: Final = "envoy.filters.http.rbac"  # dynamic metadata namespace (enforced_engine_result, ...)
# in every inbound HCM: no rules (passes everything) unless the route's RBACPerRoute carries some
BASE_FILTER: Final[dict[str, Any]] = {"name": RBAC_FILTER, "typed_config": {"@type": RBAC_TYPE}}


def principal(source: str) -> dict[str, Any]:
    matcher = {"prefix": source[:-1]} if source.endswith("/sa/*") else {"exact": source}
    return {"authenticated": {"principal_name": matcher}}


def local_services(pod: LocalPod, services: Sequence[Guarded]) -> list[Guarded]:
    """The Services of the pod's namespace with an endpoint on the pod (the Services it backs, ready or not)."""
    return [g for g in services if g.namespace == pod.namespace and pod.ip in g.ips]


def guarding(policies: Sequence[CompiledPolicy], services: Sequence[Guarded], port: int) -> list[CompiledPolicy]:
    """The policies that target one of `services` having `port`."""
    names = {d.service for d in services if port in d.ports}
    return [p for p in policies if names.intersection(p.services) and p.namespace == services[0].namespace]


def rbac_config(policies: Sequence[CompiledPolicy], port: int) -> dict[str, Any]:
    envoy_policies: dict[str, Any] = {}
    for p in sorted(policies, key=lambda p: p.ref):
        sources: list[str] = []
        for rule in p.rules:
            if not rule.ports or port in rule.ports:
                sources += [s for s in rule.sources if s not in sources]
        if sources:
            envoy_policies[p.ref] = {"permissions": [{"any": True}], "principals": [principal(s) for s in sources]}
    return {"rules": {"action": "ALLOW", "policies": envoy_policies}}


def per_route(config: dict[str, Any]) -> dict[str, Any]:
    """The route's `typed_per_filter_config` entry carrying `config` (an RBAC message)."""
    return {RBAC_FILTER: {"@type": RBAC_PER_ROUTE_TYPE, "rbac": config}}


def inbound_rbac(
    policies: Sequence[CompiledPolicy], pods: Sequence[LocalPod], services: Sequence[Guarded]
) -> dict[tuple[str, int], dict[str, Any]]:
    """(pod uid, app port) -> the RBAC message (rules) for that port's inbound route; absent: no policy applies."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    if not policies:
        return out
    for pod in pods:
        mine = local_services(pod, services)
        if not mine:
            continue
        for port in pod.app_ports:
            chosen = guarding(policies, mine, port)
            if chosen:
                out[(pod.uid, port)] = rbac_config(chosen, port)
    return out


def counts(table: dict[tuple[str, int], dict[str, Any]]) -> dict[str, int]:
    """How many pod ports are guarded and how many RBAC policies they carry (the sidecar logs them)."""
    return {
        "guardedPorts": len(table),
        "rbacPolicies": sum(len(f["rules"]["policies"]) for f in table.values()),
    }
