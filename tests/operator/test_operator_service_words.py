"""What the operator says about a Service without a ClusterIP names the kind of Service it is: a headless Service
(clusterIP None) and an ExternalName Service (a DNS alias, spec.externalName) both have no VIP to match, and the
NoClusterIP shape and a route on it say which (an ExternalName Service was called headless)."""

from __future__ import annotations

from typing import Any

from aether.api.slices import MeshServiceSlice
from aether.operator.reconcile.model import ClusterModel
from aether.testing.apitestbed import objects as o


def external_name(ns: str, name: str) -> dict[str, Any]:
    svc = o.service(ns, name, None, [("dns", 53, "UDP")])
    svc["spec"].update({"type": "ExternalName", "externalName": "dns.example.com"})
    return svc


def shapes(m: ClusterModel) -> dict[str, str]:
    out = m.reconcile(full=True)
    found: dict[str, str] = {}
    for spec in out.slices.values():
        if spec is not None:
            for x in MeshServiceSlice.model_validate(
                {"metadata": {"name": "s"}, "spec": spec}
            ).spec.udp.unsupported_shapes:
                found[x.route] = f"{x.reason}: {x.message}"
    return found


def test_no_cluster_ip_says_which_kind_of_service() -> None:
    m = ClusterModel()
    m.apply_raw("namespace", o.namespace("app"))
    m.apply_raw("service", external_name("app", "ext"))
    m.apply_raw("service", o.service("app", "headless", "None", [("dns", 53, "UDP")]))
    m.apply_raw("route", o.udproute("app", "r", "ext", [o.backend("headless", 53)]))
    got = shapes(m)
    assert got["app/headless"] == "NoClusterIP: headless Service: no VIP to match"
    assert got["app/ext"].startswith("NoClusterIP: ExternalName Service") and "headless" not in got["app/ext"]
    verdict = m.results["app"].route_verdicts[("app", "r")][0]
    assert not verdict.accepted and "ExternalName" in verdict.accepted_message
