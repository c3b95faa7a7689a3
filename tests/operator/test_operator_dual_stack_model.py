"""The operator's pure model on both IP families: a Service's `clusterIPs` give one arm per family, each carrying
that family's endpoints (the EndpointSlices of its addressType), in clusters named per family (`udp:<ns>/<svc>` for
IPv4, `udp:<ns>/<svc>@ipv6` for IPv6); a dual-stack pod's `podIPs` and a node's InternalIPs of both families are
in its MeshNode; a family without endpoints, and an FQDN slice, are shapes that say why. Incremental passes equal
a pass from scratch. (The same on the real kube-apiserver: test_operator_dual_stack.py.)"""

from __future__ import annotations

from typing import Any

from aether.api.meshnode import EffectiveStatus, ServiceArm
from aether.operator.reconcile.model import ClusterModel
from aether.operator.reconcile.namespace import NO_ENDPOINTS_IN_FAMILY, UNSUPPORTED_ADDRESS_TYPE
from aether.testing.apitestbed import objects as o

NS = "app"
UDP_TCP = [("dns", 53, "UDP"), ("web", 80, "TCP")]
SLICE_PORTS = [("dns", 5353, "UDP"), ("web", 8080, "TCP")]
V4, V6 = "10.96.0.20", "fd00:10:96::20"


def service(name: str, *vips: str, ports: Any = UDP_TCP) -> dict[str, Any]:
    """A Service as a dual-stack API server stores it: clusterIP is clusterIPs[0], ipFamilies in the same order."""
    body = o.service(NS, name, vips[0], ports)
    body["spec"]["clusterIPs"] = list(vips)
    body["spec"]["ipFamilies"] = ["IPv6" if ":" in v else "IPv4" for v in vips]
    body["spec"]["ipFamilyPolicy"] = "RequireDualStack" if len(vips) > 1 else "SingleStack"
    body["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    return body


def model() -> ClusterModel:
    m = ClusterModel()
    m.apply_raw("namespace", o.namespace(NS))
    m.apply_raw("node", {**o.node("n1"), **o.node_status("192.168.0.1", "fd00:192:168::1")})
    pod = {**o.pod(NS, "client", "n1"), **o.pod_status("10.1.0.2", also=["fd00:10:1::2"])}
    pod["metadata"]["uid"] = "p1"
    m.apply_raw("pod", pod)
    return m


def slices(m: ClusterModel, name: str, v4: list[str], v6: list[str]) -> None:
    """What the EndpointSlice controller writes for dual-stack pods: one slice per address type."""
    for family, ips in (("4", v4), ("6", v6)):
        eps = [(ip, True, None) for ip in ips]
        m.apply_raw("slice", o.endpoint_slice(NS, name, SLICE_PORTS, eps, name=f"{name}-v{family}"))


def status(m: ClusterModel) -> EffectiveStatus:
    out = m.reconcile()
    return out.nodes["n1"] if "n1" in out.nodes else m.reconcile(full=True).nodes["n1"]


def arms(st: EffectiveStatus, transport: str = "udp") -> dict[str, ServiceArm]:
    return {a.vip: a for a in getattr(st, transport).services}


def endpoint_ips(arm: ServiceArm) -> list[str]:
    return [e.ip for e in arm.endpoints] + [e.ip for b in arm.backends or () for e in b.endpoints]


def from_scratch(m: ClusterModel) -> EffectiveStatus:
    return m.reconcile(full=True).nodes["n1"]


def test_each_family_s_vip_carries_that_family_s_endpoints_in_a_cluster_of_its_own() -> None:
    m = model()
    m.apply_raw("service", service("dns", V4, V6))
    slices(m, "dns", ["10.1.0.5", "10.1.0.6"], ["fd00:10:1::5", "fd00:10:1::6"])
    st = status(m)
    udp, tcp = arms(st), arms(st, "tcp")
    assert set(udp) == set(tcp) == {V4, V6}
    assert (udp[V4].cluster, udp[V6].cluster) == ("udp:app/dns", "udp:app/dns@ipv6")
    assert (tcp[V4].cluster, tcp[V6].cluster) == ("tcp:app/dns", "tcp:app/dns@ipv6")
    assert endpoint_ips(udp[V4]) == ["10.1.0.5", "10.1.0.6"] and endpoint_ips(udp[V6]) == [
        "fd00:10:1::5",
        "fd00:10:1::6",
    ]
    assert {e.port for a in udp.values() for e in a.endpoints} == {5353}
    assert {e.port for a in tcp.values() for e in a.endpoints} == {8080}
    assert not st.udp.unsupported_shapes and not st.tcp.unsupported_shapes
    assert st == from_scratch(m)


def test_a_single_stack_service_in_a_dual_stack_cluster_has_one_arm_of_its_family() -> None:
    m = model()
    m.apply_raw("service", service("v6only", V6))
    m.apply_raw("service", service("v4only", V4))
    slices(m, "v6only", [], ["fd00:10:1::7"])
    slices(m, "v4only", ["10.1.0.7"], [])
    udp = arms(status(m))
    assert {v: (a.service, a.cluster, endpoint_ips(a)) for v, a in udp.items()} == {
        V6: ("app/v6only", "udp:app/v6only@ipv6", ["fd00:10:1::7"]),
        V4: ("app/v4only", "udp:app/v4only", ["10.1.0.7"]),
    }


def test_a_conversion_from_single_to_dual_stack_adds_the_second_family_s_arm_and_back() -> None:
    m = model()
    m.apply_raw("service", service("dns", V4))
    slices(m, "dns", ["10.1.0.5"], ["fd00:10:1::5"])
    assert set(arms(status(m))) == {V4}
    m.apply_raw("service", service("dns", V4, V6))  # ipFamilyPolicy SingleStack -> RequireDualStack
    st = status(m)
    assert set(arms(st)) == {V4, V6} and endpoint_ips(arms(st)[V6]) == ["fd00:10:1::5"]
    assert arms(st)[V4].cluster == "udp:app/dns", "the IPv4 arm is left as it was"
    assert st == from_scratch(m)
    m.apply_raw("service", service("dns", V4))  # and back: the IPv6 VIP is released
    st = status(m)
    assert set(arms(st)) == {V4} and st == from_scratch(m)


def test_a_family_without_endpoints_is_a_shape_that_names_its_vip() -> None:
    m = model()
    m.apply_raw("service", service("dns", V4, V6))
    slices(m, "dns", ["10.1.0.5"], [])  # pods with IPv4 podIPs only
    st = status(m)
    assert endpoint_ips(arms(st)[V6]) == []
    shapes = [s for s in st.udp.unsupported_shapes if s.reason == NO_ENDPOINTS_IN_FAMILY]
    assert [(s.route, s.discarded) for s in shapes] == [("app/dns", [V6])]
    assert "has no IPv6 endpoint" in shapes[0].message
    assert [s.discarded for s in st.tcp.unsupported_shapes if s.reason == NO_ENDPOINTS_IN_FAMILY] == [[V6]]
    degraded = next(c for c in st.conditions if c.type == "Degraded")
    assert degraded.status == "True", degraded
    slices(m, "dns", ["10.1.0.5"], ["fd00:10:1::5"])  # the pod gets its IPv6 address: the shape goes
    assert not status(m).udp.unsupported_shapes


def test_an_fqdn_slice_is_not_used_and_the_service_says_why() -> None:
    m = model()
    m.apply_raw("service", service("dns", V4))
    slices(m, "dns", ["10.1.0.5"], [])
    fqdn = o.endpoint_slice(NS, "dns", SLICE_PORTS, [("backend.example.com", True, None)], name="dns-fqdn")
    fqdn["addressType"] = "FQDN"
    m.apply_raw("slice", fqdn)
    st = status(m)
    assert endpoint_ips(arms(st)[V4]) == ["10.1.0.5"]
    shape = next(s for s in st.udp.unsupported_shapes if s.reason == UNSUPPORTED_ADDRESS_TYPE)
    assert shape.discarded == ["dns-fqdn"] and "FQDN" in shape.message


def test_a_weighted_route_on_a_dual_stack_parent_splits_each_family_over_that_family_s_endpoints() -> None:
    m = model()
    m.apply_raw("service", service("front", V4, V6))
    m.apply_raw("service", service("a", "10.96.0.21", "fd00:10:96::21"))
    m.apply_raw("service", service("b", "10.96.0.22", "fd00:10:96::22"))
    slices(m, "a", ["10.1.0.21"], ["fd00:10:1::21"])
    slices(m, "b", ["10.1.0.22"], ["fd00:10:1::22"])
    m.apply_raw("route", o.udproute(NS, "split", "front", [o.backend("a", 53, 3), o.backend("b", 53, 1)]))
    udp = arms(status(m))
    assert (udp[V4].cluster, udp[V6].cluster) == ("udp-split:app/front", "udp-split:app/front@ipv6")
    for vip, ips in ((V4, ["10.1.0.21", "10.1.0.22"]), (V6, ["fd00:10:1::21", "fd00:10:1::22"])):
        backends = udp[vip].backends or []
        assert [(b.backend, b.share, [e.ip for e in b.endpoints]) for b in backends] == [
            ("app/a", 75.0, [ips[0]]),
            ("app/b", 25.0, [ips[1]]),
        ]
    m.apply_raw("route", o.udproute(NS, "split", "front", [o.backend("a", 53)]))  # one backend: its own clusters
    udp = arms(status(m))
    assert (udp[V4].cluster, udp[V6].cluster) == ("udp:app/a", "udp:app/a@ipv6")
    assert endpoint_ips(udp[V6]) == ["fd00:10:1::21"]


def test_pods_and_nodes_carry_both_families_into_the_meshnode() -> None:
    m = model()
    st = status(m)
    assert [(p.ip, p.ips) for p in st.pods] == [("10.1.0.2", ["10.1.0.2", "fd00:10:1::2"])]
    assert st.pods[0].addresses == ["10.1.0.2", "fd00:10:1::2"]
    assert st.addresses == ["192.168.0.1", "fd00:192:168::1"]
    single = {**o.pod(NS, "client", "n1"), **o.pod_status("10.1.0.2")}
    single["metadata"]["uid"] = "p1"
    m.apply_raw("pod", single)
    st = status(m)
    assert "ips" not in st.pods[0].wire(), "a single-stack pod's entry is written as before"
    assert st.pods[0].addresses == ["10.1.0.2"]


def test_quic_destinations_dial_the_primary_family_and_a_policy_guards_both() -> None:
    m = model()
    m.apply_raw("service", service("dns", V4, V6))
    for i, (v4, v6) in enumerate((("10.1.0.5", "fd00:10:1::5"), ("10.1.0.6", "fd00:10:1::6"))):
        pod = {**o.pod(NS, f"dns-{i}", "n1", "dns"), **o.pod_status(v4, also=[v6])}
        m.apply_raw("pod", pod)
    for family, ips in (("4", ["10.1.0.5", "10.1.0.6"]), ("6", ["fd00:10:1::5", "fd00:10:1::6"])):
        eps = [(ip, True, f"dns-{i}") for i, ip in enumerate(ips)]
        m.apply_raw("slice", o.endpoint_slice(NS, "dns", SLICE_PORTS, eps, name=f"dns-v{family}"))
    st = status(m)
    dest = next(d for d in st.quic.destinations if d.service == "app/dns")
    assert [e.ip for e in dest.endpoints] == ["10.1.0.5", "10.1.0.6"]
    assert dest.unready_ips == ["fd00:10:1::5", "fd00:10:1::6"]
