"""The in-kernel UDP path's counters as the sidecar's Prometheus metrics (docs/operations.md#the-udp-data-path).

At scrape time `KernelUdpCollector` reads the named counters of every pod netns the kernel path programmed
(`read_kernel_udp_counters`, one netns after the other) and exports them summed over the node's pods, per Service
and per backend endpoint:

    aether_kernel_udp_service_packets_total{service}          datagrams pods sent to the Service's VIP:18082
    aether_kernel_udp_service_bytes_total{service}
    aether_kernel_udp_backend_packets_total{service,backend}  datagrams rewritten to that endpoint (ip:port)
    aether_kernel_udp_backend_bytes_total{service,backend}

`CounterTotals` keeps each sum monotonic: a netns's counter that went down (its table was replaced whole) or
vanished (its pod left, the endpoint left) adds its last value to a retired part, so Prometheus sees no reset.
The label sets are what is live: a Service or endpoint no pod netns holds any more is dropped with its retired part.
The cost is capped: a scrape within `max_age_s` of the last read is answered from that read.
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
MAX_AGE_S = 5.0
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
    """A prometheus_client collector over what `holding()` says the pod netns hold."""

    def __init__(
        self,
        holding: Callable[[], list[Applied]],
        read: Read = read_kernel_udp_counters,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._holding, self._read, self._max_age_s, self._clock = holding, read, max_age_s, clock
        self._totals = CounterTotals()
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[Key, tuple[int, int]]] | None = None

    def describe(self) -> list[Metric]:
        return []  # registering reads no netns

    def _read_all(self) -> dict[Key, tuple[int, int]]:
        readings: dict[str, Reading] = {}
        for applied in self._holding():
            netns = applied.target.netns
            try:
                readings[netns] = reading(self._read(netns), applied.services)
            except KernelUdpError as exc:
                log.warning("kernel UDP counters of pod %s unreadable: %s", applied.target.name, exc)
                readings[netns] = self._totals.last.get(netns, {})  # kept as it was: no false reset
        return self._totals.update(readings)

    def totals(self) -> dict[Key, tuple[int, int]]:
        with self._lock:
            now = self._clock()
            if self._cached is None or now - self._cached[0] >= self._max_age_s:
                self._cached = (now, self._read_all())
            return self._cached[1]

    def collect(self) -> Iterator[Metric]:
        totals = self.totals()
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
