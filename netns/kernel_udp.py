"""The opt-in in-kernel UDP data path (issue 29), as nftables JSON: a pure builder from a node's plaintext UDP arms
to tables `ip aether_udp` (IPv4 VIPs) and `ip6 aether_udp` (IPv6 VIPs), which live beside the capture's table
`inet aether` in a meshed pod's netns. Both tables have the same shape; an arm goes to its VIP's family.

For each arm (a Service's ClusterIP dialled on the plaintext L4 port 18082, and its backends with weights):

- set `vips` and verdict map `services` hold `VIP . 18082`; chain `dispatch` (type nat, hook output, priority
  dstnat - 1: the nat chains run in priority order and the first that binds a flow's NAT wins, so it goes before
  the REDIRECT capture's own chain at dstnat) does `<ip|ip6> daddr . udp dport vmap @services`, a `goto` into the
  Service's own chain;
- the Service's chain `svc_<VIP>` sets the flow's conntrack timeout (`ct timeout set "idle_<s>"`, when the arm or
  the node gives an idle timeout), then `numgen random mod 100 vmap { lo-hi : goto svc_<VIP>__<backend>, ... }`
  over the backends' ranges (`share_ranges`: weight 0 = drain, no range; an invalid backend's range is `drop`, its
  share is never given to the others; no range at all: the chain drops);
- each backend's chain `svc_<VIP>__<IP>_<port>` does `dnat to <backend IP>:<app port>`. Conntrack keeps every
  later datagram of the flow on its first pick and rewrites the replies' source back to VIP:18082, so a connected
  client socket accepts them.
- Counters are named objects, so they outlive an update of the rules that use them: counter `svc_<VIP>` counts
  every datagram to VIP:18082 before NAT (chain `claim`, map `vip_counters`), counter `svc_<VIP>__<IP>_<port>`
  every datagram rewritten to that backend, after NAT (chain `count_backend`, map `backend_counters`, keyed by the
  flow's original destination and the packet's new one). The nat chains see only a flow's first datagram; these
  filter chains see them all.
- An idle timeout is a `ct timeout` object `idle_<s>` (udp, unreplied and replied both `<s>` seconds, rounded up),
  one per distinct value.

Placement against the capture's mark-and-divert (`aether.netns.rules`: a route chain at priority mangle, -150,
marks every UDP 18082 datagram to a non-local address, IPv4 and IPv6 alike). A NAT chain cannot run before it:
nf_nat hooks the output path at dstnat (-100) whatever an nft nat chain's own priority says (that only orders nat
chains among themselves), and a nat chain at -200 or lower is refused (EOPNOTSUPP: NAT comes after conntrack).
Measured here: a nat chain at priority -175 already saw the divert mark. So chain `claim` (type filter, hook output,
priority -160, before the divert) marks datagrams to these VIP.port pairs 0xae82 (`KERNEL_UDP_FWMARK`), and the
capture's divert chain accepts a datagram so marked before its own rules: it is never diverted, so it pays neither
the divert's `fib` lookup nor a re-route (a filter chain's mark re-routes nothing; the ip rule that finishes the
divert matches 0xae71 alone). The only re-route left is the one `dnat` makes, so the datagram leaves on the pod's
own route to the backend and never reaches the node Envoy's transparent listener. Measured in one run
(`bench.udp_dns --kernel`'s set-up, ping-pong kernel/direct over 8 alternating rounds): 0.85 -> 0.94 at 1 in
flight, 0.82 -> 0.95 at 32. A pod whose capture was installed before that skip rule existed still marks them
0xae71; chain `undivert` (type route, priority -125: after the divert, before the NAT) clears that mark, and the
kernel re-routes the packet on the change. The mark does not leave the pod: the kernel clears it when the packet
crosses into another netns. Only UDP to 18082 is matched: the TCP and QUIC classes and their ports are left as they
are (R5).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Sequence
from typing import Any, Final, Literal, NamedTuple

from aether.netns.contract import CAPTURE_DIVERT_FWMARK, KERNEL_UDP_FWMARK, L4_OUTBOUND_PORT
from aether.netns.rules import PRIO_DSTNAT, PRIO_MANGLE, RulesetError, check_statement_order

Json = dict[str, Any]
Family = Literal["ip", "ip6"]

FAMILIES: Final[tuple[Family, ...]] = ("ip", "ip6")
KERNEL_UDP_TABLE: Final = "aether_udp"
VIP_SET: Final = "vips"
SERVICE_MAP: Final = "services"
VIP_COUNTERS: Final = "vip_counters"
BACKEND_COUNTERS: Final = "backend_counters"
UNDIVERT_CHAIN: Final = "undivert"
DISPATCH_CHAIN: Final = "dispatch"
CLAIM_CHAIN: Final = "claim"
COUNT_BACKEND_CHAIN: Final = "count_backend"
PRIO_UNDIVERT: Final = (PRIO_MANGLE + PRIO_DSTNAT) // 2  # -125: after the capture's divert, before NAT
PRIO_CLAIM: Final = PRIO_MANGLE - 10  # -160: before the capture's divert, which skips what this marks
PRIO_DISPATCH: Final = PRIO_DSTNAT - 1  # first among the nat chains, before the REDIRECT capture's (dstnat)
PRIO_COUNT_BACKEND: Final = 0  # filter: after NAT, so the packet carries its backend's address
BUCKETS: Final = 100  # `numgen random mod 100`: the weights' resolution is 1/100 of new flows
_ADDR_TYPE: Final[dict[Family, str]] = {"ip": "ipv4_addr", "ip6": "ipv6_addr"}


class KernelBackend(NamedTuple):
    """One backend endpoint of an arm: where new flows are rewritten to, and its weight. `valid=False`: an
    invalid backendRef (its share is dropped; its address is never used)."""

    ip: str
    port: int
    weight: int
    valid: bool = True


class KernelArm(NamedTuple):
    """A Service's ClusterIP, dialled on UDP 18082, and its backends. `idle_timeout_s`: how long an idle flow keeps
    its pick (None: the node's default given to the builder; both None: the kernel's UDP conntrack timeouts)."""

    vip: str
    backends: tuple[KernelBackend, ...]
    idle_timeout_s: float | None = None


class KernelUdpCounter(NamedTuple):
    """A named counter of the kernel path: the Service's (`backend_ip` None: every datagram to VIP:18082) or one
    backend's (every datagram rewritten to backend_ip:backend_port)."""

    vip: str
    backend_ip: str | None
    backend_port: int | None
    packets: int
    bytes: int


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


def address(text: str, what: str) -> tuple[Family, str]:
    """The family of an IP address and its text as nft prints it (IPv6 in RFC 5952 form)."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise RulesetError(f"{what} {text!r} is not an IP address") from None
    return ("ip" if ip.version == 4 else "ip6"), str(ip)


def _token(ip: str) -> str:
    """An address as part of an nft object name: IPv4 `a_b_c_d`, IPv6 its 32 hex digits."""
    return ipaddress.IPv6Address(ip).exploded.replace(":", "") if ":" in ip else ip.replace(".", "_")


def _untoken(token: str) -> str:
    if len(token) == 32:
        return str(ipaddress.IPv6Address(int(token, 16)))
    return token.replace("_", ".")


def service_chain(vip: str) -> str:
    """The Service's chain and counter."""
    return "svc_" + _token(vip)


def backend_chain(vip: str, ip: str, port: int) -> str:
    """A backend's chain and counter."""
    return f"{service_chain(vip)}__{_token(ip)}_{port}"


def timeout_name(seconds: int) -> str:
    return f"idle_{seconds}"


def timeout_seconds(idle_timeout_s: float) -> int:
    """Conntrack timeouts are whole seconds: rounded up, at least 1."""
    return max(1, math.ceil(idle_timeout_s))


def counter_of(name: str, packets: int, bytes_: int) -> KernelUdpCounter | None:
    """The counter named `name` (`service_chain` or `backend_chain`), or None for a name the builder does not
    make."""
    if not name.startswith("svc_"):
        return None
    vip, _, backend = name[4:].partition("__")
    if not backend:
        return KernelUdpCounter(_untoken(vip), None, None, packets, bytes_)
    ip, _, port = backend.rpartition("_")
    return KernelUdpCounter(_untoken(vip), _untoken(ip), int(port), packets, bytes_)


def parse_counters(listing: Json) -> list[KernelUdpCounter]:
    """The counters of table `aether_udp` (either family) in the JSON of `nft -j list counters table ...` (or of a
    whole table or ruleset listing), sorted by VIP, then the Service's own before its backends'."""
    out: list[KernelUdpCounter] = []
    for item in listing.get("nftables", []):
        body = item.get("counter")
        if not isinstance(body, dict) or body.get("table") != KERNEL_UDP_TABLE or body.get("family") not in FAMILIES:
            continue
        counter = counter_of(str(body.get("name", "")), int(body.get("packets", 0)), int(body.get("bytes", 0)))
        if counter is not None:
            out.append(counter)
    return sorted(out, key=lambda c: (c.vip, c.backend_ip or "", c.backend_port or 0))


def _ref(family: Family, kind: str, name: str, **body: Any) -> Json:
    return {kind: {"family": family, "table": KERNEL_UDP_TABLE, "name": name} | body}


def _rule(family: Family, chain: str, expr: list[Json]) -> Json:
    return {"add": {"rule": {"family": family, "table": KERNEL_UDP_TABLE, "chain": chain, "expr": expr}}}


def _daddr_dport(family: Family) -> list[Json]:
    return [{"payload": {"protocol": family, "field": "daddr"}}, {"payload": {"protocol": "udp", "field": "dport"}}]


def _udp() -> Json:
    return {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "udp"}}


def _backend_commands(family: Family, arm: KernelArm, backend: KernelBackend) -> list[Json]:
    name = backend_chain(arm.vip, backend.ip, backend.port)
    dnat = {"dnat": {"addr": backend.ip, "port": backend.port}}
    return [
        {"add": _ref(family, "counter", name)},
        {"add": _ref(family, "chain", name)},
        _rule(family, name, [_udp(), dnat]),  # nft: a port rewrite needs an l4 match
    ]


def _service_commands(family: Family, arm: KernelArm, timeout: int | None) -> tuple[list[Json], list[Any]]:
    """The Service's counter, chains and rules, and its backends' `backend_counters` elements."""
    chain = service_chain(arm.vip)
    out: list[Json] = [{"add": _ref(family, "counter", chain)}, {"add": _ref(family, "chain", chain)}]
    lead = [] if timeout is None else [{"ct timeout": timeout_name(timeout)}]
    ranges = share_ranges([b.weight for b in arm.backends])
    if not ranges:
        return [*out, _rule(family, chain, [*lead, {"drop": None}])], []
    elems: list[Any] = []
    counted: list[Any] = []
    for r in ranges:
        backend = arm.backends[r.backend]
        span = {"range": [r.low, r.high]} if r.high > r.low else r.low
        if not backend.valid:
            elems.append([span, {"drop": None}])
            continue
        target = backend_chain(arm.vip, backend.ip, backend.port)
        if not any(e[1] == {"goto": {"target": target}} for e in elems):  # one chain per endpoint, listed twice or not
            out += _backend_commands(family, arm, backend)
            counted.append([{"concat": [arm.vip, backend.ip, backend.port]}, target])
        elems.append([span, {"goto": {"target": target}}])
    pick = {"vmap": {"key": {"numgen": {"mode": "random", "mod": BUCKETS, "offset": 0}}, "data": {"set": elems}}}
    return [*out, _rule(family, chain, [*lead, pick])], counted


def _normal(arm: KernelArm) -> tuple[Family, KernelArm]:
    family, vip = address(arm.vip, "VIP")
    backends = []
    for b in arm.backends:
        if isinstance(b.port, bool) or not isinstance(b.port, int) or not 1 <= b.port <= 65535:
            raise RulesetError(f"backend port {b.port!r} is not a port number (1-65535)")
        if b.valid:
            b_family, ip = address(b.ip, "backend")
            if b_family != family:
                raise RulesetError(f"backend {b.ip} of VIP {vip}: not the VIP's family (no NAT46/64 here)")
            b = b._replace(ip=ip)
        backends.append(b)
    return family, arm._replace(vip=vip, backends=tuple(backends))


def by_family(arms: Sequence[KernelArm]) -> dict[Family, list[KernelArm]]:
    """The arms checked, their addresses in nft's form, split by family and ordered by VIP."""
    out: dict[Family, dict[str, KernelArm]] = {f: {} for f in FAMILIES}
    for arm in arms:
        family, arm = _normal(arm)
        if arm.vip in out[family]:
            raise RulesetError(f"VIP {arm.vip} listed twice")
        out[family][arm.vip] = arm
    return {f: [v[k] for k in sorted(v, key=lambda a: ipaddress.ip_address(a))] for f, v in out.items()}


def _hooks(family: Family) -> list[Json]:
    """The four hooked chains and their rules: they never change with the arms."""
    key = {"concat": _daddr_dport(family)}
    in_vips = {"match": {"op": "==", "left": key, "right": f"@{VIP_SET}"}}
    marked = {"match": {"op": "==", "left": {"meta": {"key": "mark"}}, "right": CAPTURE_DIVERT_FWMARK}}
    unmark = {"mangle": {"key": {"meta": {"key": "mark"}}, "value": 0}}
    backend_key = {"concat": [{"ct": {"key": f"{family} daddr", "dir": "original"}}, *_daddr_dport(family)]}

    def hooked(name: str, kind: str, prio: int) -> Json:
        return {"add": _ref(family, "chain", name, type=kind, hook="output", prio=prio, policy="accept")}

    # `udp dport` implies `meta l4proto udp` (nft adds that match itself and lists the rule without it)
    claim = {"mangle": {"key": {"meta": {"key": "mark"}}, "value": KERNEL_UDP_FWMARK}}
    return [
        hooked(CLAIM_CHAIN, "filter", PRIO_CLAIM),
        _rule(family, CLAIM_CHAIN, [{"counter": {"map": {"key": key, "data": f"@{VIP_COUNTERS}"}}}]),
        _rule(family, CLAIM_CHAIN, [in_vips, claim]),
        hooked(UNDIVERT_CHAIN, "route", PRIO_UNDIVERT),  # for a capture that does not skip the claim (older)
        _rule(family, UNDIVERT_CHAIN, [marked, in_vips, {"counter": {"packets": 0, "bytes": 0}}, unmark]),
        hooked(DISPATCH_CHAIN, "nat", PRIO_DISPATCH),
        _rule(family, DISPATCH_CHAIN, [{"vmap": {"key": key, "data": f"@{SERVICE_MAP}"}}]),
        hooked(COUNT_BACKEND_CHAIN, "filter", PRIO_COUNT_BACKEND),
        _rule(
            family, COUNT_BACKEND_CHAIN, [{"counter": {"map": {"key": backend_key, "data": f"@{BACKEND_COUNTERS}"}}}]
        ),
    ]


def build_family(family: Family, ordered: Sequence[KernelArm], default_idle_timeout_s: float | None) -> list[Json]:
    """Table `<family> aether_udp` for `ordered` (arms of that family, normalized and sorted by `by_family`)."""
    addr = _ADDR_TYPE[family]
    key_type = [addr, "inet_service"]
    commands: list[Json] = [
        {"add": {"table": {"family": family, "name": KERNEL_UDP_TABLE}}},
        {"add": _ref(family, "set", VIP_SET, type=key_type)},
        {"add": _ref(family, "map", SERVICE_MAP, type=key_type, map="verdict")},
        {"add": _ref(family, "map", VIP_COUNTERS, type=key_type, map="counter")},
        {"add": _ref(family, "map", BACKEND_COUNTERS, type=[addr, *key_type], map="counter")},
    ]
    timeouts = {a.vip: _timeout(a, default_idle_timeout_s) for a in ordered}
    for seconds in sorted({t for t in timeouts.values() if t is not None}):
        policy = {"unreplied": seconds, "replied": seconds}
        commands.append(
            {"add": _ref(family, "ct timeout", timeout_name(seconds), protocol="udp", l3proto=family, policy=policy)}
        )
    counted: list[Any] = []
    for arm in ordered:
        cmds, elems = _service_commands(family, arm, timeouts[arm.vip])
        commands += cmds
        counted += elems
    keys = [{"concat": [arm.vip, L4_OUTBOUND_PORT]} for arm in ordered]
    elements = {
        VIP_SET: keys,
        SERVICE_MAP: [[k, {"goto": {"target": service_chain(a.vip)}}] for k, a in zip(keys, ordered, strict=True)],
        VIP_COUNTERS: [[k, service_chain(a.vip)] for k, a in zip(keys, ordered, strict=True)],
        BACKEND_COUNTERS: counted,
    }
    for name, elem in elements.items():  # nft takes a set's elements in `add element`, not in `add set`
        if elem:
            commands.append({"add": _ref(family, "element", name, elem=elem)})
    return commands + _hooks(family)


def _timeout(arm: KernelArm, default: float | None) -> int | None:
    chosen = arm.idle_timeout_s if arm.idle_timeout_s is not None else default
    return None if chosen is None else timeout_seconds(chosen)


def build_kernel_udp(arms: Sequence[KernelArm], *, default_idle_timeout_s: float | None = None) -> Json:
    """The nftables JSON that creates tables `ip aether_udp` and `ip6 aether_udp` for `arms` (pure: same input,
    same output; arms are ordered by VIP). No arms of a family: its table with the chains and empty maps, which
    match nothing. `default_idle_timeout_s`: the node's idle timeout for arms without their own."""
    split = by_family(arms)
    commands = [c for f in FAMILIES for c in build_family(f, split[f], default_idle_timeout_s)]
    ruleset = {"nftables": commands}
    check_statement_order(ruleset)
    return ruleset


def replace_commands(ruleset: Json) -> Json:
    """One transaction that makes both tables exactly `ruleset` (add so delete cannot fail, delete, re-create
    whole): applying it twice leaves one copy; nft applies it all or nothing."""
    return {"nftables": [*delete_commands()["nftables"], *ruleset["nftables"]]}


def delete_commands() -> Json:
    out: list[Json] = []
    for family in FAMILIES:
        ref = {"family": family, "name": KERNEL_UDP_TABLE}
        out += [{"add": {"table": dict(ref)}}, {"delete": {"table": dict(ref)}}]
    return {"nftables": out}
