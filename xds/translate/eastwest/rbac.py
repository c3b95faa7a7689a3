"""Authorization by identity at the destination's inbound: MeshAuthorizationPolicies -> Envoy RBAC HTTP filters (pure).

Identity is the peer certificate's one URI SAN, nothing else. Every inbound HTTP connection manager (h2 and HTTP/3
alike) runs two RBAC filters before the router, both written with Envoy's matcher API on
`envoy.matching.inputs.uri_san` (`UriSanInput`: the verified peer certificate's URI SANs joined by ","; it never
reads DNS SANs or the subject, which `authenticated.principal_name` falls back to):

1. `ID_FILTER` (`aether.rbac.spiffe_id`), the same everywhere: the request goes on only if that input is exactly one
   well-formed SPIFFE ID of the trust domain (`spiffe://<td>/ns/<namespace>/sa/<serviceaccount>`, Kubernetes names,
   no ","), else it is denied as `ID_DENY` (`aether:not-one-spiffe-id`). Its stats and dynamic metadata keys carry
   the prefix `ID_PREFIX` (`http.<hcm>.rbac.spiffe_id_denied`, `spiffe_id_enforced_engine_result`), so a
   certificate refused for its shape is counted apart from a caller refused by a policy.
2. `RBAC_FILTER` (`envoy.filters.http.rbac`), with no rules of its own (it passes everything); its route carries
   the rules where a policy guards the port (`RBACPerRoute` on the route of `inbound.route_configs`, served over
   RDS, so a policy change is a route update: no listener drains, established connections stay).

`inbound_rbac(policies, pods, guarded)` gives, for each local pod and app port a policy applies to, that route's RBAC:
- The local Services: the guarded Services (`plan.guarded`: the node's QUIC destinations and ineligible Services,
  each with every endpoint IP whatever its conditions) on the pod's IP, in the pod's namespace. A pod port is guarded
  when a policy targets any of them that has this port; then only what those policies' rules allow on that port gets
  through (deny by default, `POLICY_DENY`, `aether:no-policy-allows`), whatever Service name the caller dialled.
- One matcher per MeshAuthorizationPolicy, its action named `<namespace>/<name>` (Envoy logs it as the effective
  policy id), matching the union of the rules' sources that cover the port: the joined URI SANs equal to the ID, or
  for `.../ns/<ns>/sa/*` any one ServiceAccount name of that namespace (a regular expression without ",", so a second
  URI SAN never rides along).
- A policy that targets its own Namespace (`CompiledPolicy.namespace_wide`; from `ROOT_NAMESPACE`, the whole mesh)
  guards every local pod of the namespace on every app port, whether or not a Service names the pod; with no rules
  it is the default-deny (Istio's allow-nothing policy): only what another policy on the pod and port allows passes.
- A policy that is not Accepted has no rules: it allows nothing and still guards its Services (fails closed).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

from envoy.extensions.matching.common_inputs.ssl.v3 import ssl_inputs_pb2  # noqa: F401  (registers UriSanInput)

from aether.api.authz import CompiledPolicy
from aether.xds.resources import TYPE_URL_PREFIX
from aether.xds.translate.eastwest.plan import Guarded, LocalPod

RBAC_FILTER: Final = "envoy.filters.http.rbac"
ID_FILTER: Final = "aether.rbac.spiffe_id"
RBAC_TYPE: Final = TYPE_URL_PREFIX + "envoy.extensions.filters.http.rbac.v3.RBAC"
RBAC_PER_ROUTE_TYPE: Final = TYPE_URL_PREFIX + "envoy.extensions.filters.http.rbac.v3.RBACPerRoute"
RBAC_ACTION_TYPE: Final = TYPE_URL_PREFIX + "envoy.config.rbac.v3.Action"
URI_SAN_INPUT_TYPE: Final = TYPE_URL_PREFIX + "envoy.extensions.matching.common_inputs.ssl.v3.UriSanInput"
RBAC_METADATA: Final = "envoy.filters.http.rbac"  # dynamic metadata namespace (enforced_engine_result, ...)
ID_PREFIX: Final = "spiffe_id_"  # the identity filter's stats and metadata keys
ID_ALLOW: Final = "aether:spiffe-id"
ID_DENY: Final = "aether:not-one-spiffe-id"
POLICY_DENY: Final = "aether:no-policy-allows"
# RE2 (Envoy's safe_regex, a full match): Kubernetes names, never "," (UriSanInput's separator) nor "/"
NAMESPACE_RE: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
SERVICE_ACCOUNT_RE: Final = r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?"
# the policy filter: no rules of its own (passes everything) unless the route's RBACPerRoute carries some
BASE_FILTER: Final[dict[str, Any]] = {"name": RBAC_FILTER, "typed_config": {"@type": RBAC_TYPE}}


def action(name: str, verdict: str) -> dict[str, Any]:
    return {"action": {"name": name, "typed_config": {"@type": RBAC_ACTION_TYPE, "name": name, "action": verdict}}}


def uri_san_is(value_match: dict[str, Any]) -> dict[str, Any]:
    """A predicate on the peer certificate's URI SANs, all of them joined by ","."""
    return {
        "single_predicate": {
            "input": {"name": "uri-san", "typed_config": {"@type": URI_SAN_INPUT_TYPE}},
            "value_match": value_match,
        }
    }


def regex(pattern: str) -> dict[str, Any]:
    return {"safe_regex": {"google_re2": {}, "regex": pattern}}


def source_match(source: str) -> dict[str, Any]:
    """The value match of one policy source: exactly the ID, or one ServiceAccount of the namespace for `/sa/*`."""
    if source.endswith("/sa/*"):
        return regex(re.escape(source[:-1]) + SERVICE_ACCOUNT_RE)
    return {"exact": source}


def one_spiffe_id(trust_domain: str) -> str:
    """Exactly one URI SAN, a SPIFFE ID of the trust domain in the mesh's shape."""
    return re.escape(f"spiffe://{trust_domain}/ns/") + NAMESPACE_RE + "/sa/" + SERVICE_ACCOUNT_RE


def id_filter(trust_domain: str) -> dict[str, Any]:
    """The first RBAC filter of every inbound HCM: exactly one SPIFFE ID of the trust domain, or 403."""
    matcher = {
        "matcher_list": {
            "matchers": [
                {"predicate": uri_san_is(regex(one_spiffe_id(trust_domain))), "on_match": action(ID_ALLOW, "ALLOW")}
            ]
        },
        "on_no_match": action(ID_DENY, "DENY"),
    }
    return {"name": ID_FILTER, "typed_config": {"@type": RBAC_TYPE, "matcher": matcher, "rules_stat_prefix": ID_PREFIX}}


def http_filters(trust_domain: str) -> list[dict[str, Any]]:
    """The RBAC filters of every inbound HCM, in order, before the router."""
    return [id_filter(trust_domain), BASE_FILTER]


def local_services(pod: LocalPod, services: Sequence[Guarded]) -> list[Guarded]:
    """The Services of the pod's namespace with an endpoint on the pod (the Services it backs, ready or not)."""
    return [g for g in services if g.namespace == pod.namespace and any(a in g.ips for a in pod.addresses)]


def guarding(policies: Sequence[CompiledPolicy], services: Sequence[Guarded], port: int) -> list[CompiledPolicy]:
    """The policies that target one of `services` having `port`."""
    names = {d.service for d in services if port in d.ports}
    return [p for p in policies if names.intersection(p.services) and p.namespace == services[0].namespace]


def _sources(policy: CompiledPolicy, port: int) -> list[str]:
    sources: list[str] = []
    for rule in policy.rules:
        if not rule.ports or port in rule.ports:
            sources += [s for s in rule.sources if s not in sources]
    return sources


def rbac_config(policies: Sequence[CompiledPolicy], port: int) -> dict[str, Any]:
    """The RBAC message of one guarded port: one matcher per policy allowing its sources, else `POLICY_DENY`."""
    matchers = []
    for p in sorted(policies, key=lambda p: p.ref):
        predicates = [uri_san_is(source_match(s)) for s in _sources(p, port)]
        if predicates:
            predicate = predicates[0] if len(predicates) == 1 else {"or_matcher": {"predicate": predicates}}
            matchers.append({"predicate": predicate, "on_match": action(p.ref, "ALLOW")})
    matcher: dict[str, Any] = {"on_no_match": action(POLICY_DENY, "DENY")}
    if matchers:
        matcher["matcher_list"] = {"matchers": matchers}
    return {"matcher": matcher}


def allowed_by(config: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """policy ref -> its value matches, from an RBAC message `rbac_config` built (what tests read back)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for m in config["matcher"].get("matcher_list", {}).get("matchers", []):
        pred = m["predicate"]
        preds = pred["or_matcher"]["predicate"] if "or_matcher" in pred else [pred]
        out[m["on_match"]["action"]["name"]] = [p["single_predicate"]["value_match"] for p in preds]
    return out


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
        wide = [p for p in policies if p.covers_namespace(pod.namespace)]
        if not mine and not wide:
            continue
        for port in pod.app_ports:
            chosen = wide + [p for p in (guarding(policies, mine, port) if mine else []) if p not in wide]
            if chosen:
                out[(pod.uid, port)] = rbac_config(chosen, port)
    return out


def counts(table: dict[tuple[str, int], dict[str, Any]]) -> dict[str, int]:
    """How many pod ports are guarded and how many RBAC policies they carry (the sidecar logs them)."""
    return {"guardedPorts": len(table), "rbacPolicies": sum(len(allowed_by(f)) for f in table.values())}
