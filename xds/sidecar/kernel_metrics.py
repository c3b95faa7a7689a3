"""The in-kernel UDP path's counters as the sidecar's Prometheus metrics (docs/operations.md#the-udp-data-path).

`KernelUdpCollector` reads the named counters of every pod netns the kernel path programmed
(`read_kernel_udp_counters`, one netns after the other, on a thread of its own) and exports them summed over the
node's pods, per Service and per backend endpoint:

    aether_kernel_udp_service_packets_total{service}          datagrams pods sent to the Service's VIP:18082
    aether_kernel_udp_service_bytes_total{service}
    aether_kernel_udp_backend_packets_total{service,backend}  datagrams rewritten to that endpoint (ip:port)
    aether_kernel_udp_backend_bytes_total{service,backend}

`CounterTotals` keeps each sum monotonic: a netns's counter that went down (its table was replaced whole) or
vanished (its pod left, the endpoint left) adds its last value to a retired part, so Prometheus sees no reset.
The label sets are what is live: a Service or endpoint no pod netns holds any more is dropped with its retired part.
The cost is capped: a scrape reads nothing (it answers from the last sweep), and a sweep paces itself to `duty` of
one CPU (docs/performance.md: a netns's read costs nft's listing of its counters).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, Metric

from aether.netns.kernel_udp import KernelUdpCounter
from aether.netns.kernel_udp_install import KernelUdpError, read_kernel_udp_counters
from aether.xds.sidecar.kernel_path import Applied, vip_key

log = logging.getLogger("aether.xds.sidecar.kernel")
INTERVAL_S = 15.0  # between two sweeps over the pod netns
DUTY = 0.05  # of one CPU, at most, for reading the counters
Key = tuple[str, str | None]  # (service, "ip:port" of the backend or None for the Service's own counter)
Reading = dict[Key, tuple[int, int]]  # per key: (packets, bytes) in one netns


def reading(counters: Iterable[KernelUdpCounter], services: Mapping[str, str]) -> Reading:
    """One netns's counters by (service, backend); a VIP this netns was not programmed with is left out."""
    out: Reading = {}
    for c in counters:
        service = services.get(vip_key(c.vip))
        if service is None:
            continue
        backend = None if c.backend_ip is None else f"{c.backend_ip}:{c.backend_port}"
        packets, bytes_ = out.get((service, backend), (0, 0))
        out[(service, backend)] = (packets + c.packets, bytes_ + c.bytes)
    return out


class CounterTotals:
    """Monotonic per-key sums over netns whose counters may restart or vanish (pure; see the module docstring)."""

    def __init__(self) -> None:
        self.last: dict[str, Reading] = {}  # netns -> its last reading
        self.retired: dict[Key, tuple[int, int]] = {}

    def _retire(self, key: Key, value: tuple[int, int]) -> None:
        p, b = self.retired.get(key, (0, 0))
        self.retired[key] = (p + value[0], b + value[1])

    def update(self, readings: Mapping[str, Reading]) -> dict[Key, tuple[int, int]]:
        """The totals after `readings` (netns -> its counters now; a netns left out is gone)."""
        for netns, before in self.last.items():
            now = readings.get(netns, {})
            for key, value in before.items():
                cur = now.get(key)
                if cur is None or cur[0] < value[0] or cur[1] < value[1]:
                    self._retire(key, value)
        self.last = {n: dict(r) for n, r in readings.items()}
        live = {key for r in readings.values() for key in r}
        self.retired = {k: v for k, v in self.retired.items() if k in live}
        totals = dict(self.retired)
        for r in readings.values():
            for key, (p, b) in r.items():
                tp, tb = totals.get(key, (0, 0))
                totals[key] = (tp + p, tb + b)
        return totals


Read = Callable[[str], Sequence[KernelUdpCounter]]


class KernelUdpCollector:
    """A prometheus_client collector over what `holding()` says the pod netns hold. A scrape reads no netns: it
    answers from the last sweep, which a thread of its own (`start`) runs every `interval_s`, reading one netns
    after the other and pausing after each so that reading takes at most `duty` of one CPU (a netns read costs
    what nft takes to list its counters: 155 ms p50 at 1,000 Services here, so 100 pods take about 5 minutes a
    sweep at the default 5 %)."""

    def __init__(
        self,
        holding: Callable[[], list[Applied]],
        read: Read = read_kernel_udp_counters,
        interval_s: float = INTERVAL_S,
        duty: float = DUTY,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._holding, self._read, self._interval_s, self._duty, self._clock = holding, read, interval_s, duty, clock
        self._totals = CounterTotals()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.current: dict[Key, tuple[int, int]] = {}  # what a scrape exports: the last sweep's totals
        self.sweeps = 0

    def describe(self) -> list[Metric]:
        return []  # registering reads no netns

    def sweep(self, pause: Callable[[float], object] | None = None) -> None:
        """Read every held netns once (pausing `pause(seconds)` after each to keep to `duty`), then publish."""
        readings: dict[str, Reading] = {}
        for applied in self._holding():
            netns = applied.target.netns
            t0 = self._clock()
            try:
                readings[netns] = reading(self._read(netns), applied.services)
            except KernelUdpError as exc:
                log.warning("kernel UDP counters of pod %s unreadable: %s", applied.target.name, exc)
                readings[netns] = self._totals.last.get(netns, {})  # kept as it was: no false reset
            if pause is not None:
                pause((self._clock() - t0) * (1 / self._duty - 1))
        self.current = self._totals.update(readings)
        self.sweeps += 1

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.sweep(self._stop.wait)
                except Exception:
                    log.exception("reading the kernel UDP counters failed")
                self._stop.wait(self._interval_s)

        self._thread = threading.Thread(target=loop, name="kernel-udp-counters", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def collect(self) -> Iterator[Metric]:
        totals = self.current
        help_ = {
            "service": "datagrams pods of this node sent to the Service's VIP:18082 on the in-kernel UDP path",
            "backend": "datagrams the in-kernel UDP path rewrote to this backend endpoint (ip:port)",
        }
        families = {
            (kind, unit): CounterMetricFamily(
                f"aether_kernel_udp_{kind}_{unit}",
                f"{help_[kind]}, {unit}, summed over the node's pods",
                labels=["service"] if kind == "service" else ["service", "backend"],
            )
            for kind in ("service", "backend")
            for unit in ("packets", "bytes")
        }
        for (service, backend), (packets, bytes_) in sorted(totals.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            kind = "service" if backend is None else "backend"
            labels = [service] if backend is None else [service, backend]
            families[(kind, "packets")].add_metric(labels, packets)
            families[(kind, "bytes")].add_metric(labels, bytes_)
        yield from families.values()
