"""Per-resource refusal (pure): the gates' findings that name one resource remove that resource, and the rest of the
state is served. Before translation: arms whose VIP another arm of the same transport also claims (all of them: which
one the matcher map would keep is not ours to guess), arms whose VIP no pod can dial, and weighted arms whose
cluster is not their own `udp-split:` one. After translation:
listeners naming a cluster not in CDS, bound into a netns that does not exist, or binding what an earlier listener
binds. Each removal is a GateFailure, reported in Programmed's message and counted by gate."""

from __future__ import annotations

import os
from collections import Counter

from aether.api.addresses import unroutable_vip
from aether.api.meshnode import MeshNode, ServiceArm
from aether.xds.gates.core import GateFailure, PathExists, bind_key, clusters_of, netns_of
from aether.xds.resources import CLUSTER, LISTENER, ResourceDict, Resources

DUPLICATE_VIP, BAD_VIP, SPLIT_CLUSTER = "duplicate-vip", "invalid-vip", "split-arm-cluster"
SPLIT_PREFIX = "udp-split:"  # aether.api.naming.udp_split_cluster


def _split_misfits(arms: list[ServiceArm]) -> set[int]:
    """Indices of arms that would corrupt a weighted split: an arm with `backends` whose cluster is not a
    `udp-split:` one, or a `udp-split:` cluster that another arm names too (the split's load assignment would
    replace or be replaced by the other arm's endpoints)."""
    splits = [i for i, a in enumerate(arms) if a.backends or a.cluster.startswith(SPLIT_PREFIX)]
    if not splits:
        return set()
    named = Counter(a.cluster for a in arms)
    return {
        i
        for i in splits
        if not arms[i].backends or not arms[i].cluster.startswith(SPLIT_PREFIX) or named[arms[i].cluster] > 1
    }


def _keep(arms: list[ServiceArm], transport: str) -> tuple[list[ServiceArm], list[GateFailure]]:
    counts = Counter(a.vip for a in arms)
    if len(counts) == len(arms) and not any(unroutable_vip(v) for v in counts):
        return arms, []  # the common case
    kept, out = [], []
    for vip, n in sorted(counts.items()):
        if n > 1:
            services = sorted(a.service for a in arms if a.vip == vip)
            out.append(
                GateFailure(DUPLICATE_VIP, f"{transport} VIP {vip} is claimed by {n} arms {services}: all refused")
            )
    for a in arms:
        why = unroutable_vip(a.vip)
        if why is not None:
            out.append(GateFailure(BAD_VIP, f"{transport} arm {a.service}: VIP {a.vip!r} is {why}: refused"))
        elif counts[a.vip] == 1:
            kept.append(a)
    return kept, out


def refuse_arms(node: MeshNode) -> tuple[MeshNode, list[GateFailure]]:
    """The node without the arms no pod could be served by correctly, and what was removed."""
    udp, udp_out = _keep(node.status.udp.services, "udp")
    misfits = _split_misfits(udp)
    if misfits:
        for i in sorted(misfits):
            a = udp[i]
            why = (
                "lists backends but its cluster is not a udp-split: one"
                if a.backends and not a.cluster.startswith(SPLIT_PREFIX)
                else "names a udp-split: cluster without backends"
                if not a.backends
                else "shares its udp-split: cluster with another arm"
            )
            udp_out.append(GateFailure(SPLIT_CLUSTER, f"udp arm {a.service}: {why} ({a.cluster!r}): refused"))
        udp = [a for i, a in enumerate(udp) if i not in misfits]
    tcp, tcp_out = _keep(node.status.tcp.services, "tcp")
    if not udp_out and not tcp_out:
        return node, []
    status = node.status.model_copy(
        update={
            "udp": node.status.udp.model_copy(update={"services": udp}),
            "tcp": node.status.tcp.model_copy(update={"services": tcp}),
        }
    )
    return node.model_copy(update={"status": status}), [*udp_out, *tcp_out]


def refuse_listeners(
    resources: Resources, path_exists: PathExists = os.path.exists
) -> tuple[Resources, list[GateFailure]]:
    """The resources without the listeners a gate names (a cluster not in CDS, a netns that does not exist, a bind
    an earlier listener holds: the first keeps it), and what was removed."""
    clusters = resources.get(CLUSTER, {})
    listeners = resources.get(LISTENER, {})
    kept: dict[str, ResourceDict] = {}
    seen: dict[tuple[str, str, str, int], str] = {}
    out: list[GateFailure] = []
    named = clusters_of(listeners)
    for name, listener in sorted(listeners.items()):
        missing = sorted(named[name].difference(clusters))
        path = netns_of(listener)
        key = bind_key(listener)
        if missing:
            out.append(GateFailure("arm-names-cluster", f"listener {name!r} routes to {missing}, not in CDS: refused"))
        elif path is not None and not path_exists(path):
            out.append(
                GateFailure("netns-exists", f"listener {name!r} binds into {path}, which does not exist: refused")
            )
        elif key in seen:
            out.append(GateFailure("unique-bind", f"listener {name!r} binds {key}, as {seen[key]!r} does: refused"))
        else:
            seen[key] = name
            kept[name] = listener
    if not out:
        return resources, []
    return {**resources, LISTENER: kept}, out
