"""The pure part of the policy status and MeshNode counts (aether.operator.policies)."""

from __future__ import annotations

from typing import Any

from aether.api.authz import compile_bodies
from aether.operator.policies import node_counts, policy_status, same_status, with_times
from aether.operator.reconcile.views import parse_pod, parse_service, parse_slice
from aether.testing.apitestbed import objects as o

TD = "cluster.local"
CLIENT = f"spiffe://{TD}/ns/shop/sa/client"
SERVICES = {"web": parse_service(o.service("shop", "web", "10.96.0.1", [("http", 8080, "TCP")]))}


def body(targets: list[str], rules: Any, generation: int = 3) -> dict[str, Any]:
    out = o.authorization_policy("shop", "p", targets, rules)
    out["metadata"]["generation"] = generation
    return out


def test_accepted_resolved_with_its_services() -> None:
    status = policy_status(body(["web"], [{"from": [CLIENT], "ports": [8080]}]), SERVICES, TD)
    accepted, resolved = status["conditions"]
    assert (accepted["status"], accepted["reason"], accepted["observedGeneration"]) == ("True", "Accepted", 3)
    assert (resolved["status"], resolved["reason"], resolved["message"]) == ("True", "ResolvedRefs", "selects shop/web")
    assert status["services"] == ["shop/web"] and status["errors"] == []


def test_missing_service_and_port_are_reported_not_refused() -> None:
    status = policy_status(body(["web", "api"], [{"from": [CLIENT], "ports": [9999]}]), SERVICES, TD)
    accepted, resolved = status["conditions"]
    assert accepted["status"] == "True"
    assert (resolved["status"], resolved["reason"]) == ("False", "ServiceNotFound")
    assert status["services"] == ["shop/web"]
    assert "Service shop/api does not exist (the policy applies once it does)" in status["errors"]
    assert "port(s) 9999 are ports of no selected Service" in status["errors"]
    only_port = policy_status(body(["web"], [{"from": [CLIENT], "ports": [9999]}]), SERVICES, TD)
    assert only_port["conditions"][1]["reason"] == "PortNotFound"


def test_deny_all_and_schema_misfits() -> None:
    deny = policy_status(body(["web"], []), SERVICES, TD)["conditions"][0]
    assert (deny["status"], deny["reason"]) == ("True", "DenyAll") and "every caller of web is denied" in deny[
        "message"
    ]
    misfit = body(["web"], [{"from": CLIENT}])
    status = policy_status(misfit, SERVICES, TD)
    assert (status["conditions"][0]["status"], status["conditions"][0]["reason"]) == ("False", "InvalidSpec")
    assert status["services"] == ["shop/web"]  # it still closes web: fails closed


def test_transition_times_kept_while_status_holds() -> None:
    want = policy_status(body(["web"], [{"from": [CLIENT]}]), SERVICES, TD)
    stored = with_times(want, None, "t0")
    assert same_status(stored, want)
    again = with_times(want, stored, "t1")
    assert [c["lastTransitionTime"] for c in again["conditions"]] == ["t0", "t0"]
    flipped = policy_status(body(["web"], [{"from": ["*"]}]), SERVICES, TD)
    assert not same_status(stored, flipped)
    assert [c["lastTransitionTime"] for c in with_times(flipped, stored, "t1")["conditions"]] == ["t1", "t0"]


def test_node_counts() -> None:
    pods = [
        parse_pod({**o.pod("shop", "web-0", "n1"), **o.pod_status("10.0.0.7")}),
        parse_pod(o.pod("shop", "x", "n2")),
    ]
    slices = [parse_slice(o.endpoint_slice("shop", "web", [("http", 8080, "TCP")], [("10.0.0.7", True, "web-0")]))]
    policies = compile_bodies(
        [
            body(["web"], [{"from": [CLIENT]}]),
            {**body(["web"], [{"from": ["*"]}]), "metadata": {"name": "q", "namespace": "shop"}},
        ],
        TD,
    )
    assert node_counts(policies, pods, slices, ["n1", "n2"]) == {
        "n1": {"guardedServices": 1, "policies": 2, "notAccepted": 1},
        "n2": {"guardedServices": 0, "policies": 0, "notAccepted": 0},
    }
    # a terminating pod is still guarded (the sidecar keeps its policy on it): still counted
    ending = o.endpoint_slice("shop", "web", [("http", 8080, "TCP")], [("10.0.0.7", o.SERVING_TERMINATING, "web-0")])
    assert node_counts(policies, pods, [parse_slice(ending)], ["n1"])["n1"]["guardedServices"] == 1
