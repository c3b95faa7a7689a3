"""The opt-in in-kernel UDP data path (issue 29), as nftables JSON: a pure builder from a node's plaintext UDP arms
to table `ip aether_udp`, which lives beside the capture's table `inet aether` in a meshed pod's netns.

For each arm (a Service's ClusterIP dialled on the plaintext L4 port 18082, and its backends with weights):

- set `vips` and verdict map `services` hold `VIP . 18082`; chain `dispatch` (type nat, hook output, priority
  dstnat - 1: the nat chains run in priority order and the first that binds a flow's NAT wins, so it goes before
  the REDIRECT capture's own chain at dstnat) does `meta l4proto udp ip daddr . udp dport vmap @services`, a `goto` into the Service's own chain;
- the Service's chain `svc_<VIP>` counts, then `numgen random mod 100 vmap { lo-hi : goto svc_<VIP>_b<i>, ... }`
  over the backends' ranges (`share_ranges`: weight 0 = drain, no range; an invalid backend's range is `drop`, its
  share is never given to the others; no range at all: the chain drops);
- each backend's chain `svc_<VIP>_b<i>` counts and does `dnat to <backend IP>:<app port>`. Conntrack keeps every
  later datagram of the flow on its first pick and rewrites the replies' source back to VIP:18082, so a connected
  client socket accepts them.

Placement against the capture's mark-and-divert (`aether.netns.rules`: a route chain at priority mangle, -150,
marks every UDP 18082 datagram to a non-local address). A NAT chain cannot run before it: nf_nat hooks the output
path at dstnat (-100) whatever an nft nat chain's own priority says (that only orders nat chains among themselves),
and a nat chain at -200 or lower is refused (EOPNOTSUPP: NAT comes after conntrack). Measured here: a nat chain at
priority -175 already saw the divert mark. So chain `undivert` (type route, hook output, priority -125: after the
divert, before the NAT) clears the divert mark from datagrams to these VIP.port pairs; the kernel re-routes the
packet on that change (a route chain's contract) and again when `dnat` rewrites its destination, so it leaves on
the pod's own route to the backend and never reaches the node Envoy's transparent listener. The capture's table is
not touched; its divert counter still counts these datagrams. Only UDP to 18082 is matched: the TCP and QUIC classes
and their ports are left as they are (R5). IPv4 only (not built for IPv6).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from aether.netns.contract import CAPTURE_DIVERT_FWMARK, L4_OUTBOUND_PORT
from aether.netns.rules import PRIO_DSTNAT, PRIO_MANGLE, RulesetError, check_statement_order

Json = dict[str, Any]

KERNEL_UDP_FAMILY: Final = "ip"
KERNEL_UDP_TABLE: Final = "aether_udp"
VIP_SET: Final = "vips"
SERVICE_MAP: Final = "services"
UNDIVERT_CHAIN: Final = "undivert"
DISPATCH_CHAIN: Final = "dispatch"
PRIO_UNDIVERT: Final = (PRIO_MANGLE + PRIO_DSTNAT) // 2  # -125: after the capture's divert, before NAT
PRIO_DISPATCH: Final = PRIO_DSTNAT - 1  # first among the nat chains, before the REDIRECT capture's (dstnat)
BUCKETS: Final = 100  # `numgen random mod 100`: the weights' resolution is 1/100 of new flows


class KernelBackend(NamedTuple):
    """One backend endpoint of an arm: where new flows are rewritten to, and its weight. `valid=False`: an
    invalid backendRef (its share is dropped)."""

    ip: str
    port: int
    weight: int
    valid: bool = True


class KernelArm(NamedTuple):
    """A Service's ClusterIP, dialled on UDP 18082, and its backends."""

    vip: str
    backends: tuple[KernelBackend, ...]


class ShareRange(NamedTuple):
    """Buckets `low`..`high` (inclusive) of `numgen random mod 100` go to backend number `backend`."""

    backend: int
    low: int
    high: int


def share_ranges(weights: tuple[int, ...] | list[int]) -> list[ShareRange]:
    """Split the 100 buckets over positive weights by the largest-remainder rule: each weight gets
    floor(100 * w / sum); the buckets left over go one each to the largest fractional remainders (ties: the earlier
    backend). Every weight then holds its exact share to within one bucket and the ranges partition 0-99 in
    backend order. Weight 0 (drain) gets no range; a positive weight under 1% can get none too (the resolution is
    1/100). All weights 0: no ranges."""
    if any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in weights):
        raise RulesetError(f"weights must be integers >= 0: {list(weights)}")
    total = sum(weights)
    if total == 0:
        return []
    counts = [BUCKETS * w // total for w in weights]
    left = BUCKETS - sum(counts)
    order = sorted(range(len(weights)), key=lambda i: (-((BUCKETS * weights[i]) % total), i))
    for i in order[:left]:
        counts[i] += 1
    out: list[ShareRange] = []
    low = 0
    for i, n in enumerate(counts):
        if n:
            out.append(ShareRange(i, low, low + n - 1))
            low += n
    return out


def _ipv4(text: str, what: str) -> str:
    octets = text.split(".")
    if len(octets) != 4 or not all(o.isdigit() and len(o) <= 3 and int(o) < 256 for o in octets):
        raise RulesetError(f"{what} {text!r} is not an IPv4 address (the kernel UDP path is IPv4 only)")
    return ".".join(str(int(o)) for o in octets)


def service_chain(vip: str) -> str:
    return "svc_" + vip.replace(".", "_")


def _ref(kind: str, name: str, **body: Any) -> Json:
    return {kind: {"family": KERNEL_UDP_FAMILY, "table": KERNEL_UDP_TABLE, "name": name} | body}


def _rule(chain: str, expr: list[Json]) -> Json:
    return {"add": {"rule": {"family": KERNEL_UDP_FAMILY, "table": KERNEL_UDP_TABLE, "chain": chain, "expr": expr}}}


def _vip_port_key() -> Json:
    return {
        "concat": [
            {"payload": {"protocol": "ip", "field": "daddr"}},
            {"payload": {"protocol": "udp", "field": "dport"}},
        ]
    }


def _udp() -> Json:
    return {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "udp"}}


def _counter() -> Json:
    return {"counter": {"packets": 0, "bytes": 0}}


def _service_commands(arm: KernelArm) -> list[Json]:
    chain = service_chain(arm.vip)
    ranges = share_ranges([b.weight for b in arm.backends])
    out: list[Json] = [{"add": _ref("chain", chain)}]
    if not ranges:
        return [*out, _rule(chain, [_counter(), {"drop": None}])]
    elems: list[Any] = []
    for r in ranges:
        backend = arm.backends[r.backend]
        span = {"range": [r.low, r.high]} if r.high > r.low else r.low
        if not backend.valid:
            elems.append([span, {"drop": None}])
            continue
        target = f"{chain}_b{r.backend}"
        out.append({"add": _ref("chain", target)})
        dnat = {"dnat": {"addr": _ipv4(backend.ip, "backend"), "port": _port(backend.port)}}
        out.append(_rule(target, [_udp(), _counter(), dnat]))  # nft: a port rewrite needs an l4 match
        elems.append([span, {"goto": {"target": target}}])
    pick = {"vmap": {"key": {"numgen": {"mode": "random", "mod": BUCKETS, "offset": 0}}, "data": {"set": elems}}}
    return [*out, _rule(chain, [_counter(), pick])]


def _port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise RulesetError(f"backend port {port!r} is not a port number (1-65535)")
    return port


def build_kernel_udp(arms: Sequence[KernelArm]) -> Json:
    """The nftables JSON that creates table `ip aether_udp` for `arms` (pure: same input, same output; arms are
    ordered by VIP). An empty list builds the table with its chains and an empty map: nothing is matched."""
    by_vip: dict[str, KernelArm] = {}
    for arm in arms:
        vip = _ipv4(arm.vip, "VIP")
        if vip in by_vip:
            raise RulesetError(f"VIP {vip} listed twice")
        by_vip[vip] = arm._replace(vip=vip)
    ordered = [by_vip[v] for v in sorted(by_vip, key=lambda v: tuple(int(o) for o in v.split(".")))]
    keys = [{"concat": [arm.vip, L4_OUTBOUND_PORT]} for arm in ordered]
    key_type = ["ipv4_addr", "inet_service"]
    mapping = [[k, {"goto": {"target": service_chain(a.vip)}}] for k, a in zip(keys, ordered, strict=True)]
    undivert = _ref("chain", UNDIVERT_CHAIN, type="route", hook="output", prio=PRIO_UNDIVERT, policy="accept")
    dispatch = _ref("chain", DISPATCH_CHAIN, type="nat", hook="output", prio=PRIO_DISPATCH, policy="accept")
    commands: list[Json] = [
        {"add": {"table": {"family": KERNEL_UDP_FAMILY, "name": KERNEL_UDP_TABLE}}},
        {"add": _ref("set", VIP_SET, type=key_type)},
        {"add": _ref("map", SERVICE_MAP, type=key_type, map="verdict")},
    ]
    for arm in ordered:
        commands += _service_commands(arm)
    if ordered:  # nft takes a set's elements in `add element`, not in `add set`
        commands += [{"add": _ref("element", VIP_SET, elem=keys)}, {"add": _ref("element", SERVICE_MAP, elem=mapping)}]
    in_vips = {"match": {"op": "==", "left": _vip_port_key(), "right": f"@{VIP_SET}"}}
    marked = {"match": {"op": "==", "left": {"meta": {"key": "mark"}}, "right": CAPTURE_DIVERT_FWMARK}}
    unmark = {"mangle": {"key": {"meta": {"key": "mark"}}, "value": 0}}
    # `udp dport` implies `meta l4proto udp` (nft adds that match itself and lists the rule without it)
    commands += [{"add": undivert}, _rule(UNDIVERT_CHAIN, [in_vips, marked, _counter(), unmark])]
    dispatch_vmap = {"vmap": {"key": _vip_port_key(), "data": f"@{SERVICE_MAP}"}}
    commands += [{"add": dispatch}, _rule(DISPATCH_CHAIN, [dispatch_vmap])]
    ruleset = {"nftables": commands}
    check_statement_order(ruleset)
    return ruleset


def replace_commands(ruleset: Json) -> Json:
    """One transaction that makes table `ip aether_udp` exactly `ruleset` (add so delete cannot fail, delete,
    re-create whole): applying it twice leaves one copy; nft applies it all or nothing."""
    ref = {"family": KERNEL_UDP_FAMILY, "name": KERNEL_UDP_TABLE}
    return {"nftables": [{"add": {"table": dict(ref)}}, {"delete": {"table": dict(ref)}}, *ruleset["nftables"]]}


def delete_commands() -> Json:
    ref = {"family": KERNEL_UDP_FAMILY, "name": KERNEL_UDP_TABLE}
    return {"nftables": [{"add": {"table": dict(ref)}}, {"delete": {"table": dict(ref)}}]}


def _canonical_stmt(stmt: Json) -> Json:
    return {"counter": None} if "counter" in stmt else stmt


def canonical(nft_json: Json) -> Json:
    """Table `ip aether_udp` from a ruleset or from `nft -j list table`, without handles, counter values or other
    tables: `{"tables", "sets": {name: {type, map?, elem}}, "chains": {name: {...}}, "rules": {chain: [...]}}`."""
    out: Json = {"tables": [], "sets": {}, "chains": {}, "rules": {}}
    for item in nft_json.get("nftables", []):
        item = item.get("add", item)
        for kind, body in item.items():
            if body.get("family") != KERNEL_UDP_FAMILY or body.get("table", body.get("name")) != KERNEL_UDP_TABLE:
                continue
            if kind == "table":
                out["tables"].append({"family": body["family"], "name": body["name"]})
            elif kind in ("set", "map", "element"):
                entry = out["sets"].setdefault(body["name"], {"elem": []})
                entry |= {k: body[k] for k in ("type", "map") if k in body}
                entry["elem"] = entry["elem"] + list(body.get("elem", []))
            elif kind == "chain":
                out["chains"][body["name"]] = {k: v for k, v in body.items() if k not in ("handle", "family", "table")}
            elif kind == "rule":
                out["rules"].setdefault(body["chain"], []).append([_canonical_stmt(s) for s in body["expr"]])
    for entry in out["sets"].values():  # a set is unordered: nft lists big ones in its own (hash) order
        entry["elem"] = sorted(entry["elem"], key=lambda e: json.dumps(e, sort_keys=True))
    return out
