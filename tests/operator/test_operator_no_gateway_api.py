"""A cluster without the Gateway API CRDs: the operator still serves MeshNodes (UDPRoutes simply never arrive), and
says that no UDPRoute version is served (a WARNING and a Warning Event on the UDPRoute CRD's name)."""

from __future__ import annotations

import os

import pytest

from aether.api.crdgen import meshnode_crd, slice_crd
from aether.operator.handlers import NO_UDPROUTE
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed import start
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator
from aether.testing.wait import wait_for


@pytest.mark.skipif(bool(os.environ.get("AETHER_KUBECONFIG")), reason="needs a cluster without Gateway API CRDs")
def test_operator_works_without_gateway_api_crds(caplog: pytest.LogCaptureFixture) -> None:
    bed = start(crds=False)
    op = InProcessOperator(str(bed.kubeconfig_path))
    try:
        k = Cluster(str(bed.kubeconfig_path), bed)
        k.apply(meshnode_crd())
        k.apply(slice_crd())
        k.apply(o.namespace("app"))
        k.apply(o.node("n1"))
        k.apply(o.service("app", "dns", "10.96.0.1", [("dns", 53, "UDP")]))
        k.apply(o.pod("app", "c", "n1"), status=o.pod_status("10.0.0.2"))
        op.start()
        arm = wait_for(lambda: k.arm("n1", "app/dns"), what="an arm without Gateway API", ignore=READ_ERRORS)
        assert arm["cluster"] == "udp:app/dns" and op.alive()
        events = k.res("v1", "Event").get(namespace="default").to_dict()["items"]
        ours = [e for e in events if e.get("reason") == NO_UDPROUTE]
        assert len(ours) == 1 and ours[0]["type"] == "Warning", events
        assert ours[0]["involvedObject"]["name"] == "udproutes.gateway.networking.k8s.io"
        assert "no UDPRoute is served" in ours[0]["message"]
        assert any("no UDPRoute is served" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    finally:
        op.stop()
        bed.stop()
