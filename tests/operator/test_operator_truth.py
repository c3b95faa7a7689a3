"""Status that tells the truth: a blackholed arm carries the real reason (the refusal's, when every backend was
refused: RefNotPermitted, InvalidKind, ...), so do the Accepted message and the Event (a Warning); `kubectl get
meshnodes` shows Programmed and Degraded beside Ready; the backendRef bound we impose is the CRD's own (16 rules x
16 backendRefs = 256) and a route beyond it is told the number.

Seen red on the old code: the arm said NoHealthyBackend for refused backends, the Event was Normal, the printer
columns had no Programmed or Degraded, and a 5 x 13 route (valid under the CRD) was refused by a 64 cap."""

from __future__ import annotations

import itertools
from typing import Any

from aether.operator.reconcile.model import ClusterModel
from aether.operator.reconcile.views import MAX_BACKEND_REFS
from aether.operator.routestatus import transition_events
from aether.testing.apiserver import Kind, api_server
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import Cluster

UDP = [("dns", 53, "UDP")]
MESHNODE = ("mesh.aether.dev/v1alpha1", "MeshNode")
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"  # what kubectl get asks for
SL = [("dns", 5353, "UDP")]


def model() -> ClusterModel:
    m = ClusterModel()
    for ns in ("app", "other"):
        m.apply_raw("namespace", o.namespace(ns))
    m.apply_raw("node", {"metadata": {"name": "n1", "uid": "u1"}})
    pod = {**o.pod("app", "client", "n1"), **o.pod_status("10.0.0.2")}
    pod["metadata"]["uid"] = "p1"
    m.apply_raw("pod", pod)
    for ns, name, vip in (("app", "front", "10.96.0.1"), ("app", "dry", "10.96.0.2"), ("other", "far", "10.96.0.3")):
        m.apply_raw("service", o.service(ns, name, vip, UDP))
        eps = [] if name == "dry" else [("10.1.0.9", True, None)]
        m.apply_raw("slice", o.endpoint_slice(ns, name, SL, eps))
    return m


def route(m: ClusterModel, spec_rules: list[dict[str, Any]]) -> Any:
    body = o.udproute("app", "r", "front", [])
    body["spec"]["rules"] = spec_rules
    body["metadata"].update({"generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"})
    m.apply_raw("route", body)
    out = m.reconcile()
    arm = next(a for a in out.nodes["n1"].udp.services if a.service == "app/front")
    (verdict,) = out.routes[("app", "r")]
    return arm, verdict


def test_refused_backends_give_the_arm_the_refusals_reason() -> None:
    for backend, reason in (
        (o.backend("far", 53, namespace="other"), "RefNotPermitted"),
        ({"kind": "Pod", "name": "p", "port": 53}, "InvalidKind"),
        (o.backend("ghost", 53), "BackendNotFound"),
    ):
        arm, verdict = route(model(), [{"backendRefs": [backend]}])
        assert (arm.cluster, arm.reason) == ("blackhole", reason)
        assert (
            verdict.accepted
            and reason in verdict.accepted_message
            and "NoHealthyBackend" not in verdict.accepted_message
        )
        (event,) = transition_events((verdict,), [])
        assert event.type == "Warning" and reason in event.message


def test_a_usable_backend_with_no_endpoints_is_no_healthy_backend() -> None:
    arm, verdict = route(model(), [{"backendRefs": [o.backend("dry", 53)]}])
    assert (arm.cluster, arm.reason) == ("blackhole", "NoHealthyBackend")
    # beside a refused one: a split whose two halves are both dropped (no endpoints; not permitted), each said why
    arm, verdict = route(model(), [{"backendRefs": [o.backend("dry", 53), o.backend("far", 53, namespace="other")]}])
    assert arm.cluster == "udp-split:app/front"
    assert [(b.backend, b.share, b.reason, b.endpoints) for b in arm.backends or []] == [
        ("app/dry", 50.0, None, []),
        ("other/far", 50.0, "RefNotPermitted", []),
    ]
    assert verdict.resolved_reason == "RefNotPermitted"


def test_the_backendref_bound_is_the_crds_and_is_named() -> None:
    assert MAX_BACKEND_REFS == 16 * 16
    arm, verdict = route(model(), [{"backendRefs": [o.backend("front", 53)] * 13} for _ in range(5)])
    assert verdict.accepted and arm.cluster == "udp:app/front"
    arm, verdict = route(model(), [{"backendRefs": [o.backend("front", 53)] * 16} for _ in range(17)])
    assert not verdict.accepted and "272 backendRefs; at most 256" in verdict.accepted_message


def test_kubectl_get_meshnodes_shows_programmed_and_degraded(api_kind: Kind) -> None:
    """The Table `kubectl get meshnodes` prints, as the API server renders it from the CRD's printer columns (on the
    real control plane by default; `AETHER_CONTROL_PLANE=emulated` on the API test bed)."""
    with api_server(api_kind) as server:
        k = Cluster(server.kubeconfig, None)
        conds = [
            {"type": t, "status": s, "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            for t, s in (("Ready", "True"), ("Degraded", "True"), ("Programmed", "False"))
        ]
        meshnode = {"apiVersion": MESHNODE[0], "kind": MESHNODE[1], "metadata": {"name": "n1"}}
        k.apply(meshnode, status={"status": {"conditions": conds}})
        table = k.res(*MESHNODE).get(header_params={"Accept": TABLE}).to_dict()
        names = [c["name"] for c in table["columnDefinitions"]]
        (only,) = table["rows"]
        row = dict(zip(names, only["cells"], strict=True))
        assert (row["Ready"], row["Programmed"], row["Degraded"]) == ("True", "False", "True")
        if server.control_plane is not None:  # and kubectl itself prints them
            header, line = server.control_plane.kubectl("get", "meshnodes", "n1").stdout.splitlines()
            at = {name: header.index(name) for name in ("READY", "PROGRAMMED", "DEGRADED", "AGE")}
            printed = [line[at[a] : at[b]].strip() for a, b in itertools.pairwise(at)]
            assert printed == ["True", "False", "True"], f"{header}\n{line}"
