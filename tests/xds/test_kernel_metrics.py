"""The in-kernel UDP path's counters on the sidecar's /metrics: per Service and per backend, summed over the node's
pod netns, monotonic across a netns's table replacement or departure, label sets bounded by what is live, a scrape reading no
netns and a sweep pacing itself (recorded counters in place of the kernel; a real HTTP scrape)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aether.metrics import REGISTRY
from aether.metrics import serve as serve_metrics
from aether.netns.kernel_udp import KernelArm, KernelUdpCounter
from aether.netns.kernel_udp_install import KernelUdpError
from aether.testing.promtext import Samples, named, scrape, value
from aether.testing.wait import wait_for
from aether.xds.sidecar.kernel_metrics import CounterTotals, KernelUdpCollector, reading
from aether.xds.sidecar.kernel_path import Applied, PodTarget

VIP_A, VIP_B = "10.96.0.10", "10.96.0.11"
SERVICES = {VIP_A: "app/dns", VIP_B: "app/echo"}


def counters(a: int, a1: int, b: int = 0) -> list[KernelUdpCounter]:
    out = [KernelUdpCounter(VIP_A, None, None, a, 100 * a), KernelUdpCounter(VIP_A, "10.1.0.1", 5353, a1, 100 * a1)]
    return out + ([KernelUdpCounter(VIP_B, None, None, b, 10 * b)] if b else [])


def test_reading_keys_by_service_and_backend_and_skips_unknown_vips() -> None:
    got = reading([*counters(3, 2), KernelUdpCounter("10.96.9.9", None, None, 7, 7)], SERVICES)
    assert got == {("app/dns", None): (3, 300), ("app/dns", "10.1.0.1:5353"): (2, 200)}


def test_totals_stay_monotonic_when_a_netns_restarts_or_leaves_and_drop_what_is_gone() -> None:
    t = CounterTotals()
    one = {"/ns/1": reading(counters(5, 5, 2), SERVICES), "/ns/2": reading(counters(1, 1), SERVICES)}
    assert t.update(one)[("app/dns", None)] == (6, 600)
    restarted = {"/ns/1": reading(counters(2, 2, 1), SERVICES), "/ns/2": reading(counters(1, 1), SERVICES)}
    after = t.update(restarted)  # /ns/1's table was replaced whole: its counters started again at 0
    assert after[("app/dns", None)] == (5 + 2 + 1, 800) and after[("app/echo", None)] == (2 + 1, 30)
    left = t.update({"/ns/2": reading(counters(4, 4), SERVICES)})  # /ns/1's pod left: its counts stay counted
    assert left[("app/dns", None)] == (5 + 2 + 4, 1100)
    assert ("app/echo", None) not in left  # no netns holds app/echo any more: its series goes


def test_a_scrape_reads_nothing_and_a_sweep_paces_itself_to_its_duty() -> None:
    reads: list[str] = []
    now = [0.0]
    paused: list[float] = []
    held = [Applied(PodTarget("app/client-0", "/ns/1"), (KernelArm(VIP_A, ()),), SERVICES)]

    def read(netns: str) -> list[KernelUdpCounter]:
        reads.append(netns)
        now[0] += 0.2  # each read takes 200 ms
        if netns == "/ns/broken":
            raise KernelUdpError("setns: no such netns")
        return counters(len(reads), 1)

    c = KernelUdpCollector(lambda: held, read, duty=0.05, clock=lambda: now[0])
    assert all(m.samples == [] for m in c.collect()) and reads == []  # nothing swept yet: a scrape reads no netns
    c.sweep(paused.append)
    assert c.current[("app/dns", None)] == (1, 100) and reads == ["/ns/1"]
    assert paused == [pytest.approx(0.2 * 19)]  # 200 ms of reading, 3.8 s of pause: 5 % of one CPU
    list(c.collect())
    assert reads == ["/ns/1"]
    held.append(Applied(PodTarget("app/client-1", "/ns/broken"), (), SERVICES))
    c.sweep()  # the broken netns keeps what it had (nothing): no false reset, the sweep goes on
    assert c.current[("app/dns", None)] == (2, 200) and reads == ["/ns/1", "/ns/1", "/ns/broken"]


@pytest.fixture
def registered() -> Iterator[list[Applied]]:
    held: list[Applied] = []
    live = {"/ns/1": counters(7, 4, 2), "/ns/2": counters(3, 3)}
    collector = KernelUdpCollector(lambda: list(held), lambda n: live[n], interval_s=0.01, duty=1.0)
    REGISTRY.register(collector)
    collector.start()
    try:
        yield held
    finally:
        collector.stop()
        REGISTRY.unregister(collector)


def _kernel(got: Samples, dns: int, echo: bool = True) -> Samples | None:
    """`got` once app/dns's packets are `dns` and app/echo's series is there (or not)."""
    name = "aether_kernel_udp_service_packets_total"
    has_echo = (name, (("service", "app/echo"),)) in got
    return got if value(got, name, service="app/dns") == dns and has_echo == echo else None


def test_a_real_scrape_shows_the_sums_per_service_and_backend(registered: list[Applied]) -> None:
    server = serve_metrics("127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        assert named(scrape(url), "aether_kernel_udp_service_packets_total") == {}  # nothing programmed yet
        registered += [Applied(PodTarget(f"app/client-{i}", f"/ns/{i}"), (), SERVICES) for i in (1, 2)]
        got = wait_for(lambda: _kernel(scrape(url), 10), 10, "the sweep's sums on /metrics")
        assert value(got, "aether_kernel_udp_service_packets_total", service="app/dns") == 10
        assert value(got, "aether_kernel_udp_service_bytes_total", service="app/dns") == 1000
        assert value(got, "aether_kernel_udp_service_packets_total", service="app/echo") == 2
        backend = {"service": "app/dns", "backend": "10.1.0.1:5353"}
        assert value(got, "aether_kernel_udp_backend_packets_total", **backend) == 7
        assert value(got, "aether_kernel_udp_backend_bytes_total", **backend) == 700
        registered[:] = registered[1:]  # client-1 left: app/echo is in no netns any more
        gone = wait_for(lambda: _kernel(scrape(url), 10, echo=False), 10, "app/echo's series gone")
        assert set(named(gone, "aether_kernel_udp_service_packets_total")) == {
            ("aether_kernel_udp_service_packets_total", (("service", "app/dns"),))
        }
        assert value(gone, "aether_kernel_udp_service_packets_total", service="app/dns") == 10  # monotonic
    finally:
        server.shutdown()
