"""The sidecar's UDP arms as the in-kernel path's arms (pure)."""

from __future__ import annotations

from aether.api.meshnode import ArmBackend, Endpoint, ServiceArm
from aether.netns.kernel_udp import KernelArm, KernelBackend, share_ranges
from aether.netns.kernel_udp_install import departed
from aether.xds.sidecar.kernel_arms import UNROUTABLE, kernel_arm, kernel_arms

E1, E2, E3 = Endpoint(ip="10.1.0.1", port=53), Endpoint(ip="10.1.0.2", port=53), Endpoint(ip="10.1.0.3", port=5353)


def arm(**kw: object) -> ServiceArm:
    return ServiceArm.model_validate({"service": "default/dns", "vip": "10.96.0.10", "cluster": "udp:default/dns"} | kw)


def test_plain_arm_leaves_draining_endpoints_out() -> None:
    drained = E2.model_copy(update={"draining": True})
    got = kernel_arm(arm(endpoints=[E1, drained]))
    assert got == KernelArm("10.96.0.10", (KernelBackend("10.1.0.1", 53, 1),))


def test_tcp_arms_are_not_kernel_arms_and_blackhole_drops() -> None:
    assert kernel_arm(arm(cluster="tcp:default/dns", endpoints=[E1])) is None
    assert kernel_arms([arm(cluster="blackhole", reason="NoHealthyBackend")]) == [KernelArm("10.96.0.10", ())]


def test_weighted_arm_shares_weight_over_endpoints_and_drops_invalid() -> None:
    backends = [
        ArmBackend(backend="default/a", weight=60, share=60, endpoints=[E1, E2]),
        ArmBackend(backend="default/b", weight=30, share=30, endpoints=[E3]),
        ArmBackend(backend="default/c", weight=10, share=10, reason="BackendNotFound"),
        ArmBackend(backend="default/d", weight=0, share=0, endpoints=[E1], reason="Drained"),
    ]
    got = kernel_arm(arm(backends=backends))
    assert got is not None
    assert got.backends == (
        KernelBackend("10.1.0.1", 53, 60),
        KernelBackend("10.1.0.2", 53, 60),
        KernelBackend("10.1.0.3", 5353, 60),
        UNROUTABLE._replace(weight=20),
    )
    sizes = [r.high - r.low + 1 for r in share_ranges([b.weight for b in got.backends])]
    assert sizes == [30, 30, 30, 10]  # a: 60 % over two endpoints, b: 30 %, c's 10 % dropped, d: nothing


def test_weighted_backend_without_serving_endpoint_drops_its_share() -> None:
    backends = [
        ArmBackend(backend="default/a", weight=1, share=50, endpoints=[E1]),
        ArmBackend(backend="default/b", weight=1, share=50, endpoints=[E2.model_copy(update={"draining": True})]),
    ]
    got = kernel_arm(arm(backends=backends))
    assert got is not None and got.backends == (KernelBackend("10.1.0.1", 53, 1), UNROUTABLE._replace(weight=1))


def test_the_services_own_idle_timeout_rides_along_and_none_leaves_the_nodes() -> None:
    timed = kernel_arm(arm(endpoints=[E1], idle_timeout_seconds=5.0))
    assert timed is not None and timed.idle_timeout_s == 5.0
    plain = kernel_arm(arm(endpoints=[E1]))
    assert plain is not None and plain.idle_timeout_s is None
    assert kernel_arms([arm(cluster="blackhole", idle_timeout_seconds=2.0)]) == [KernelArm("10.96.0.10", (), 2.0)]


def test_a_udproute_split_arm_is_a_kernel_arm() -> None:
    backends = [ArmBackend(backend="default/a", weight=7, share=70, endpoints=[E1])]
    backends.append(ArmBackend(backend="default/b", weight=3, share=30, endpoints=[E3]))
    got = kernel_arm(arm(cluster="udp-split:default/dns", backends=backends))
    assert got == KernelArm("10.96.0.10", (KernelBackend("10.1.0.1", 53, 7), KernelBackend("10.1.0.3", 5353, 3)))
    six = kernel_arm(arm(vip="fd00::a", cluster="udp-split:default/dns@ipv6", backends=backends))
    assert six is not None and len(six.backends) == 2


def test_a_drained_backends_endpoints_stay_valid_with_no_share_so_their_flows_finish() -> None:
    live = ArmBackend(backend="default/a", weight=1, share=100, endpoints=[E1])
    before = kernel_arm(arm(backends=[live, ArmBackend(backend="default/b", weight=1, share=50, endpoints=[E3])]))
    drained = ArmBackend(backend="default/b", weight=0, share=0, endpoints=[E3], reason="Drained")
    after = kernel_arm(arm(backends=[live, drained]))
    assert after is not None and before is not None
    assert after.backends == (KernelBackend("10.1.0.1", 53, 1), KernelBackend("10.1.0.3", 5353, 0))
    assert [r.backend for r in share_ranges([b.weight for b in after.backends])] == [0]  # no new flow for b
    assert departed([before], [after]) == []  # the installer forgets none of b's open flows
    removed = kernel_arm(arm(backends=[live]))
    assert removed is not None and departed([after], [removed]) == [("10.96.0.10", "10.1.0.3", 5353)]
