"""Weighted UDP arms (a UDPRoute's backendRefs, Gateway API weights): one cluster per arm, one locality per backend.

udp_proxy picks a host once per session (one client address and port) and keeps it, so a cluster whose load
balancer spreads picks by weight splits *new sessions* by weight and every datagram of a session reaches one
backend. The cluster uses locality-weighted load balancing: each backendRef is a locality whose
`load_balancing_weight` is the backendRef's weight, and Envoy picks a locality by weight (an EDF schedule: a
weighted round robin within a pick or so of the exact proportions, not a random draw) and then a host inside it, so a backend's endpoint count does not move its share.
Envoy scales a locality's weight by the fraction of its hosts that are healthy; UDP clusters have no health
checks and we never mark a host unhealthy, so the weights stay the spec's. A draining endpoint (terminating, still
serving: no new session, the ones on it move at their next datagram) is excluded from load balancing, so it
counts neither as healthy nor as a host and its backend keeps its whole share.

- weight 0 (drain): the locality is present without a weight. Envoy's locality scheduler skips a locality with no
  weight, so no new session picks it; its hosts stay in the cluster, so the sessions already on them finish (a host
  that *leaves* the cluster ends its udp_proxy sessions).
- an invalid backendRef (not found, not permitted, wrong kind): its locality keeps its weight and holds one
  endpoint that answers nothing (`DROP_ENDPOINT`, port 0 on loopback: the kernel refuses to send there), so that
  share of new sessions is dropped, as the spec says, instead of going to the valid backends.
- a valid backend with no ready endpoint: the same drop endpoint while it has none, so its share is dropped too
  (what Envoy Gateway's empty weighted cluster does: 503 for that share). A locality without hosts would instead
  leave the schedule and, were no weighted locality left, make Envoy fall back to every host (drained ones too).
- every weight 0: Envoy's locality scheduler, with no weighted locality, falls back to picking among all hosts
  (seen: the drained backends took every new session), so the assignment adds one locality of weight 1 holding the
  drop endpoint: new sessions get nothing, the drained sessions finish.

Changing weights changes only this cluster's load assignment (same cluster, same hosts), so sessions already open
keep their backend and only new ones follow the new weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from aether.api.meshnode import ServiceArm
from aether.xds.memo import LiveMemo, lru, register
from aether.xds.resources import ResourceDict
from aether.xds.translate.l4.common import ClusterShape, EndpointKey, eds_cluster_for, lb_endpoints

# where an invalid backendRef's share goes: loopback port 0. udp_proxy's send fails (EINVAL: no UDP datagram can
# be sent to port 0), counted in the cluster's upstream error stats; the client gets no reply.
DROP_ENDPOINT: Final = ("127.0.0.1", 0, False)
DROP_LOCALITY: Final = "aether/no-weighted-backend"  # the locality that takes every new session when all weights are 0

# (backend ref, weight, drained, endpoints) per locality, in the arm's order
Locality = tuple[str, int, bool, EndpointKey]
SplitKey = tuple[Locality, ...]


def split_key(arm: ServiceArm) -> SplitKey:
    out: list[Locality] = []
    for b in arm.backends or ():
        if b.reason is not None and b.reason != "Drained":
            out.append((b.backend, b.weight, b.weight == 0, (DROP_ENDPOINT,)))
        else:
            eps = tuple(sorted({(e.ip, e.port, e.draining) for e in b.endpoints})) or (DROP_ENDPOINT,)
            out.append((b.backend, b.weight, b.weight == 0, eps))
    if not any(not drained for _, _, drained, _ in out):
        out.append((DROP_LOCALITY, 1, False, (DROP_ENDPOINT,)))
    return tuple(out)


@lru(maxsize=1 << 14)
def split_cluster(name: str, shape: ClusterShape) -> ResourceDict:
    cluster = dict(eds_cluster_for(name, shape))
    cluster["commonLbConfig"] = {"localityWeightedLbConfig": {}}
    return cluster


# per node, the weighted load assignments its last translation served (a split's endpoints churn like any other)
_ASSIGNMENTS: LiveMemo[tuple[str, SplitKey], ResourceDict] = register(LiveMemo())


def split_assignment(name: str, key: SplitKey) -> ResourceDict:
    localities: list[ResourceDict] = []
    seen: set[str] = set()
    for i, (backend, weight, drained, eps) in enumerate(key):
        # one locality per entry, never two with one name: Envoy keys locality weights by locality, so a repeated
        # one (a ref to a Service and an invalid ref of another kind with the same name) would take one weight
        zone = backend if backend not in seen else f"{backend}#{i}"
        seen.add(zone)
        loc: ResourceDict = {
            "locality": {"subZone": zone},
            "lbEndpoints": lb_endpoints(eps),
        }
        if not drained:
            loc["loadBalancingWeight"] = weight
        localities.append(loc)
    return {"clusterName": name, "endpoints": localities}


def split_resources(
    arms: Iterable[ServiceArm], shape: ClusterShape, node: str
) -> tuple[dict[str, ResourceDict], dict[str, ResourceDict]]:
    """The weighted arms' clusters and load assignments, by cluster name (`node`: whose last ones are reused)."""
    clusters: dict[str, ResourceDict] = {}
    assignments: dict[str, ResourceDict] = {}
    with _ASSIGNMENTS.build(node) as built:
        for arm in arms:
            if arm.backends and arm.cluster not in clusters:
                clusters[arm.cluster] = split_cluster(arm.cluster, shape)
                key = split_key(arm)
                assignments[arm.cluster] = built.get((arm.cluster, key), split_assignment, arm.cluster, key)
    return clusters, assignments
