"""The synthetic cluster `bench/operator_reconcile` measures and the slice-size test stores: N mesh namespaces of
10 Services (one UDP and one TCP port, 5 endpoints each), 50 pods over 10 nodes and one weighted UDPRoute each,
fed to the operator's `ClusterModel`; `scoped` gives each namespace an egress naming the next one, otherwise every
node depends on every namespace (the default egress)."""

from __future__ import annotations

import time

from aether.operator.reconcile.model import ClusterModel
from aether.testing.apitestbed import objects as o

SERVICES_PER_NS, PODS_PER_NS, NODES_PER_NS = 10, 50, 10


def pod_node(ns_i: int, j: int, nodes: int) -> int:
    return (ns_i + (j % NODES_PER_NS) * (nodes // NODES_PER_NS)) % nodes


def build(n_ns: int, nodes: int, scoped: bool = True) -> tuple[ClusterModel, float]:
    m = ClusterModel()
    t0 = time.perf_counter()
    for n in range(nodes):
        m.apply_raw("node", {"metadata": {"name": f"node{n:04d}", "uid": f"u{n}"}})
    for i in range(n_ns):
        ns = f"ns{i:04d}"
        m.apply_raw("namespace", o.namespace(ns, egress=f"ns{(i + 1) % n_ns:04d}" if scoped else None))
        for j in range(PODS_PER_NS):
            body = o.pod(ns, f"p{j}", f"node{pod_node(i, j, nodes):04d}", f"sa{j // 5 % 2}")
            body["metadata"]["uid"] = f"{ns}-p{j}"
            body.update(o.pod_status(f"10.{i // 200}.{i % 200}.{j + 1}"))
            m.apply_raw("pod", body)
        for k in range(SERVICES_PER_NS):
            m.apply_raw(
                "service",
                o.service(
                    ns, f"s{k}", f"10.96.{i // 25}.{(i % 25) * 10 + k}", [("dns", 53, "UDP"), ("http", 8080, "TCP")]
                ),
            )
            eps = [(f"10.{i // 200}.{i % 200}.{k * 5 + e + 1}", True, f"p{k * 5 + e}") for e in range(5)]
            m.apply_raw("slice", o.endpoint_slice(ns, f"s{k}", [("dns", 5353, "UDP"), ("http", 8080, "TCP")], eps))
        route = o.udproute(ns, "r", "s0", [o.backend("s1", 53, 2), o.backend("s2", 53, 1)])
        route["metadata"].update({"generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"})
        m.apply_raw("route", route)
    return m, time.perf_counter() - t0
