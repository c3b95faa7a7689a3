"""The process's Prometheus metrics, one registry per process, named `aether_*`.

Each area declares its own metrics here so names stay unique and documented in one place.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry(auto_describe=True)

UDP_UNSUPPORTED = Counter(
    "aether_udp_unsupported",
    "UDPRoute/Service shapes the UDP data path cannot express, by reason (each discarded backend counts once)",
    ["reason"],
    registry=REGISTRY,
)
XDS_NACKS = Counter(
    "aether_xds_nacks",
    "Delta-ADS responses Envoy rejected (NACK), by resource type",
    ["type_url"],
    registry=REGISTRY,
)
XDS_GATE_REFUSALS = Counter(
    "aether_xds_gate_refusals",
    "States refused by our own validation gates before serving, by gate",
    ["gate"],
    registry=REGISTRY,
)
XDS_PUSHED_RESOURCES = Counter(
    "aether_xds_pushed_resources",
    "Resources sent to Envoy (added or changed), by resource type",
    ["type_url"],
    registry=REGISTRY,
)
XDS_CONNECTED_STREAMS = Gauge(
    "aether_xds_connected_streams",
    "Open delta-ADS streams",
    registry=REGISTRY,
)
