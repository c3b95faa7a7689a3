"""The operator starts its watches only once the API's discovery lists what it watches (operator/discovery.py).

kopf reads the API's resource list once, after the startup handlers, and never looks again at a built-in group. A
kube-apiserver still starting serves partial discovery; an operator that started then never watched EndpointSlices
(found by bench.soak). Here the fault proxy in front of the real API server plays that server: its discovery leaves
`discovery.k8s.io` out while the operator starts, then lists it again. The operator must end with the Service's
endpoints in its arm. Without the gate (seen red: the startup handler's wait taken out) kopf scans while the group
is hidden, the arm is written without endpoints and stays so after the group is back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aether.operator import discovery
from aether.testing import controlplane
from aether.testing.apiserver import Kind
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.controlplane.faultproxy import FaultProxy
from aether.testing.wait import wait_for


@pytest.fixture()
def proxied(api_kind: Kind) -> Iterator[tuple[controlplane.ControlPlane, FaultProxy]]:
    if api_kind != "real":
        pytest.skip("AETHER_CONTROL_PLANE=emulated: the point is the real API server's discovery")
    cp = controlplane.start()
    proxy = FaultProxy(cp)
    try:
        yield cp, proxy
    finally:
        proxy.stop()
        cp.stop()


def test_watches_start_only_after_discovery_lists_the_watched_groups(
    proxied: tuple[controlplane.ControlPlane, FaultProxy],
) -> None:
    cp, proxy = proxied
    k = Cluster(str(cp.kubeconfig_path), None)
    ns, node = unique("disc"), unique("disc-node")
    k.apply(o.namespace(ns))
    k.apply(o.node(node))
    k.apply(o.pod(ns, "client", node, "client"), status=o.pod_status("10.67.0.2"))
    k.apply(o.service(ns, "dns", None, [("dns", 53, "UDP")]))
    k.apply(o.endpoint_slice(ns, "dns", [("dns", 5353, "UDP")], [("10.67.0.10", True, None)]))

    proxy.hide_groups({"discovery.k8s.io"})
    op = InProcessOperator(str(proxy.kubeconfig_path))
    op.start()
    try:
        group_lists = ("get", "/apis", "")
        # the gate looking twice, or (without it) the operator already writing: either way kopf has started or waits
        wait_for(
            lambda: (
                proxy.traffic().get(group_lists, None) is not None
                and (proxy.traffic()[group_lists].requests >= 2 or k.meshnode(node) is not None)
            ),
            timeout=60,
            what="the operator looking at discovery",
            ignore=READ_ERRORS,
        )
        proxy.hide_groups(set())
        want = [{"ip": "10.67.0.10", "port": 5353}]
        wait_for(
            lambda: (k.arm(node, f"{ns}/dns") or {}).get("endpoints") == want,
            timeout=30,
            what="the arm with the Service's endpoints (kopf watching EndpointSlices)",
            ignore=READ_ERRORS,
        )
        assert op.alive()
    finally:
        op.stop()


def test_missing_is_what_should_be_listed_and_is_not() -> None:
    """Pure: a built-in resource is always expected; a custom one only when its CRD is Established and serves it."""
    wanted = [("", "v1", "pods"), ("discovery.k8s.io", "v1", "endpointslices"), ("x.io", "v1", "things")]
    listed = {"v1": {"pods"}}
    assert discovery.missing(wanted, listed, set()) == [("discovery.k8s.io", "v1", "endpointslices")]
    assert discovery.missing(wanted, listed, {("x.io", "v1", "things")})[-1] == ("x.io", "v1", "things")
    full = {"v1": {"pods"}, "discovery.k8s.io/v1": {"endpointslices"}, "x.io/v1": {"things"}}
    assert discovery.missing(wanted, full, {("x.io", "v1", "things")}) == []
    crd = {
        "spec": {"group": "x.io", "names": {"plural": "things"}, "versions": [{"name": "v1", "served": True}]},
        "status": {"conditions": [{"type": "Established", "status": "True"}]},
    }
    assert discovery.established_resources([crd]) == {("x.io", "v1", "things")}
    crd["status"] = {"conditions": [{"type": "Established", "status": "False"}]}
    assert discovery.established_resources([crd]) == set()
