"""The process's Prometheus metrics, one registry per process, named `aether_*`.

Each area declares its own metrics here so names stay unique and documented in one place.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from aether.heap import AFTER_FULL, malloc_in_use

REGISTRY = CollectorRegistry(auto_describe=True)

UDP_UNSUPPORTED = Counter(
    "aether_udp_unsupported",
    "Service/UDPRoute shapes the UDP data path still cannot express, by reason (each discarded part counts once)",
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
    "Refusals by our own validation gates before serving, by gate: a resource removed from the served state (the "
    "rest is served; once per change of what is removed) or a whole state refused",
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

# ---- QUIC pairs (the sidecar; xds/pairs/keeper.py, docs/pairs.md) ----------------------------------------------
QUIC_PAIRS = Gauge(
    "aether_quic_pairs", "QUIC pairs whose twin the snapshot holds (admitted, not dormant)", registry=REGISTRY
)
QUIC_DORMANT_PAIRS = Gauge(
    "aether_quic_dormant_pairs",
    "QUIC pairs kept dormant: removal evidence while the proxy holds their twin's ODCDS subscription",
    registry=REGISTRY,
)
QUIC_PAIR_ADMISSIONS = Counter(
    "aether_quic_pair_admissions",
    "QUIC pairs admitted, by evidence: Fetch (an on-demand request) or Resubscribe (a fresh stream named it)",
    ["evidence"],
    registry=REGISTRY,
)
QUIC_PAIR_REFUSALS = Counter(
    "aether_quic_pair_refusals",
    "Twin names refused (answered absent), by reason: MalformedName, SourceNotLocal, DestinationIneligible, "
    "DestinationNotADependency",
    ["reason"],
    registry=REGISTRY,
)
QUIC_PAIR_PRUNES = Counter(
    "aether_quic_pair_prunes",
    "QUIC pairs pruned with their twin, by cause: FetchWindow, NotResubscribed, SourceLeft, DestinationLeft, "
    "DestinationIneligible, MalformedRecord",
    ["cause"],
    registry=REGISTRY,
)
QUIC_PAIR_FETCH_SECONDS = Histogram(
    "aether_quic_pair_fetch_seconds",
    "One on-demand CDS request (Envoy may name several twins in one), in the sidecar: from its arrival to the "
    "snapshot holding the answer",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    registry=REGISTRY,
)
QUIC_PAIR_WRITE_FAILURES = Counter(
    "aether_quic_pair_write_failures",
    "Failed writes of status.quic.pairs/dormantPairs (retried with backoff; traffic is served from memory)",
    registry=REGISTRY,
)

# ---- the operator (`aether operator --metrics ADDR`) ---------------------------------------------------------
OPERATOR_RECONCILE_PASSES = Counter(
    "aether_operator_reconcile_passes",
    "Reconcile passes run (one per debounced batch of changed keys, failed ones included)",
    registry=REGISTRY,
)
OPERATOR_RECONCILE_DURATION = Histogram(
    "aether_operator_reconcile_duration_seconds",
    "Wall time of one reconcile pass: model update, computation and every write it made",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
    registry=REGISTRY,
)
OPERATOR_RECONCILE_ERRORS = Counter(
    "aether_operator_reconcile_errors",
    "Reconcile passes that failed (the batch is retried), by kind: api_<HTTP status> or the exception's class",
    ["kind"],
    registry=REGISTRY,
)
OPERATOR_LAST_PASS = Gauge(
    "aether_operator_last_reconcile_timestamp_seconds",
    "Unix time the last reconcile pass ended (ok or failed)",
    registry=REGISTRY,
)
OPERATOR_SLICE_WRITES = Counter(
    "aether_operator_slice_writes",
    "MeshServiceSlice writes by outcome: created, patched (a JSON patch of the change), unchanged (skipped), "
    "deleted, conflict_retry (a stale copy: re-read and retried)",
    ["outcome"],
    registry=REGISTRY,
)
OPERATOR_MESHNODE_WRITES = Counter(
    "aether_operator_meshnode_writes",
    "MeshNode writes by outcome: created, patched (status), unchanged (skipped: nothing to write), deleted, "
    "conflict_retry (a 409/404 on the status patch, re-read and retried)",
    ["outcome"],
    registry=REGISTRY,
)
OPERATOR_UDPROUTE_STATUS_WRITES = Counter(
    "aether_operator_udproute_status_writes",
    "UDPRoute status writes by outcome: patched, unchanged (skipped), conflict_retry (a 409, re-read and retried)",
    ["outcome"],
    registry=REGISTRY,
)
OPERATOR_WRITE_REFUSALS = Counter(
    "aether_operator_write_refusals",
    "Writes the API refused for that object (422 Invalid), by kind (meshnode, udproute): counted once per change "
    "of what would be written; the same body is not sent again",
    ["kind"],
    registry=REGISTRY,
)
OPERATOR_WRITE_RETRIES = Counter(
    "aether_operator_write_retries",
    "Failed writes scheduled again with backoff, by kind (meshnode, udproute, delete) and error (api_<status> or "
    "the exception's class)",
    ["kind", "error"],
    registry=REGISTRY,
)
OPERATOR_DRIFT_CORRECTIONS = Counter(
    "aether_operator_drift_corrections",
    "Stored status that differed from what the operator computes while its inputs had not changed (a user's "
    "patch, a lost write), written back, by kind (meshnode, udproute)",
    ["kind"],
    registry=REGISTRY,
)
OPERATOR_RESYNCS = Counter(
    "aether_operator_resyncs",
    "Periodic resyncs: every MeshNode and UDPRoute status compared with what the operator computes",
    registry=REGISTRY,
)
OPERATOR_PENDING_KEYS = Gauge(
    "aether_operator_pending_keys",
    "Changed objects (kind, namespace, name) waiting for the next reconcile pass",
    registry=REGISTRY,
)
OPERATOR_MESHNODES = Gauge(
    "aether_operator_meshnodes",
    "MeshNodes the operator owns (one per Node it has written one for)",
    registry=REGISTRY,
)
OPERATOR_POLICIES = Gauge(
    "aether_operator_policies",
    "MeshAuthorizationPolicies by state at the last policy pass: accepted, not_accepted (they allow nothing), "
    "unresolved (a target Service does not exist: ResolvedRefs=False/ServiceNotFound, e.g. a typo)",
    ["state"],
    registry=REGISTRY,
)


# ---- the process's heap in use (both processes; docs/operations.md#metrics) ----------------------------------


class HeapCollector(Collector):
    """What the process's allocators hold in use, beside RSS (which keeps pages freed inside them: an RSS that
    steps up after a burst and stays there is the allocator's high-water mark, a heap in use that keeps rising is a
    leak): C malloc's bytes in use and CPython's small-object blocks allocated, now and right after the last full
    garbage collection (aether.heap: what is still reachable; the figures of the moment also hold dead objects in
    reference cycles waiting for the collector)."""

    def collect(self) -> Iterator[Metric]:
        now = malloc_in_use()
        if now is not None:
            yield GaugeMetricFamily(
                "aether_process_malloc_in_use_bytes",
                "Bytes C malloc has handed out and not had back (glibc mallinfo2: uordblks + hblkhd)",
                value=now,
            )
        yield GaugeMetricFamily(
            "aether_process_python_allocated_blocks",
            "Memory blocks CPython's allocator has handed out and not had back (sys.getallocatedblocks())",
            value=sys.getallocatedblocks(),
        )
        if AFTER_FULL.malloc_bytes is not None:
            yield GaugeMetricFamily(
                "aether_process_malloc_in_use_after_full_gc_bytes",
                "aether_process_malloc_in_use_bytes at the end of the last recorded full garbage collection",
                value=AFTER_FULL.malloc_bytes,
            )
        if AFTER_FULL.python_blocks is not None:
            yield GaugeMetricFamily(
                "aether_process_python_allocated_blocks_after_full_gc",
                "aether_process_python_allocated_blocks at the end of the last recorded full garbage collection",
                value=AFTER_FULL.python_blocks,
            )
        yield CounterMetricFamily(
            "aether_process_full_gc",
            "Full (generation 2) garbage collections recorded since start: the periodic ones, or the interpreter's when"
            " periodic collections are off",
            value=AFTER_FULL.collections,
        )


REGISTRY.register(HeapCollector())


def serve(host: str, port: int) -> WSGIServer:
    """Serve REGISTRY at http://host:port/metrics from a daemon thread (`.server_port`; `.shutdown()` stops it)."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, host, registry=REGISTRY)
    return server
