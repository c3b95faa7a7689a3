"""The operator on a dual-stack real control plane (kube-apiserver with `--service-cluster-ip-range=v4,v6`,
kube-controller-manager's EndpointSlice controller): the API server allocates ClusterIPs per `ipFamilyPolicy` and
`ipFamilies`, the controller (not the test) writes one EndpointSlice per address type for pods whose `podIPs` hold
both families, and the operator turns each family's VIP into an arm carrying that family's endpoints. The harness
plays the kubelet (it writes `status.podIPs` and the Node's InternalIPs)."""

from __future__ import annotations

from collections.abc import Iterator
from ipaddress import ip_address, ip_network
from typing import Any

import pytest
from kubernetes.dynamic.exceptions import UnprocessibleEntityError

from aether.operator.reconcile.namespace import NO_ENDPOINTS_IN_FAMILY
from aether.testing.apiserver import Kind, api_server
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import MERGE, READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.controlplane.families import SERVICE_CIDR_V4, SERVICE_CIDR_V6
from aether.testing.wait import wait_for

PORTS = [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]
SLICE = ("mesh.aether.dev/v1alpha1", "MeshServiceSlice")
CONTROLLER_MANAGED = "endpointslice-controller.k8s.io"


@pytest.fixture(scope="module")
def dual(api_kind: Kind) -> Iterator[Cluster]:
    if api_kind != "real":
        pytest.skip("AETHER_CONTROL_PLANE=emulated: the emulator allocates no ClusterIP of either family")
    with api_server("real", ip_family="dual") as server:
        op = InProcessOperator(server.kubeconfig)
        op.start()
        try:
            yield Cluster(server.kubeconfig, None)
        finally:
            op.stop()


class Mesh:
    """A mesh namespace with a client pod on a dual-stack node, and dual-stack backend pods labelled app=dns."""

    def __init__(self, k: Cluster) -> None:
        self.k, self.ns, self.node = k, unique("ds"), unique("ds-node")
        k.apply(o.namespace(self.ns))
        k.apply(o.node(self.node), status=o.node_status("192.168.70.1", "fd00:192:168:70::1"))
        k.apply(o.pod(self.ns, "client", self.node), status=o.pod_status("10.72.0.2", also=["fd00:10:72::2"]))

    def backend(self, name: str, v4: str, v6: str | None) -> None:
        pod = o.pod(self.ns, name, self.node)
        pod["metadata"]["labels"] = {"app": "dns"}
        self.k.apply(pod, status=o.pod_status(v4, also=[v6] if v6 else []))

    def service(self, name: str, policy: str, families: list[str] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"selector": {"app": "dns"}, "ports": PORTS, "ipFamilyPolicy": policy}
        if families is not None:
            spec["ipFamilies"] = families
        body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": self.ns}, "spec": spec}
        out: dict[str, Any] = self.k.apply(body).to_dict()
        return out

    def arms(self, service: str) -> dict[str, dict[str, Any]]:
        """The node's UDP arms of `service`, by VIP."""
        arms = (self.k.state(self.node).get("udp") or {}).get("services") or []
        return {a["vip"]: a for a in arms if a["service"] == f"{self.ns}/{service}"}

    def converged(self, service: str, want: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
        """Wait until the service's arms are exactly `want` (VIP -> endpoint IPs)."""

        def check() -> dict[str, dict[str, Any]] | None:
            arms = self.arms(service)
            got = {v: sorted(e["ip"] for e in a.get("endpoints") or []) for v, a in arms.items()}
            return arms if got == {v: sorted(ips) for v, ips in want.items()} else None

        found: dict[str, dict[str, Any]] = wait_for(check, what=f"{service}'s arms {want}", ignore=READ_ERRORS)
        return found


@pytest.fixture
def mesh(dual: Cluster) -> Mesh:
    return Mesh(dual)


def families(svc: dict[str, Any]) -> list[str]:
    return list(svc["spec"].get("ipFamilies") or [])


def in_cidr(ip: str, cidr: str) -> bool:
    return ip_address(ip) in ip_network(cidr)


def test_the_server_allocates_per_policy_and_the_controller_writes_a_slice_per_address_type(mesh: Mesh) -> None:
    single = mesh.service("single", "SingleStack")
    prefer = mesh.service("prefer", "PreferDualStack")
    require6 = mesh.service("require6", "RequireDualStack", ["IPv6", "IPv4"])
    only6 = mesh.service("only6", "SingleStack", ["IPv6"])
    assert families(single) == ["IPv4"] and len(single["spec"]["clusterIPs"]) == 1
    assert families(prefer) == ["IPv4", "IPv6"] and families(require6) == ["IPv6", "IPv4"]
    assert families(only6) == ["IPv6"] and in_cidr(only6["spec"]["clusterIP"], SERVICE_CIDR_V6)
    v4, v6 = prefer["spec"]["clusterIPs"]
    assert in_cidr(v4, SERVICE_CIDR_V4) and in_cidr(v6, SERVICE_CIDR_V6)
    assert require6["spec"]["clusterIP"] == require6["spec"]["clusterIPs"][0], "clusterIP is the primary family's"

    mesh.backend("dns-0", "10.72.0.5", "fd00:10:72::5")

    def by_type(service: str) -> dict[str, list[str]] | None:
        items = mesh.k.res("discovery.k8s.io/v1", "EndpointSlice").get(namespace=mesh.ns).to_dict()["items"]
        out: dict[str, list[str]] = {}
        for s in items:
            labels = s["metadata"].get("labels") or {}
            if labels.get("kubernetes.io/service-name") == service and s.get("endpoints"):
                assert labels.get("endpointslice.kubernetes.io/managed-by") == CONTROLLER_MANAGED
                out[s["addressType"]] = [a for e in s["endpoints"] for a in e["addresses"]]
        return out or None

    want = {"IPv4": ["10.72.0.5"], "IPv6": ["fd00:10:72::5"]}
    assert wait_for(lambda: (got := by_type("prefer")) == want and got, what="a slice per family") == want
    assert wait_for(lambda: by_type("single"), what="the IPv4 slice") == {"IPv4": ["10.72.0.5"]}
    assert wait_for(lambda: by_type("only6"), what="the IPv6 slice") == {"IPv6": ["fd00:10:72::5"]}

    arms = mesh.converged("prefer", {v4: ["10.72.0.5"], v6: ["fd00:10:72::5"]})
    assert arms[v4]["cluster"] == f"udp:{mesh.ns}/prefer" and arms[v6]["cluster"] == f"udp:{mesh.ns}/prefer@ipv6"
    assert {e["port"] for a in arms.values() for e in a["endpoints"]} == {5353}
    mesh.converged("single", {single["spec"]["clusterIP"]: ["10.72.0.5"]})
    mesh.converged("only6", {only6["spec"]["clusterIP"]: ["fd00:10:72::5"]})
    r4, r6 = require6["spec"]["clusterIPs"][1], require6["spec"]["clusterIPs"][0]
    mesh.converged("require6", {r6: ["fd00:10:72::5"], r4: ["10.72.0.5"]})


def test_the_meshnode_holds_both_families_of_pods_and_of_the_node(mesh: Mesh) -> None:
    def status() -> dict[str, Any] | None:
        st = (mesh.k.meshnode(mesh.node) or {}).get("status") or {}
        return st if st.get("pods") and st.get("addresses") else None

    st = wait_for(status, what="the MeshNode with its pods and addresses", ignore=READ_ERRORS)
    assert st["addresses"] == ["192.168.70.1", "fd00:192:168:70::1"]
    client = next(p for p in st["pods"] if p["name"] == "client")
    assert (client["ip"], client["ips"]) == ("10.72.0.2", ["10.72.0.2", "fd00:10:72::2"])


def test_a_service_converted_to_dual_stack_and_back_converges(mesh: Mesh) -> None:
    mesh.backend("dns-0", "10.72.1.5", "fd00:10:72:1::5")
    svc = mesh.service("conv", "SingleStack")
    (v4,) = svc["spec"]["clusterIPs"]
    mesh.converged("conv", {v4: ["10.72.1.5"]})

    svc = mesh.service("conv", "PreferDualStack")  # the server adds the IPv6 family and a VIP for it
    assert svc["spec"]["clusterIPs"][0] == v4 and families(svc) == ["IPv4", "IPv6"]
    v6 = svc["spec"]["clusterIPs"][1]
    mesh.converged("conv", {v4: ["10.72.1.5"], v6: ["fd00:10:72:1::5"]})

    # back to single-stack: the API wants the secondary family and its VIP removed with the policy
    patch = {"spec": {"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4"], "clusterIPs": [v4]}}
    mesh.k.res("v1", "Service").patch(body=patch, name="conv", namespace=mesh.ns, content_type=MERGE)
    mesh.converged("conv", {v4: ["10.72.1.5"]})


def test_a_family_without_endpoints_degrades_the_node_and_names_the_vip(mesh: Mesh) -> None:
    mesh.backend("dns-0", "10.72.2.5", None)  # a pod with an IPv4 podIP only
    svc = mesh.service("gap", "RequireDualStack")
    v4, v6 = svc["spec"]["clusterIPs"]
    mesh.converged("gap", {v4: ["10.72.2.5"], v6: []})

    def shape() -> dict[str, Any] | None:
        for s in mesh.k.slices():
            for x in s["spec"].get("udp", {}).get("unsupportedShapes") or []:
                if x["route"] == f"{mesh.ns}/gap" and x["reason"] == NO_ENDPOINTS_IN_FAMILY:
                    return dict(x)
        return None

    found = wait_for(shape, what="the NoEndpointsInFamily shape", ignore=READ_ERRORS)
    assert found["discarded"] == [v6] and "has no IPv6 endpoint" in found["message"]
    conditions = {c["type"]: c for c in (mesh.k.meshnode(mesh.node) or {})["status"]["conditions"]}
    assert conditions["Degraded"]["status"] == "True" and mesh.ns in conditions["Degraded"]["message"]

    # the kubelet reports the pod's IPv6 address: the controller writes the IPv6 slice, the shape goes
    mesh.backend("dns-0", "10.72.2.5", "fd00:10:72:2::5")
    mesh.converged("gap", {v4: ["10.72.2.5"], v6: ["fd00:10:72:2::5"]})
    wait_for(lambda: shape() is None, what="the shape gone", ignore=READ_ERRORS)


def test_a_dropped_family_arm_is_put_back(mesh: Mesh) -> None:
    mesh.backend("dns-0", "10.72.3.5", "fd00:10:72:3::5")
    svc = mesh.service("drift", "RequireDualStack")
    v4, v6 = svc["spec"]["clusterIPs"]
    mesh.converged("drift", {v4: ["10.72.3.5"], v6: ["fd00:10:72:3::5"]})
    held = next(s for s in mesh.k.slices() if s["spec"]["namespace"] == mesh.ns)
    arms = held["spec"]["udp"]["services"]
    kept = [a for a in arms if a["vip"] != v6]
    assert len(kept) == len(arms) - 1
    mesh.k.res(*SLICE).patch(
        body={"spec": {"udp": {"services": kept}}}, name=held["metadata"]["name"], content_type=MERGE
    )
    mesh.converged("drift", {v4: ["10.72.3.5"], v6: ["fd00:10:72:3::5"]})


def test_an_ipv6_only_control_plane_allocates_ipv6_and_the_operator_serves_it(api_kind: Kind) -> None:
    """`ip_family="ipv6"`: the one service CIDR is IPv6, RequireDualStack is refused, PreferDualStack gets one
    family; the controller's IPv6 slice becomes an `@ipv6` arm."""
    if api_kind != "real":
        pytest.skip("AETHER_CONTROL_PLANE=emulated: the emulator allocates no ClusterIP")
    with api_server("real", ip_family="ipv6") as server:
        assert server.control_plane is not None
        k = Cluster(server.kubeconfig, None)
        mesh = Mesh(k)
        with pytest.raises(UnprocessibleEntityError) as refused:
            mesh.service("both", "RequireDualStack")
        assert "not configured for dual-stack services" in str(refused.value.body)
        svc = mesh.service("prefer", "PreferDualStack")
        assert families(svc) == ["IPv6"] and in_cidr(svc["spec"]["clusterIP"], SERVICE_CIDR_V6)
        mesh.backend("dns-0", "10.72.9.5", "fd00:10:72:9::5")  # the kubelet of an IPv6 cluster lists both, say
        op = InProcessOperator(server.kubeconfig)
        op.start()
        try:
            arms = mesh.converged("prefer", {svc["spec"]["clusterIP"]: ["fd00:10:72:9::5"]})
            assert next(iter(arms.values()))["cluster"] == f"udp:{mesh.ns}/prefer@ipv6"
        finally:
            op.stop()
