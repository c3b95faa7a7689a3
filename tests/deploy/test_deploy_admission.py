"""deploy/rbac/node-admission.yaml: a node's sidecar writes only its own MeshNode, and only the status fields it owns.
No API server here evaluates CEL, so this evaluates the policy's own expressions (matchConditions, variables,
validations, in order, as the API server does) with cel-python against the requests the sidecar really makes
(`aether.xds.sidecar.kube_source`: the Programmed condition merged by type, pairs by merge patch on status.quic) and
the ones a compromised node would.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from aether.testing.eastwest_sample import two_sources_one_destination

POLICY_FILE = Path(__file__).parents[2] / "deploy" / "rbac" / "node-admission.yaml"
NODE_SA = "system:serviceaccount:aether-system:aether-node"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"


def _docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]


POLICY = next(d for d in _docs() if d["kind"] == "ValidatingAdmissionPolicy")
ENV = celpy.Environment()


def _eval(expr: str, activation: dict[str, Any]) -> Any:
    return ENV.program(ENV.compile(expr)).evaluate(activation)


def _cel_map(values: dict[str, Any]) -> Any:
    """Already-evaluated CEL values as a map (json_to_cel would turn a CEL bool into an int)."""
    return celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in values.items() if v is not None})


def admit(request: dict[str, Any], obj: dict[str, Any] | None, old: dict[str, Any] | None) -> list[str]:
    """The messages of the failed validations (empty: admitted); ["not matched"] when the policy does not apply."""
    act: dict[str, Any] = {
        "request": json_to_cel(request),
        "object": json_to_cel(obj),
        "oldObject": json_to_cel(old),
    }
    spec = POLICY["spec"]
    if not all(bool(_eval(m["expression"], act)) for m in spec["matchConditions"]):
        return ["not matched"]
    variables: dict[str, Any] = {}
    for var in spec["variables"]:
        try:
            variables[var["name"]] = _eval(var["expression"], {**act, "variables": _cel_map(variables)})
        except CELEvalError:
            variables[var["name"]] = None
    act["variables"] = _cel_map(variables)
    failed = []
    for v in spec["validations"]:
        try:
            ok = _eval(v["expression"], act)
        except CELEvalError:
            ok = False  # an evaluation error denies (failurePolicy: Fail)
        if not isinstance(ok, celpy.celtypes.BoolType) or not ok:
            if "messageExpression" in v:
                try:
                    failed.append(str(_eval(v["messageExpression"], act)))
                    continue
                except CELEvalError:
                    pass
            failed.append(v["message"])
    return failed


def _request(node: str | None, operation: str = "UPDATE", user: str = NODE_SA) -> dict[str, Any]:
    info: dict[str, Any] = {"username": user, "groups": ["system:serviceaccounts"]}
    if node is not None:
        info["extra"] = {NODE_NAME_KEY: [node], "authentication.kubernetes.io/pod-name": ["aether-node-x"]}
    return {"operation": operation, "userInfo": info, "subResource": "status"}


def _meshnode(name: str) -> dict[str, Any]:
    node, _ = two_sources_one_destination()
    wire = node.wire()
    wire["metadata"] = {"name": name, "resourceVersion": "7", "labels": {"kubernetes.io/hostname": name}}
    wire["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "reason": "Computed", "message": "", "lastTransitionTime": "t0"},
        {"type": "Programmed", "status": "Unknown", "reason": "Pending", "message": "", "lastTransitionTime": "t0"},
    ]
    wire["status"]["summary"] = {"pods": 2, "namespaces": 1, "slices": 1}
    wire["status"]["authorization"] = {"guardedServices": 1, "policies": 1, "notAccepted": 0}
    return wire


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what the sidecar sends)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


PAIR = {
    "source": "spiffe://cluster.local/ns/default/sa/client",
    "destination": "default/web",
    "twin": "quic:default/web@client",
}


def _pairs_patch() -> dict[str, Any]:
    """kube_source.KubeStatusSink.publish_pairs' body."""
    return {"status": {"quic": {"pairs": [PAIR], "dormantPairs": [], "pairCount": 1, "dormantPairCount": 0}}}


def _programmed_patch(old: dict[str, Any]) -> dict[str, Any]:
    """kube_source.KubeStatusSink.publish's body: the other conditions kept, Programmed replaced (moved last)."""
    others = [c for c in old["status"]["conditions"] if c["type"] != "Programmed"]
    new = {"type": "Programmed", "status": "True", "reason": "Accepted", "message": "v1", "lastTransitionTime": "t1"}
    return {"metadata": {"resourceVersion": "7"}, "status": {"conditions": [*others, new]}}


def test_its_own_pairs_and_programmed_condition_are_admitted() -> None:
    old = _meshnode("node-a")
    assert admit(_request("node-a"), _merge(old, _pairs_patch()), old) == []
    assert admit(_request("node-a"), _merge(old, _programmed_patch(old)), old) == []
    # both in one write, and Programmed added where there was none
    none_yet = copy.deepcopy(old)
    none_yet["status"]["conditions"] = none_yet["status"]["conditions"][:1]
    both = _merge(_merge(none_yet, _pairs_patch()), _programmed_patch(none_yet))
    assert admit(_request("node-a"), both, none_yet) == []
    # the PairsPersisted condition (xds/pairs/persist.py) beside them
    persisted = {"type": "PairsPersisted", "status": "False", "reason": "WriteFailed", "message": "x"}
    with_it = _merge(old, {"status": {"conditions": [*old["status"]["conditions"], persisted]}})
    assert admit(_request("node-a"), with_it, old) == []


def test_another_nodes_meshnode_is_refused() -> None:
    old = _meshnode("node-b")
    assert admit(_request("node-a"), _merge(old, _pairs_patch()), old) == [
        "node node-a may write only MeshNode node-a, not node-b"
    ]
    assert admit(_request("node-a"), _merge(old, _programmed_patch(old)), old) == [
        "node node-a may write only MeshNode node-a, not node-b"
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {
                "status": {
                    "udp": {"services": [{"service": "default/x", "vip": "10.96.0.9", "cluster": "udp:default/x"}]}
                }
            },
            "operator-owned status",
        ),
        ({"status": {"pods": []}}, "operator-owned status"),
        ({"status": {"serviceSlices": {"selector": "x", "names": ["default.0"]}}}, "operator-owned status"),
        ({"status": {"observedGeneration": 9}}, "operator-owned status"),
        ({"status": {"summary": {"pods": 0}}}, "operator-owned status"),
        ({"status": {"authorization": {"guardedServices": 0}}}, "operator-owned status"),  # the policy counts
        ({"status": {"authorization": None}}, "operator-owned status"),
        ({"status": {"quic": {"destinations": []}}}, "not the operator's quic fields"),
        ({"status": {"quic": {"identities": ["spiffe://cluster.local/ns/kube-system/sa/admin"]}}}, "quic fields"),
        ({"spec": {"x": 1}}, "spec, labels or annotations"),
        ({"metadata": {"labels": {"kubernetes.io/hostname": "node-b"}}}, "spec, labels or annotations"),
    ],
)
def test_operator_owned_fields_of_its_own_meshnode_are_refused(change: dict[str, Any], message: str) -> None:
    old = _meshnode("node-a")
    failed = admit(_request("node-a"), _merge(_merge(old, _pairs_patch()), change), old)
    assert len(failed) == 1 and message in failed[0], failed


def test_operator_owned_conditions_are_refused() -> None:
    old = _meshnode("node-a")
    for conditions in (
        [{**old["status"]["conditions"][0], "status": "False"}, old["status"]["conditions"][1]],  # Ready flipped
        old["status"]["conditions"][1:],  # Ready removed
        [*old["status"]["conditions"], {"type": "Degraded", "status": "True", "reason": "x", "message": ""}],
    ):
        failed = admit(_request("node-a"), _merge(old, {"status": {"conditions": conditions}}), old)
        assert failed == [
            "a node's sidecar may write only the Programmed and PairsPersisted conditions; the operator owns every "
            "other condition"
        ]


def test_a_token_without_its_node_and_create_or_delete_are_refused() -> None:
    old = _meshnode("node-a")
    new = _merge(old, _pairs_patch())
    assert any("carries no node name" in m for m in admit(_request(None), new, old))
    assert admit(_request("node-a", "CREATE"), new, None)[0].startswith("a node's sidecar only updates")
    assert admit(_request("node-a", "DELETE"), None, old)[0].startswith("a node's sidecar only updates")


def test_other_users_are_not_matched() -> None:
    """The operator (and anyone else) is left to RBAC: the policy binds only the node ServiceAccount."""
    old = _meshnode("node-b")
    operator = "system:serviceaccount:aether-system:aether-operator"
    assert admit(_request(None, user=operator), _merge(old, {"status": {"pods": []}}), old) == ["not matched"]


def test_the_binding_denies_and_the_kustomization_ships_both() -> None:
    binding = next(d for d in _docs() if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": POLICY["metadata"]["name"], "validationActions": ["Deny"]}
    kustomization = yaml.safe_load((POLICY_FILE.parents[1] / "kustomization.yaml").read_text())
    assert "rbac/node-admission.yaml" in kustomization["resources"]
