"""MeshAuthorizationPolicy status and MeshNode counts, written by the real operator (in-process, on the API test bed):
Accepted with the Services it selects; a missing Service reported (ServiceNotFound) and picked up once it exists;
hostile policies (no targets, a wildcard, malformed SPIFFE IDs, 1,000 rules) each their own condition, while the
other policies and the MeshNode arms stay as they were; counts on the MeshNode of the node whose pod is guarded."""

from __future__ import annotations

from typing import Any

import pytest

from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.wait import wait_for

V = "mesh.aether.dev/v1alpha1"
KIND = "MeshAuthorizationPolicy"
TD = "cluster.local"

pytestmark = pytest.mark.slow


def conditions(k: Cluster, ns: str, name: str) -> dict[str, dict[str, Any]] | None:
    status = (k.get(V, KIND, name, ns) or {}).get("status") or {}
    conds = {c["type"]: c for c in status.get("conditions") or []}
    return conds if {"Accepted", "ResolvedRefs"} <= set(conds) else None


def wait_conditions(k: Cluster, ns: str, name: str, accepted: str, reason: str) -> dict[str, dict[str, Any]]:
    def ready() -> dict[str, dict[str, Any]] | None:
        c = conditions(k, ns, name)
        return c if c and (c["Accepted"]["status"], c["Accepted"]["reason"]) == (accepted, reason) else None

    return wait_for(ready, what=f"{ns}/{name}: Accepted={accepted} {reason}", timeout=30, ignore=READ_ERRORS)


def setup(k: Cluster) -> tuple[str, str]:
    ns, node = unique("authz"), unique("authz-node")
    k.apply(o.namespace(ns))
    k.apply(o.node(node))
    k.apply(o.pod(ns, "web-0", node, "web"), status=o.pod_status("10.61.0.7"))
    k.apply(o.service(ns, "web", None, [("http", 8080, "TCP")]))  # each test a new namespace: allocated
    k.apply(o.endpoint_slice(ns, "web", [("http", 8080, "TCP")], [("10.61.0.7", True, "web-0")]))
    wait_for(lambda: k.meshnode(node), what="the MeshNode", ignore=READ_ERRORS)
    return ns, node


def test_status_services_and_counts(cluster: Cluster, operator: InProcessOperator) -> None:
    k = cluster
    ns, node = setup(k)
    client = f"spiffe://{TD}/ns/{ns}/sa/client"
    k.apply(o.authorization_policy(ns, "web-callers", ["web"], [{"from": [client], "ports": [8080]}]))
    conds = wait_conditions(k, ns, "web-callers", "True", "Accepted")
    assert conds["ResolvedRefs"]["status"] == "True" and conds["Accepted"]["observedGeneration"] >= 1
    status = (k.get(V, KIND, "web-callers", ns) or {})["status"]
    assert status["services"] == [f"{ns}/web"] and status["errors"] == []

    def counts() -> dict[str, int] | None:
        return ((k.meshnode(node) or {}).get("status") or {}).get("authorization")

    assert wait_for(counts, what="the MeshNode counts", ignore=READ_ERRORS) == {
        "guardedServices": 1,
        "policies": 1,
        "notAccepted": 0,
    }
    # a policy naming a Service that does not exist: accepted, ServiceNotFound, and resolved once it exists
    k.apply(o.authorization_policy(ns, "later", ["api"], [{"from": [client]}]))
    conds = wait_conditions(k, ns, "later", "True", "Accepted")
    assert (conds["ResolvedRefs"]["status"], conds["ResolvedRefs"]["reason"]) == ("False", "ServiceNotFound")
    assert f"Service {ns}/api does not exist" in conds["ResolvedRefs"]["message"]
    k.apply(o.service(ns, "api", None, [("http", 8080, "TCP")]))
    wait_for(
        lambda: (c := conditions(k, ns, "later")) and c["ResolvedRefs"]["status"] == "True",
        what="resolved once the Service exists",
        ignore=READ_ERRORS,
    )


HOSTILE = {
    "empty": ([], [{"from": ["spiffe://cluster.local/ns/x/sa/y"]}], "NoTargets", "protects nothing"),
    "wildcard": (["web"], [{"from": ["*"]}], "InvalidSource", "wildcard over every identity"),
    "malformed": (
        ["web"],
        [{"from": ["spiffe:/cluster.local/ns/a/sa/b", "ns/a/sa/b"]}],
        "InvalidSource",
        "not a SPIFFE",
    ),
    "huge": (["web"], [{"from": [f"spiffe://{TD}/ns/a/sa/s{i}"]} for i in range(1000)], "TooManyRules", "1000 rules"),
}


def test_hostile_policies_each_get_a_condition_and_disturb_nothing_else(
    cluster: Cluster, operator: InProcessOperator
) -> None:
    k = cluster
    ns, node = setup(k)
    k.apply(o.authorization_policy(ns, "good", ["web"], [{"from": [f"spiffe://{TD}/ns/{ns}/sa/client"]}]))
    wait_conditions(k, ns, "good", "True", "Accepted")
    arms_before = ((k.meshnode(node) or {}).get("status") or {}).get("tcp")
    good_before = (k.get(V, KIND, "good", ns) or {})["status"]
    for name, (targets, rules, _reason, _needle) in HOSTILE.items():
        k.apply(o.authorization_policy(ns, name, targets, rules))
    for name, (_, _, reason, needle) in HOSTILE.items():
        conds = wait_conditions(k, ns, name, "False", reason)
        assert needle in conds["Accepted"]["message"], conds["Accepted"]
        assert "fails closed" in conds["Accepted"]["message"]
    assert (k.get(V, KIND, "good", ns) or {})["status"] == good_before  # untouched: not even a transition time
    assert ((k.meshnode(node) or {}).get("status") or {}).get("tcp") == arms_before
    # the three hostile policies on web count as not accepted (they close web); "empty" targets nothing
    wait_for(
        lambda: (
            ((k.meshnode(node) or {}).get("status") or {}).get("authorization")
            == {"guardedServices": 1, "policies": 4, "notAccepted": 3}
        ),
        what="counts with the hostile policies",
        ignore=READ_ERRORS,
    )
