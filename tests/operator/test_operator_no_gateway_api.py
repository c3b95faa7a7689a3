"""A cluster without the Gateway API CRDs: the operator still serves MeshNodes (UDPRoutes simply never arrive), and
says that no UDPRoute version is served (a WARNING and a Warning Event on the UDPRoute CRD's name). On the real
control plane (the default) the server is started without any CRD and given only ours, as shipped (`cp.install`);
`AETHER_CONTROL_PLANE=emulated` runs it on the API test bed with our MeshNode and MeshServiceSlice CRDs applied."""

from __future__ import annotations

import os
from typing import Any

import pytest

from aether.api.crdgen import meshnode_crd, slice_crd
from aether.operator.handlers import NO_UDPROUTE
from aether.testing.apiserver import Kind, api_server
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator
from aether.testing.controlplane.cluster import mesh_crds
from aether.testing.wait import wait_for

UDPROUTE_CRD = "udproutes.gateway.networking.k8s.io"


@pytest.mark.skipif(bool(os.environ.get("AETHER_KUBECONFIG")), reason="needs a cluster without Gateway API CRDs")
def test_operator_works_without_gateway_api_crds(api_kind: Kind, caplog: pytest.LogCaptureFixture) -> None:
    with api_server(api_kind, crds=False) as server:
        k = Cluster(server.kubeconfig, server.faults)
        if server.control_plane is not None:
            server.control_plane.install(mesh_crds())
        else:
            k.apply(meshnode_crd())
            k.apply(slice_crd())
        crds = k.res("apiextensions.k8s.io/v1", "CustomResourceDefinition").get().to_dict()["items"]
        assert not [c["metadata"]["name"] for c in crds if c["spec"]["group"] == "gateway.networking.k8s.io"]
        k.apply(o.namespace("app"))
        k.apply(o.node("n1"))
        vip = None if server.control_plane is not None else "10.96.0.1"  # the emulator has no allocator
        k.apply(o.service("app", "dns", vip, [("dns", 53, "UDP")]))
        k.apply(o.pod("app", "c", "n1"), status=o.pod_status("10.0.0.2"))
        op = InProcessOperator(server.kubeconfig)
        op.start()
        try:
            arm = wait_for(lambda: k.arm("n1", "app/dns"), what="an arm without Gateway API", ignore=READ_ERRORS)
            assert arm["cluster"] == "udp:app/dns" and op.alive()

            def ours() -> list[dict[str, Any]]:
                events = k.res("v1", "Event").get(namespace="default").to_dict()["items"]
                return [e for e in events if e.get("reason") == NO_UDPROUTE]

            (event,) = wait_for(ours, what="the Warning Event", ignore=READ_ERRORS)
            assert event["type"] == "Warning", event
            assert event["involvedObject"]["name"] == UDPROUTE_CRD
            assert "no UDPRoute is served" in event["message"]
            assert any("no UDPRoute is served" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
        finally:
            op.stop()
