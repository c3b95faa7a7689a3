"""Authorization by identity, the pure part: policy checks (aether.api.authz) and the compile to Envoy RBAC filters
(aether.xds.translate.eastwest.rbac), with a golden file for the inbound HTTP filters of a guarded pod."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from aether.api import authz
from aether.api.authz import MeshAuthorizationPolicy, check, compile_bodies
from aether.api.meshnode import Endpoint, IneligibleDestination
from aether.netns.contract import INBOUND_PORT
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.golden import check_golden, golden_json
from aether.xds.resources import LISTENER, ROUTE, Resources, TranslateOptions
from aether.xds.translate.eastwest.build import build
from aether.xds.translate.eastwest.rbac import (
    ID_FILTER,
    POLICY_DENY,
    RBAC_FILTER,
    RBAC_TYPE,
    SERVICE_ACCOUNT_RE,
    id_filter,
)

ROUTER_TYPE = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
URI_SAN = "type.googleapis.com/envoy.extensions.matching.common_inputs.ssl.v3.UriSanInput"

TD = "cluster.local"
CLIENT = f"spiffe://{TD}/ns/default/sa/client"
OTHER = f"spiffe://{TD}/ns/team-b/sa/client"
GOLDEN = Path(__file__).parent / "golden"


def policy(name: str = "web-callers", targets: list[str] | None = None, rules: Any = None, **kw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "targetRefs": [{"kind": "Service", "name": t} for t in (["web"] if targets is None else targets)]
    }
    spec["rules"] = [{"from": [CLIENT], "ports": [8080]}] if rules is None else rules
    spec.update(kw)
    return {
        "apiVersion": "mesh.aether.dev/v1alpha1",
        "kind": "MeshAuthorizationPolicy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def verdict(body: dict[str, Any]) -> authz.Verdict:
    return check(MeshAuthorizationPolicy.model_validate(body), TD)


def web_node() -> tuple[Any, Any]:
    """Node B: pod web-0 backing Services default/web (8080, 9090) and default/web-admin (9090)."""
    return sample_node(
        "node-b",
        [SamplePod("u-web", "web-0", "10.200.2.7", "web-sa", "/run/netns/web")],
        [
            SampleDestination("default/web", "web-sa", (8080, 9090), ("10.200.2.7",)),
            SampleDestination("default/web-admin", "web-sa", (9090,), ("10.200.2.7",)),
            SampleDestination("default/elsewhere", "web-sa", (8080,), ("10.200.9.9",)),
        ],
    )


def translate(*bodies: dict[str, Any]) -> Resources:
    node, records = web_node()
    return build(node, records, TranslateOptions(trust_domain=TD, authorization=compile_bodies(bodies, TD)))


def filters(res: Resources, listener: str = "inbound-h3:default/web-0") -> dict[str, list[dict[str, Any]]]:
    """chain name -> its HCM's http filters."""
    out = {}
    for chain in res[LISTENER][listener]["filterChains"]:
        out[chain["name"]] = chain["filters"][0]["typedConfig"]["httpFilters"]
    return out


def rbac_of(res: Resources, chain: str, listener: str = "inbound-h3:default/web-0") -> dict[str, Any] | None:
    """What the route of `chain` allows (RBACPerRoute): policy ref -> its URI SAN value matches; None without."""
    hcm = next(c for c in res[LISTENER][listener]["filterChains"] if c["name"] == chain)["filters"][0]["typedConfig"]
    route = res[ROUTE][hcm["rds"]["routeConfigName"]]["virtualHosts"][0]["routes"][0]
    per = route.get("typedPerFilterConfig", {}).get(RBAC_FILTER)
    if per is None:
        return None
    matcher = per["rbac"]["matcher"]
    assert matcher["onNoMatch"]["action"]["typedConfig"] == {
        "@type": "type.googleapis.com/envoy.config.rbac.v3.Action",
        "name": POLICY_DENY,
        "action": "DENY",
    }
    out = {}
    for m in matcher.get("matcherList", {}).get("matchers", []):
        pred = m["predicate"]
        preds = pred["orMatcher"]["predicate"] if "orMatcher" in pred else [pred]
        assert {p["singlePredicate"]["input"]["typedConfig"]["@type"] for p in preds} == {URI_SAN}
        out[m["onMatch"]["action"]["name"]] = [p["singlePredicate"]["valueMatch"] for p in preds]
    return out


def inbound_routes(res: Resources) -> dict[str, Any]:
    return {k: v for k, v in res[ROUTE].items() if k.startswith("inbound:")}


# -- checks -----------------------------------------------------------------------------------------------------
def test_a_plain_policy_is_accepted() -> None:
    v = verdict(policy())
    assert (v.accepted, v.reason, v.services, v.errors) == (True, authz.ACCEPTED, ("web",), ())


@pytest.mark.parametrize(
    ("body", "reason", "needle"),
    [
        (policy(targets=[]), authz.NO_TARGETS, "protects nothing"),
        (policy(rules=[{"from": ["*"]}]), authz.INVALID_SOURCE, "wildcard over every identity"),
        (policy(rules=[{"from": [f"spiffe://{TD}/*"]}]), authz.INVALID_SOURCE, "only the ServiceAccount"),
        (policy(rules=[{"from": [f"spiffe://{TD}/ns/*/sa/*"]}]), authz.INVALID_SOURCE, "not a namespace name"),
        (policy(rules=[{"from": ["cluster.local/ns/default/sa/client"]}]), authz.INVALID_SOURCE, "not a SPIFFE ID"),
        (policy(rules=[{"from": ["spiffe://evil.example/ns/default/sa/x"]}]), authz.INVALID_SOURCE, "trust domain"),
        (policy(rules=[{"from": [f"spiffe://{TD}/ns/default/sa/Bad_SA"]}]), authz.INVALID_SOURCE, "ServiceAccount"),
        (policy(rules=[{"from": [f"spiffe://{TD}/ns/default"]}]), authz.INVALID_SOURCE, "/ns/<namespace>/sa/"),
        (policy(rules=[{"from": []}]), authz.INVALID_SOURCE, "at least one source"),
        (policy(rules=[{"from": [CLIENT], "ports": [0]}]), authz.INVALID_SPEC, "not a port"),
        (
            policy(rules=[{"from": [f"spiffe://{TD}/ns/default/sa/s{i}"]} for i in range(1000)]),
            authz.TOO_MANY_RULES,
            "1000 rules, at most 64",
        ),
        (policy(targets=["web"], targetRefs=[{"kind": "Pod", "name": "x"}]), authz.ACCEPTED, "only Services"),
    ],
    ids=[
        "empty",
        "star",
        "td-wildcard",
        "ns-wildcard",
        "no-scheme",
        "foreign-td",
        "bad-sa",
        "short",
        "no-from",
        "port-0",
        "1000-rules",
        "pod-target",
    ],
)
def test_hostile_policies_each_get_a_clear_reason(body: dict[str, Any], reason: str, needle: str) -> None:
    v = verdict(body)
    assert not v.accepted
    if reason != authz.ACCEPTED:
        assert v.reason == reason, v
    assert any(needle in e for e in v.errors), v.errors


def test_no_rules_is_deny_all_and_accepted() -> None:
    v = verdict(policy(rules=[]))
    assert (v.accepted, v.reason) == (True, authz.DENY_ALL)


def test_a_body_that_does_not_fit_the_schema_still_closes_its_services() -> None:
    bad = policy()
    bad["spec"]["rules"] = [{"from": CLIENT, "ports": "all"}]
    (p,) = compile_bodies([bad], TD)
    assert (p.ref, p.services, p.rules, p.accepted) == ("default/web-callers", ("web",), (), False)
    assert compile_bodies([{"spec": {}}], TD) == ()  # nothing to name: skipped


# -- compile ----------------------------------------------------------------------------------------------------
def test_every_inbound_hcm_runs_the_identity_check_the_rule_less_rbac_filter_then_the_router_over_rds() -> None:
    ident = translate()[LISTENER]["inbound-h2:default/web-0"]["filterChains"][0]["filters"][0]["typedConfig"]
    ident = ident["httpFilters"][0]
    assert ident["name"] == ID_FILTER and ident["typedConfig"]["rulesStatPrefix"] == "spiffe_id_"
    assert ident["typedConfig"]["matcher"]["onNoMatch"]["action"]["name"] == "aether:not-one-spiffe-id"
    for res in (translate(), translate(policy())):
        for listener in ("inbound-h2:default/web-0", "inbound-h3:default/web-0"):
            for fs in filters(res, listener).values():
                assert fs == [
                    ident,
                    {"name": RBAC_FILTER, "typedConfig": {"@type": RBAC_TYPE}},
                    {"name": "envoy.filters.http.router", "typedConfig": {"@type": ROUTER_TYPE}},
                ]
    assert sorted(inbound_routes(translate())) == ["inbound:default/web-0:8080", "inbound:default/web-0:9090"]


def test_no_policy_no_rules_on_any_route() -> None:
    res = translate()
    for chain in ("port-8080", "port-9090", "primary"):
        assert rbac_of(res, chain) is None  # today's behaviour: any SPIFFE ID of the trust domain


def test_a_policy_change_changes_routes_only_never_a_listener() -> None:
    before, after = translate(), translate(policy())
    assert before[LISTENER] == after[LISTENER]
    assert inbound_routes(before) != inbound_routes(after)


def test_policy_guards_the_ports_of_its_service_on_both_listeners() -> None:
    res = translate(policy())
    for listener in ("inbound-h2:default/web-0", "inbound-h3:default/web-0"):
        assert rbac_of(res, "primary", listener) == rbac_of(res, "port-8080", listener)
    # the one URI SAN (all URI SANs joined by ",") equal to the source: never a DNS SAN or the subject
    assert rbac_of(res, "port-8080") == {"default/web-callers": [{"exact": CLIENT}]}
    # the rule names port 8080 only: on 9090 the policy guards and allows nothing (deny by default)
    assert rbac_of(res, "port-9090") == {}


def test_rules_merge_per_policy_and_a_namespace_wildcard_is_a_prefix() -> None:
    res = translate(
        policy(rules=[{"from": [CLIENT]}, {"from": [f"spiffe://{TD}/ns/team-b/sa/*", CLIENT], "ports": [9090]}]),
        policy("admin", targets=["web-admin"], rules=[{"from": [OTHER]}]),
    )
    rules = rbac_of(res, "port-9090")
    assert rules is not None
    assert list(rules) == ["default/admin", "default/web-callers"]
    team_b = r"spiffe://cluster\.local/ns/team\-b/sa/" + SERVICE_ACCOUNT_RE  # one name: no "," nor "/"
    assert rules["default/web-callers"] == [{"exact": CLIENT}, {"safeRegex": {"googleRe2": {}, "regex": team_b}}]
    assert list(rbac_of(res, "port-8080") or {}) == ["default/web-callers"]


def test_a_policy_only_on_another_service_of_the_pod_guards_only_that_services_ports() -> None:
    res = translate(policy("admin", targets=["web-admin"], rules=[{"from": [OTHER]}]))
    assert rbac_of(res, "port-8080") is None  # web-admin has no 8080: web's 8080 stays open to the trust domain
    assert rbac_of(res, "port-9090") is not None


def test_invalid_policy_fails_closed_on_its_service_and_nothing_else() -> None:
    res = translate(policy(rules=[{"from": ["*"]}]), policy("ok", targets=["web-admin"], rules=[{"from": [OTHER]}]))
    assert rbac_of(res, "port-8080") == {}
    nine = rbac_of(res, "port-9090")
    assert nine is not None and list(nine) == ["default/ok"]


def test_policies_of_other_namespaces_or_missing_services_do_nothing() -> None:
    other_ns = policy()
    other_ns["metadata"]["namespace"] = "team-b"
    assert translate(other_ns, policy("ghost", targets=["nope"])) == translate()


def test_golden_guarded_inbound_http_filters() -> None:
    res = translate(
        policy(rules=[{"from": [CLIENT], "ports": [8080]}, {"from": [f"spiffe://{TD}/ns/team-b/sa/*"]}]),
        policy("admin", targets=["web-admin"], rules=[{"from": [OTHER]}]),
    )
    check_golden(GOLDEN / "inbound_rbac.json", golden_json(inbound_routes(res)))


def test_the_identity_check_accepts_one_spiffe_id_of_the_trust_domain_only() -> None:
    """The identity filter's pattern, read as RE2 reads it (a full match of the URI SANs joined by ",")."""
    import re

    pattern = id_filter(TD)["typed_config"]["matcher"]["matcher_list"]["matchers"][0]["predicate"]
    regex = re.compile(pattern["single_predicate"]["value_match"]["safe_regex"]["regex"])
    for ok in (CLIENT, OTHER, f"spiffe://{TD}/ns/a/sa/b.c-d"):
        assert regex.fullmatch(ok), ok
    bad = [f"{CLIENT},{OTHER}", f"{CLIENT},https://evil.example/", f"spiffe://{TD}/ns/default/sa/client/extra"]
    bad += ["spiffe://evil.example/ns/default/sa/client", f"spiffe://{TD}/ns/Default/sa/client", "", CLIENT + "/"]
    bad += [f"spiffe://{TD}/ns/default/sa/..", f"spiffe://{TD}/ns/default/sa/a%2Fb", f"spiffe://{TD}xns/a/sa/b"]
    for no in bad:
        assert not regex.fullmatch(no), no


# -- the rbac-enforced gate (its data-path negative control: tests/xds/test_inbound_authz.py) ------------------------
def test_gate_passes_what_we_build_and_refuses_a_missing_or_misplaced_filter() -> None:
    from aether.xds.gates.authz import rbac_enforced
    from aether.xds.gates.quic import run_quic_gates

    res = translate(policy())
    assert rbac_enforced(res) == [] and run_quic_gates(res) == []
    assert rbac_enforced(translate()) == []  # no policy: still every inbound HCM runs the filter
    after = copy.deepcopy(res)
    hcm = after[LISTENER]["inbound-h2:default/web-0"]["filterChains"][0]["filters"][0]["typedConfig"]
    hcm["httpFilters"].reverse()  # the router first: the RBAC filter never runs
    (failure,) = rbac_enforced(after)
    assert failure.gate == "rbac-enforced" and "inbound-h2:default/web-0" in failure.reason
    assert "rbac-enforced" in {f.gate for f in run_quic_gates(after)}


def test_gate_refuses_rules_served_to_a_connection_manager_without_the_filter() -> None:
    from aether.xds.gates.authz import rbac_enforced

    res = translate(policy())
    other = copy.deepcopy(res[LISTENER]["inbound-h2:default/web-0"])
    other["name"] = "side-door"
    other["filterChains"] = other["filterChains"][:1]
    other["filterChains"][0]["filters"][0]["typedConfig"]["httpFilters"] = [
        {"name": "envoy.filters.http.router", "typedConfig": {"@type": ROUTER_TYPE}}
    ]
    res[LISTENER]["side-door"] = other
    (failure,) = rbac_enforced(res)
    assert "side-door" in failure.reason and "carries RBAC rules" in failure.reason


@pytest.mark.parametrize("where", ["unready", "ineligible", "absent"])
def test_a_pod_that_takes_no_traffic_is_still_guarded(where: str) -> None:
    """web-0 is an endpoint of web that is not ready (or terminating), or web is no QUIC destination (mixed
    ServiceAccounts): the pod takes no mesh traffic, but a caller dialling it directly still meets web's policy.
    `absent` is the pod listed nowhere (what the sidecar saw before unreadyIps/endpointIps): it falls back to the
    default app port 8080, open to the trust domain, which is what these fields prevent."""
    node, records = web_node()
    q = node.status.quic
    web = next(d for d in q.destinations if d.service == "default/web")
    q.destinations = [d for d in q.destinations if d.service not in ("default/web", "default/web-admin")]
    if where == "unready":
        ready = [Endpoint(ip="10.200.9.8", port=INBOUND_PORT)]
        q.destinations.append(web.model_copy(update={"endpoints": ready, "unready_ips": ["10.200.2.7"]}))
    elif where == "ineligible":
        q.ineligible.append(
            IneligibleDestination(
                service="default/web", reason="MixedServiceAccounts", ports=[8080, 9090], endpoint_ips=["10.200.2.7"]
            )
        )
    res = build(node, records, TranslateOptions(trust_domain=TD, authorization=compile_bodies([policy()], TD)))
    got = rbac_of(res, "port-8080")
    if where == "absent":
        assert got is None
    else:
        assert got is not None and list(got) == ["default/web-callers"], got


# -- default-deny: a policy on its own Namespace (issue 22, item 4) --------------------------------------------------
def namespace_wide(name: str, ns: str = "default", rules: Any = ()) -> dict[str, Any]:
    body = policy(name, rules=list(rules))
    body["metadata"]["namespace"] = ns
    body["spec"]["targetRefs"] = [{"kind": "Namespace", "name": ns}]
    return body


def test_a_namespace_wide_policy_without_rules_denies_every_port_of_every_pod() -> None:
    res = translate(namespace_wide("deny-all"))
    for chain in ("primary", "port-8080", "port-9090"):
        for listener in ("inbound-h2:default/web-0", "inbound-h3:default/web-0"):
            assert rbac_of(res, chain, listener) == {}, (chain, listener)


def test_under_default_deny_another_policy_opens_only_what_it_allows() -> None:
    res = translate(namespace_wide("deny-all"), policy())
    assert rbac_of(res, "port-8080") == {"default/web-callers": [{"exact": CLIENT}]}
    assert rbac_of(res, "port-9090") == {}  # web-callers names 8080 only
    # a typo'd target (Web, no such Service) binds to nothing: it never opens web
    typo = translate(namespace_wide("deny-all"), policy("typo", targets=["Web"]))
    assert rbac_of(typo, "port-8080") == {} and rbac_of(typo, "port-9090") == {}


def test_namespace_wide_rules_and_the_mesh_wide_form() -> None:
    res = translate(namespace_wide("team-b-in", rules=[{"from": [OTHER], "ports": [9090]}]))
    assert rbac_of(res, "port-9090") == {"default/team-b-in": [{"exact": OTHER}]}
    assert rbac_of(res, "port-8080") == {}
    mesh = translate(namespace_wide("mesh-deny", ns=authz.ROOT_NAMESPACE))
    assert rbac_of(mesh, "port-8080") == {} and rbac_of(mesh, "port-9090") == {}
    # another namespace's Namespace-wide policy does nothing here; naming another Namespace is refused, opens nothing
    assert translate(namespace_wide("deny-all", ns="team-b")) == translate()
    foreign = namespace_wide("foreign")
    foreign["spec"]["targetRefs"] = [{"kind": "Namespace", "name": "team-b"}]
    assert not verdict(foreign).accepted and translate(foreign) == translate()


def test_a_namespace_wide_policy_guards_a_pod_that_backs_no_service() -> None:
    node, records = sample_node("node-b", [SamplePod("u-lone", "lone-0", "10.200.2.9", "lone", "/run/netns/l")], [])
    opts = TranslateOptions(trust_domain=TD, authorization=compile_bodies([namespace_wide("deny-all")], TD))
    assert rbac_of(build(node, records, opts), "primary", "inbound-h2:default/lone-0") == {}
    assert (
        rbac_of(build(node, records, TranslateOptions(trust_domain=TD)), "primary", "inbound-h2:default/lone-0") is None
    )


def test_a_namespace_wide_body_that_does_not_fit_the_schema_closes_the_namespace() -> None:
    broken = namespace_wide("broken")
    broken["spec"]["rules"] = "not a list"
    (compiled,) = compile_bodies([broken], TD)
    assert (compiled.accepted, compiled.namespace_wide, compiled.rules) == (False, True, ())
    assert rbac_of(translate(broken), "port-8080") == {}
