"""RBAC: no wildcards, and every API call the code makes is allowed by the ClusterRole bound to its account.

The answers are the real API server's: deploy/'s ClusterRoles and bindings are applied to the test control plane
(kube-apiserver 1.35.4) and each call is a SubjectAccessReview for the account's ServiceAccount. The calls come
from two places: the API test bed's audit log of a real run of the operator (and of the node sidecar in cluster
mode) against it; and a fixed list derived by reading the code, which also pins the shape of the roles
(extend it when the code grows a call).
"""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from aether.testing import controlplane
from aether.testing.controlplane.manifests import Authorizer, Request, dry_run, grant, service_account
from aether.testing.wait import wait_for

REPO = Path(__file__).resolve().parents[2]

# (verb, apiGroup, resource, subresource): what the code asks, read from operator/handlers.py (kopf indexes and
# event handlers on WATCHED: list + watch), operator/kubeapi.py (MeshNode get/create/delete/status patch, UDPRoute
# get/status patch, core Events), operator/mcsctl.py (ServiceExport/ServiceImport status patch) and kopf (CRD
# observation; events for handler failures).
OPERATOR_CALLS = [
    *[(v, "", r, "") for r in ("namespaces", "nodes", "pods", "services") for v in ("list", "watch")],
    *[(v, "discovery.k8s.io", "endpointslices", "") for v in ("list", "watch")],
    *[(v, "gateway.networking.k8s.io", r, "") for r in ("udproutes", "referencegrants") for v in ("list", "watch")],
    ("get", "gateway.networking.k8s.io", "udproutes", ""),
    ("patch", "gateway.networking.k8s.io", "udproutes", "status"),
    *[(v, "mesh.aether.dev", "meshnodes", "") for v in ("get", "list", "watch", "create", "delete")],
    ("patch", "mesh.aether.dev", "meshnodes", "status"),
    *[(v, "mesh.aether.dev", "meshserviceslices", "") for v in ("get", "list", "watch", "create", "patch", "delete")],
    *[(v, "mesh.aether.dev", "meshauthorizationpolicies", "") for v in ("list", "watch")],
    ("patch", "mesh.aether.dev", "meshauthorizationpolicies", "status"),
    *[(v, "multicluster.x-k8s.io", r, "") for r in ("serviceexports", "serviceimports") for v in ("list", "watch")],
    *[("patch", "multicluster.x-k8s.io", r, "status") for r in ("serviceexports", "serviceimports")],
    *[(v, "mesh.aether.dev", "meshpeers", "") for v in ("list", "watch")],
    *[(v, "apiextensions.k8s.io", "customresourcedefinitions", "") for v in ("list", "watch")],
    ("create", "", "events", ""),
]
NODE_CALLS = [
    *[(v, "mesh.aether.dev", "meshnodes", "") for v in ("get", "list", "watch")],
    ("patch", "mesh.aether.dev", "meshnodes", "status"),
    *[(v, "mesh.aether.dev", "meshserviceslices", "") for v in ("list", "watch")],
    *[(v, "mesh.aether.dev", "meshauthorizationpolicies", "") for v in ("list", "watch")],  # read-only
]
# What each account must NOT be able to do: least privilege, pinned.
NODE_FORBIDDEN = [
    ("patch", "mesh.aether.dev", "meshauthorizationpolicies", "status"),  # the operator reports on policies
    ("patch", "mesh.aether.dev", "meshauthorizationpolicies", ""),
    ("create", "mesh.aether.dev", "meshnodes", ""),
    ("delete", "mesh.aether.dev", "meshnodes", ""),
    ("patch", "mesh.aether.dev", "meshnodes", ""),
    *[(v, "mesh.aether.dev", "meshserviceslices", "") for v in ("create", "patch", "delete")],
    ("get", "", "secrets", ""),
    ("list", "", "pods", ""),
]
OPERATOR_FORBIDDEN = [
    ("get", "", "secrets", ""),
    ("list", "", "secrets", ""),
    ("patch", "mesh.aether.dev", "meshnodes", ""),  # spec and metadata are not the operator's to change
    ("patch", "", "services", ""),
    ("patch", "", "pods", ""),
    ("patch", "mesh.aether.dev", "meshauthorizationpolicies", ""),  # a policy's spec is its author's
    ("update", "gateway.networking.k8s.io", "udproutes", ""),
    ("patch", "gateway.networking.k8s.io", "udproutes", ""),
    # a ServiceExport's or ServiceImport's spec is its author's, a MeshPeer the user's
    *[(v, "multicluster.x-k8s.io", r, "") for r in ("serviceexports", "serviceimports") for v in ("create", "patch")],
    *[(v, "mesh.aether.dev", "meshpeers", "") for v in ("create", "patch", "delete")],
]


SA_NS = "aether-system"
WILDCARD = "*"


def _wildcards(rules: list[dict[str, Any]]) -> list[str]:
    """Every wildcard in verbs, apiGroups, resources (`*/sub` and `res/*` too) or nonResourceURLs."""
    return [
        f"rule {i}: {field} contains {value!r}"
        for i, rule in enumerate(rules)
        for field in ("verbs", "apiGroups", "resources", "nonResourceURLs")
        for value in rule.get(field) or []
        if WILDCARD in str(value)
    ]


def test_no_wildcards_and_no_namespaced_roles(rendered: list[dict[str, Any]]) -> None:
    assert not [o for o in rendered if o["kind"] in ("Role", "RoleBinding")]
    for role in (o for o in rendered if o["kind"] == "ClusterRole"):
        assert _wildcards(role["rules"]) == [], role["metadata"]["name"]
        assert "aggregationRule" not in role


def test_wildcard_gate_sees_red(rendered: list[dict[str, Any]]) -> None:
    """Negative control: a `*` verb, resource, group or subresource is found."""
    for field, value in (("verbs", "*"), ("resources", "*"), ("apiGroups", "*"), ("resources", "meshnodes/*")):
        role = copy.deepcopy(next(o for o in rendered if o["kind"] == "ClusterRole"))
        role["rules"][0][field] = [*role["rules"][0][field], value]
        assert _wildcards(role["rules"]), (field, value)


# -- what the server's RBAC authorizer answers (SubjectAccessReview on the test control plane) --------------------


@pytest.fixture(scope="module")
def authz(plane: controlplane.ControlPlane, rendered: list[dict[str, Any]]) -> Authorizer:
    """The control plane with deploy/'s ClusterRoles and their bindings applied as rendered."""
    rbac = [o for o in rendered if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    assert dry_run(plane, rbac) == ""
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(rbac))
    for b in (o for o in rbac if o["kind"] == "ClusterRoleBinding"):
        assert all(s["kind"] == "ServiceAccount" and s["namespace"] == SA_NS for s in b["subjects"]), b
    return Authorizer(plane)


def test_rule_matching(plane: controlplane.ControlPlane, authz: Authorizer) -> None:
    """The rule semantics the roles rely on, as the server has them: a subresource is its own resource, a group
    must match, resourceNames never cover a list, `*/sub` covers that subresource of any resource."""
    R = Request
    rules = [
        {"apiGroups": ["mesh.aether.dev"], "resources": ["meshnodes/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["p1"]},
        {"apiGroups": ["apps"], "resources": ["*/scale"], "verbs": ["*"]},
    ]
    user = grant(plane, SA_NS, "aether-rbac-matching", rules)
    allowed = [
        R("patch", "mesh.aether.dev", "meshnodes", "status"),
        R("get", "", "pods", "", "p1"),
        R("update", "apps", "deployments", "scale"),
    ]
    refused = [
        R("patch", "mesh.aether.dev", "meshnodes"),  # status is not the object
        R("patch", "", "meshnodes", "status"),  # wrong group
        R("get", "", "pods", "", "p2"),
        R("list", "", "pods"),  # resourceNames never cover a list
        R("update", "apps", "deployments"),
    ]
    assert authz.settled(user, allowed + refused, sorted(refused)) == sorted(refused)


@pytest.mark.parametrize(
    ("account", "calls", "forbidden"),
    [("aether-operator", OPERATOR_CALLS, OPERATOR_FORBIDDEN), ("aether-node", NODE_CALLS, NODE_FORBIDDEN)],
)
def test_code_calls_are_allowed_and_nothing_more(
    authz: Authorizer,
    account: str,
    calls: list[tuple[str, str, str, str]],
    forbidden: list[tuple[str, str, str, str]],
) -> None:
    user = service_account(SA_NS, account)
    assert authz.settled(user, [Request(*c) for c in calls], []) == []
    assert [c for c in forbidden if authz.allows(user, Request(*c))] == []


def test_rbac_gate_sees_red(
    plane: controlplane.ControlPlane, rendered: list[dict[str, Any]], authz: Authorizer
) -> None:
    """Negative control: the node's role without its MeshNode status rule, and the status patch is denied."""
    node_role = next(o for o in rendered if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "aether-node")
    rules = [r for r in node_role["rules"] if "meshnodes/status" not in r["resources"]]
    user = grant(plane, SA_NS, "aether-node-without-status", rules)
    status_patch = [Request("patch", "mesh.aether.dev", "meshnodes", "status")]
    assert authz.settled(user, [Request(*c) for c in NODE_CALLS], status_patch) == status_patch


# -- the operator, run against the API test bed: its audit log is the list of calls --------------------------


NS = "e2e"


def _seed(store: Any) -> None:
    """A small cluster (the test bed installs the CRDs itself): a node, two meshed pods, a UDP Service with a slice,
    a UDPRoute and a MeshAuthorizationPolicy."""
    rt = {p: store.lookup("", "v1", p) for p in ("namespaces", "nodes", "pods", "services", "serviceaccounts")}
    store.create(rt["namespaces"], None, {"metadata": {"name": NS, "labels": {"mesh.aether.dev/enabled": "true"}}})
    store.create(rt["nodes"], None, {"metadata": {"name": "node-a"}})
    for sa in ("client", "dns"):
        store.create(rt["serviceaccounts"], NS, {"metadata": {"name": sa, "namespace": NS}})
    for name, sa, ip in (("client-0", "client", "10.200.1.2"), ("dns-0", "dns", "10.200.1.3")):
        store.create(
            rt["pods"],
            NS,
            {
                "metadata": {"name": name, "namespace": NS, "labels": {"app": name.split("-")[0]}},
                "spec": {"nodeName": "node-a", "serviceAccountName": sa, "containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
            },
        )
    store.create(
        rt["services"],
        NS,
        {
            "metadata": {"name": "dns-a", "namespace": NS},
            "spec": {
                "clusterIP": "10.96.0.10",
                "selector": {"app": "dns"},
                "ports": [{"name": "udp", "port": 18082, "targetPort": 5353, "protocol": "UDP"}],
            },
        },
    )
    store.create(
        store.lookup("discovery.k8s.io", "v1", "endpointslices"),
        NS,
        {
            "metadata": {"name": "dns-a-1", "namespace": NS, "labels": {"kubernetes.io/service-name": "dns-a"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.200.1.3"], "conditions": {"ready": True}, "nodeName": "node-a"}],
            "ports": [{"name": "udp", "port": 5353, "protocol": "UDP"}],
        },
    )
    policies = store.lookup("mesh.aether.dev", "v1alpha1", "meshauthorizationpolicies")
    store.create(
        policies,
        NS,
        {
            "apiVersion": "mesh.aether.dev/v1alpha1",
            "kind": "MeshAuthorizationPolicy",
            "metadata": {"name": "dns-callers", "namespace": NS},
            "spec": {
                "targetRefs": [{"name": "dns-a"}],
                "rules": [{"from": [f"spiffe://cluster.local/ns/{NS}/sa/client"]}],
            },
        },
    )
    udproutes = next(t for t in store.types.values() if t.plural == "udproutes")
    store.create(
        udproutes,
        NS,
        {
            "apiVersion": udproutes.api_version,
            "kind": "UDPRoute",
            "metadata": {"name": "dns", "namespace": NS},
            "spec": {
                "parentRefs": [{"group": "", "kind": "Service", "name": "dns-a"}],
                "rules": [{"backendRefs": [{"name": "dns-a", "port": 18082}]}],
            },
        },
    )


# What the seeded run calls before the operator is stopped: every call of OPERATOR_CALLS but the MeshNode and
# MeshServiceSlice GET (a conflict), DELETE (a Node gone, a slice no longer wanted) and the slice PATCH (a change
# after the first write), which this run has no reason to make.
OPERATOR_RUN_CALLS = [
    c
    for c in OPERATOR_CALLS
    if not (c[1] == "mesh.aether.dev" and c[0] in ("get", "delete"))
    and c[:3] != ("patch", "mesh.aether.dev", "meshserviceslices")
    # the API test bed serves no multicluster Services API and no MeshPeer CRD: test_operator_multicluster.py runs
    # those calls on the real control plane (the SubjectAccessReview test above checks the role grants them)
    and c[1] != "multicluster.x-k8s.io"
    and c[2] != "meshpeers"
]


def _reconciled(store: Any) -> list[str]:
    """What the seeded cluster still lacks from the operator (empty: all done): node-a's MeshNode status with its
    pods and the UDP arm of e2e/dns-a, the UDPRoute's status written by our controller for its current
    generation, and the Event for the route's Accepted condition (posted after that status write)."""
    missing = []
    node = store.objects.get(("mesh.aether.dev", "meshnodes"), {}).get(("", "node-a")) or {}
    status = node.get("status") or {}
    if not status.get("pods"):
        missing.append("MeshNode node-a status.pods")
    slices = store.objects.get(("mesh.aether.dev", "meshserviceslices"), {})
    names = (status.get("serviceSlices") or {}).get("names") or []
    arms = [
        a
        for n in names
        for a in (((slices.get(("", n)) or {}).get("spec") or {}).get("udp") or {}).get("services") or []
    ]
    if not any(a.get("service") == f"{NS}/dns-a" for a in arms):
        missing.append(f"MeshNode node-a arm {NS}/dns-a")
    udproutes = next(t for t in store.types.values() if t.plural == "udproutes")
    route = store.objects.get(udproutes.key, {}).get((NS, "dns")) or {}
    ours = [
        c
        for p in (route.get("status") or {}).get("parents") or []
        if p.get("controllerName") == "mesh.aether.dev/udproute-controller"
        for c in p.get("conditions") or []
    ]
    generation = (route.get("metadata") or {}).get("generation")
    if not ours or any(c.get("observedGeneration") != generation for c in ours):
        missing.append(f"UDPRoute {NS}/dns status for generation {generation}")
    events = store.objects.get(("", "events"), {}).values()
    if not any((e.get("involvedObject") or {}).get("kind") == "UDPRoute" for e in events):
        missing.append(f"an Event for UDPRoute {NS}/dns")
    policy = store.objects.get(("mesh.aether.dev", "meshauthorizationpolicies"), {}).get((NS, "dns-callers")) or {}
    if not (policy.get("status") or {}).get("conditions"):
        missing.append(f"MeshAuthorizationPolicy {NS}/dns-callers status")
    return missing


@pytest.mark.slow
def test_operator_calls_in_the_audit_log_are_allowed(authz: Authorizer, tmp_path: Path) -> None:
    from aether.testing import apitestbed

    audit = tmp_path / "audit.jsonl"
    with apitestbed.start(audit_path=audit) as started:
        bed: Any = started  # its attributes are set in __init__ after a branch mypy cannot type
        bed.call(_seed)
        kubeconfig = Path(bed.kubeconfig_path)
        env = dict(os.environ, KUBECONFIG=str(kubeconfig))
        proc = subprocess.Popen(
            [sys.executable, "-m", "aether.cli", "operator", "--kubeconfig", str(kubeconfig)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "operator.log", "w"),  # noqa: SIM115 (closed with the process)
        )
        expected = {Request(*c) for c in OPERATOR_RUN_CALLS}

        def done() -> bool:
            return not bed.call(_reconciled) and expected <= _requests(bed.audit)

        _run_until(proc, done, timeout=90)
        missing = bed.call(_reconciled)
        records = bed.audit
    log = (tmp_path / "operator.log").read_text()[-3000:]
    assert missing == [], f"the operator did not finish reconciling; its log ends:\n{log}"
    calls = _requests(records)
    assert sorted(expected - calls) == [], f"calls the run should have made; operator log:\n{log}"
    denied = authz.denied(service_account(SA_NS, "aether-operator"), sorted(calls))
    assert denied == [], f"calls the ClusterRole does not allow; operator log:\n{log}"


def _run_until(proc: subprocess.Popen[bytes], done: Callable[[], bool], timeout: float) -> None:
    """Poll until `done()` (or the process exits, or `timeout`), then stop the process."""
    try:
        with contextlib.suppress(TimeoutError):  # the caller asserts on what the run did
            wait_for(lambda: done() or proc.poll() is not None, timeout, what="the run to finish")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _requests(records: Iterable[Any]) -> set[Request]:
    """The audit log as RBAC requests (verb, group, resource, subresource); non-resource URLs left out."""
    return {
        Request(r.verb, r.api_group or "", r.resource, r.subresource or "") for r in records if r.resource is not None
    }


def _programmed(store: Any) -> bool:
    node = store.objects.get(("mesh.aether.dev", "meshnodes"), {}).get(("", "node-a"))
    return node is not None and any(
        c.get("type") == "Programmed" for c in (node.get("status") or {}).get("conditions") or []
    )


@pytest.mark.slow
def test_node_sidecar_calls_in_the_audit_log_are_allowed(authz: Authorizer, tmp_path: Path) -> None:
    from aether.testing import apitestbed

    def seed(store: Any) -> None:
        rt = store.lookup("mesh.aether.dev", "v1alpha1", "meshnodes")
        store.create(
            rt, None, {"apiVersion": "mesh.aether.dev/v1alpha1", "kind": "MeshNode", "metadata": {"name": "node-a"}}
        )

    with apitestbed.start(audit_path=tmp_path / "audit.jsonl") as started:
        bed: Any = started
        bed.call(seed)
        env = dict(os.environ, KUBECONFIG=str(bed.kubeconfig_path), AETHER_STATE_DIR=str(tmp_path / "pods"))
        proc = subprocess.Popen(
            [sys.executable, "-m", "aether.cli", "xds", "--node", "node-a", "--listen", f"unix:{tmp_path}/ads.sock"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "xds.log", "w"),  # noqa: SIM115 (closed with the process)
        )
        expected = {Request(*c) for c in NODE_CALLS}  # the sidecar makes each of them on its own

        def done() -> bool:
            return bool(bed.call(_programmed)) and expected <= _requests(bed.audit)

        _run_until(proc, done, timeout=60)
        programmed = bed.call(_programmed)
        records = bed.audit
    log = (tmp_path / "xds.log").read_text()[-3000:]
    assert programmed, f"the sidecar wrote no Programmed condition; its log ends:\n{log}"
    calls = _requests(records)
    assert sorted(expected - calls) == [], f"calls the sidecar should have made; its log:\n{log}"
    denied = authz.denied(service_account(SA_NS, "aether-node"), sorted(calls))
    assert denied == [], f"calls the ClusterRole does not allow; sidecar log:\n{log}"
