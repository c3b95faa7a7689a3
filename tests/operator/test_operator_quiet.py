"""A converged operator writes nothing: resyncs over an unchanged cluster send no request that changes anything.

Seen red on the real server (kube-apiserver 1.35.4) before the CRDs lost their schema defaults: the server filled
`draining: false` into every stored endpoint, the stored slice never equalled the one computed, and every resync
re-sent a JSON patch for every slice (4 patches of one slice in 12 s, each a no-op on the server). The emulator
applies no defaults, so it never showed it."""

from __future__ import annotations

from aether.metrics import REGISTRY
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.wait import wait_for

WRITES = (
    ("aether_operator_meshnode_writes_total", "patched"),
    ("aether_operator_slice_writes_total", "patched"),
    ("aether_operator_slice_writes_total", "created"),
    ("aether_operator_udproute_status_writes_total", "patched"),
)


def writes() -> dict[tuple[str, str], float]:
    return {(n, out): REGISTRY.get_sample_value(n, {"outcome": out}) or 0.0 for n, out in WRITES}


def test_resyncs_over_a_converged_cluster_write_nothing(cluster: Cluster, operator: InProcessOperator) -> None:
    k, ns, node = cluster, unique("quiet"), unique("quiet-node")
    k.apply(o.namespace(ns))
    k.apply(o.node(node))
    k.apply(o.pod(ns, "client", node, "client"), status=o.pod_status("10.81.0.2"))
    for i, name in enumerate(("a", "b")):
        k.apply(o.service(ns, name, None, [("dns", 53, "UDP")]))
        eps: list[tuple[str, o.EndpointState, str | None]] = [
            (f"10.81.1.{i + 1}", True, None),
            (f"10.81.2.{i + 1}", o.SERVING_TERMINATING, None),
        ]
        k.apply(o.endpoint_slice(ns, name, [("dns", 5353, "UDP")], eps))
    k.apply(o.udproute(ns, "r", "a", [o.backend("b", 53)]))
    wait_for(
        lambda: (k.arm(node, f"{ns}/a") or {}).get("cluster") == f"udp:{ns}/b", what="converged", ignore=READ_ERRORS
    )
    rec = operator.config.reconciler[0]
    wait_for(lambda: rec.idle.is_set(), what="an idle loop")
    resyncs, before = rec.resyncs, writes()
    wait_for(lambda: rec.resyncs >= resyncs + 2 and rec.idle.is_set(), timeout=30, what="two resyncs")
    assert writes() == before
