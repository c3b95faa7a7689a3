"""The capture ruleset, as nftables JSON: a pure builder, and the normaliser that compares it with what loaded.

`build_ruleset(mode, ports)` returns the commands that create table `inet aether` (`{"nftables": [{"add": ...}]}`),
in exactly the shape `nft -j list table inet aether` prints them back (minus handles and counter values), so
`canonical()` of both sides can be compared for equality.
Long because: the builder and the normaliser that reads its output back share one shape and belong together.

- `tproxy` (mark-and-divert, the only mode deployed): a `route` chain on hook `output`, priority mangle, one rule per
  (transport, port): `<proto> dport <p> fib daddr type != local counter meta mark set 0xae71`. The ip rule and the
  local route that finish the divert are the installer's job (they are not nftables). First, `meta mark 0xae82
  accept` skips what the in-kernel UDP path claimed (aether.netns.kernel_udp's placement says why).
- `redirect` (the negative control, R6): a `nat` chain on hook `output`, priority dstnat, one rule per (transport,
  port): `<proto> dport <p> fib daddr type != local counter redirect to :<p>` (the same port: a port-rewriting
  capture matches but silently fails one way).

Inbound enforcement (`inbound=InboundPolicy(STRICT, sources)`, the CNI plugin's default for a meshed pod) adds an
`inbound_in` chain on hook `input`, priority filter, policy accept: replies to the pod's own connections and flows
(`ct state established,related`), loopback (the capture's own divert and anything the pod sends itself), TCP and UDP
to the inbound port 18008, and each mesh source (`ip saddr <prefix>`, counted) are accepted; every other TCP and UDP packet is
counted and dropped (other protocols, ICMP among them, pass). `PERMISSIVE` (or no policy) builds no such chain.

Any inbound policy (the CNI plugin's meshed pod, STRICT or PERMISSIVE) also adds an `egress_out` chain on hook
`output`, priority filter, policy accept: a TCP or UDP packet leaving on anything but loopback with a source that is
not one of the netns' own addresses (`fib saddr type != local`) is counted and dropped. STRICT trusts the mesh
sources by address, so a meshed pod must not be able to send as one (a raw socket needs only CAP_NET_RAW, which
container runtimes grant by default), whatever the pod network's own anti-spoofing does. Nothing the mesh sends
leaves a pod with another source: the capture's transparent replies (from a VIP) go to the pod itself over
loopback, and the inbound listeners answer from the pod's address.

Any inbound policy also adds a `capture_in` chain on hook `input`, priority filter, policy accept: the capture's L4
listeners (TCP and UDP 18082, bound in the pod's netns by the node's Envoy) take only the pod's own diverted traffic,
which arrives over loopback; a packet to one of those ports on any other interface (the node, another node, another
pod dialling `<pod IP>:18082`) is counted and dropped. The HTTP port 18080 is left to its listener, which answers
such a caller 403 and logs it (aether.xds.translate.eastwest.outbound).

`redirect` is terminal: nft rejects any statement after it and, `-f` being atomic, then loads nothing at all. The
builder checks its own output with `check_statement_order`, and the installer reads back what loaded.
"""

from __future__ import annotations

from aether.netns.contract import (
    CAPTURE_DIVERT_FWMARK,
    CAPTURED_PORTS,
    HTTP_OUTBOUND_PORT,
    INBOUND_PORT,
    KERNEL_UDP_FWMARK,
    NFT_TABLE_FAMILY,
    NFT_TABLE_NAME,
    CaptureMode,
    InboundMode,
    InboundPolicy,
    Transport,
)

TYPE_CHECKING = False  # on the CNI plugin's start-up path: see aether.netns.lite
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any, Final

    Json = dict[str, Any]

DIVERT_CHAIN: Final = "divert_out"
REDIRECT_CHAIN: Final = "redirect_out"
INBOUND_CHAIN: Final = "inbound_in"
EGRESS_CHAIN: Final = "egress_out"
CAPTURE_IN_CHAIN: Final = "capture_in"
PRIO_MANGLE: Final = -150
PRIO_DSTNAT: Final = -100
PRIO_FILTER: Final = 0

# Statements after which nothing in a rule runs; nft rejects a rule that has anything after one of them.
TERMINAL_STATEMENTS: Final = frozenset(
    {"accept", "drop", "reject", "return", "jump", "goto", "queue", "redirect", "dnat", "snat", "masquerade", "tproxy"}
)


class RulesetError(ValueError):
    """A ruleset that nft would reject, or that breaks the capture contract."""


def table_ref() -> Json:
    return {"family": NFT_TABLE_FAMILY, "name": NFT_TABLE_NAME}


def _port_match(transport: Transport, port: int) -> Json:
    return {"match": {"op": "==", "left": {"payload": {"protocol": transport.value, "field": "dport"}}, "right": port}}


def _non_local_daddr() -> Json:
    return {"match": {"op": "!=", "left": {"fib": {"result": "type", "flags": ["daddr"]}}, "right": "local"}}


def _counter() -> Json:
    return {"counter": {"packets": 0, "bytes": 0}}


def _set_divert_mark() -> Json:
    return {"mangle": {"key": {"meta": {"key": "mark"}}, "value": CAPTURE_DIVERT_FWMARK}}


def _redirect(port: int) -> Json:
    return {"redirect": {"port": port}}


def _validated_ports(ports: Mapping[Transport, Sequence[int]]) -> list[tuple[Transport, int]]:
    out: list[tuple[Transport, int]] = []
    for transport in sorted(ports, key=lambda t: t.value):
        if not isinstance(transport, Transport):
            raise RulesetError(f"unknown transport {transport!r}")
        seen: set[int] = set()
        for port in ports[transport]:
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise RulesetError(f"{transport.value} port {port!r} is not a port number (1-65535)")
            if port in seen:
                raise RulesetError(f"{transport.value} port {port} listed twice")
            seen.add(port)
            out.append((transport, port))
    if not out:
        raise RulesetError("no ports to capture: an empty capture is never what was meant")
    return out


def _source_prefix(source: str) -> tuple[str, str | Json]:
    """`a.b.c.d[/len]` or an IPv6 `x::y[/len]` -> (payload protocol, the match's right side as nft prints it back:
    a bare address for a full-length prefix, else `{"prefix": ...}` with the host bits cleared for IPv4)."""
    addr, sep, length_text = source.partition("/")
    v6 = ":" in addr
    full = 128 if v6 else 32
    if not addr or (sep and not length_text.isdigit()):
        raise RulesetError(f"mesh source {source!r} is not an address or prefix")
    length = int(length_text) if sep else full
    if not 0 < length <= full:
        raise RulesetError(f"mesh source {source!r}: prefix length must be 1-{full}")
    if not v6:
        octets = addr.split(".")
        if len(octets) != 4 or not all(o.isdigit() and int(o) < 256 for o in octets):
            raise RulesetError(f"mesh source {source!r} is not an IPv4 address or prefix")
        value = 0
        for o in octets:
            value = value * 256 + int(o)
        value &= (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF
        addr = ".".join(str((value >> shift) & 255) for shift in (24, 16, 8, 0))
    else:
        addr = _v6_network(source, addr, length)
    proto = "ip6" if v6 else "ip"
    return proto, addr if length == full else {"prefix": {"addr": addr, "len": length}}


source_prefix = _source_prefix  # also the node's mesh-source guard's (aether.netns.node_guard)


def _v6_network(source: str, addr: str, length: int) -> str:
    """The IPv6 prefix's network address in RFC 5952 form (what nft prints), without `ipaddress` (it imports
    functools: see aether.netns.lite)."""
    head, dbl, tail = addr.partition("::")
    left = [g for g in head.split(":") if g] if head else []
    right = [g for g in tail.split(":") if g] if tail else []
    groups = left + ["0"] * (8 - len(left) - len(right)) + right if dbl else left
    hexdigits = "0123456789abcdefABCDEF"
    if len(groups) != 8 or not all(0 < len(g) <= 4 and all(c in hexdigits for c in g) for g in groups):
        raise RulesetError(f"mesh source {source!r} is not an IPv6 address or prefix")
    value = 0
    for g in groups:
        value = (value << 16) | int(g, 16)
    value &= ((1 << 128) - 1) ^ ((1 << (128 - length)) - 1)
    words = [(value >> (16 * (7 - i))) & 0xFFFF for i in range(8)]
    best, start = (0, 0), None  # the longest run of zero words (two or more) becomes "::"
    for i, w in enumerate([*words, 1]):
        if w == 0 and start is None:
            start = i
        elif w != 0 and start is not None:
            if i - start > best[1] - best[0] and i - start > 1:
                best = (start, i)
            start = None
    text = [format(w, "x") for w in words]
    if best[1] - best[0] > 1:
        return ":".join(text[: best[0]]) + "::" + ":".join(text[best[1] :])
    return ":".join(text)


def _accept() -> Json:
    return {"accept": None}


def _inbound_rules(policy: InboundPolicy) -> list[list[Json]]:
    est = {"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}}
    lo = {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "lo"}}
    out: list[list[Json]] = [[est, _accept()], [lo, _accept()]]
    for transport in (Transport.TCP, Transport.UDP):
        out.append([_port_match(transport, INBOUND_PORT), _accept()])
    seen: list[tuple[str, Any]] = []
    for source in policy.mesh_sources:
        proto, right = _source_prefix(source)
        if (proto, right) in seen:
            continue
        seen.append((proto, right))
        out.append(
            [
                {"match": {"op": "==", "left": {"payload": {"protocol": proto, "field": "saddr"}}, "right": right}},
                _counter(),  # what the node proxies delivered, per source (tests pin the mechanism by it)
                _accept(),
            ]
        )
    for transport in (Transport.TCP, Transport.UDP):
        l4 = {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": transport.value}}
        out.append([l4, _counter(), {"drop": None}])
    return out


def _egress_rules() -> list[list[Json]]:
    not_lo = {"match": {"op": "!=", "left": {"meta": {"key": "oifname"}}, "right": "lo"}}
    foreign = {"match": {"op": "!=", "left": {"fib": {"result": "type", "flags": ["saddr"]}}, "right": "local"}}
    out: list[list[Json]] = []
    for transport in (Transport.TCP, Transport.UDP):
        l4 = {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": transport.value}}
        out.append([not_lo, l4, foreign, _counter(), {"drop": None}])
    return out


def _capture_in_rules(pairs: Sequence[tuple[Transport, int]]) -> list[list[Json]]:
    not_lo = {"match": {"op": "!=", "left": {"meta": {"key": "iifname"}}, "right": "lo"}}
    return [[not_lo, _port_match(t, p), _counter(), {"drop": None}] for t, p in pairs if p != HTTP_OUTBOUND_PORT]


def _chain_commands(name: str, hook: str, rules: list[list[Json]]) -> list[Json]:
    fam, table = NFT_TABLE_FAMILY, NFT_TABLE_NAME
    chain: Json = {"family": fam, "table": table, "name": name, "type": "filter", "hook": hook}
    chain |= {"prio": PRIO_FILTER, "policy": "accept"}
    out: list[Json] = [{"add": {"chain": chain}}]
    out += [{"add": {"rule": {"family": fam, "table": table, "chain": name, "expr": expr}}} for expr in rules]
    return out


def build_ruleset(
    mode: CaptureMode,
    ports: Mapping[Transport, Sequence[int]] = CAPTURED_PORTS,
    inbound: InboundPolicy | None = None,
) -> Json:
    """The nftables JSON that creates table `inet aether` for `mode` (pure; same input, same output), with the
    inbound enforcement chain when `inbound` is STRICT, and the egress source check and the capture listeners'
    loopback-only check whenever `inbound` is given."""
    mode = CaptureMode(mode)
    pairs = _validated_ports(ports)
    fam, table = NFT_TABLE_FAMILY, NFT_TABLE_NAME
    if mode is CaptureMode.TPROXY:
        chain: Json = {"family": fam, "table": table, "name": DIVERT_CHAIN, "type": "route", "hook": "output"}
        chain |= {"prio": PRIO_MANGLE, "policy": "accept"}
    else:
        chain = {"family": fam, "table": table, "name": REDIRECT_CHAIN, "type": "nat", "hook": "output"}
        chain |= {"prio": PRIO_DSTNAT, "policy": "accept"}
    commands: list[Json] = [{"add": {"table": table_ref()}}, {"add": {"chain": chain}}]
    claimed = {"match": {"op": "==", "left": {"meta": {"key": "mark"}}, "right": KERNEL_UDP_FWMARK}}
    rules = [[claimed, _accept()]] if mode is CaptureMode.TPROXY else []
    for transport, port in pairs:
        terminal = _set_divert_mark() if mode is CaptureMode.TPROXY else _redirect(port)
        rules.append([_port_match(transport, port), _non_local_daddr(), _counter(), terminal])
    commands += [{"add": {"rule": {"family": fam, "table": table, "chain": chain["name"], "expr": e}}} for e in rules]
    if inbound is not None and InboundMode(inbound.mode) is InboundMode.STRICT:
        commands += _chain_commands(INBOUND_CHAIN, "input", _inbound_rules(inbound))
    if inbound is not None:
        commands += _chain_commands(EGRESS_CHAIN, "output", _egress_rules())
        if capture_in := _capture_in_rules(pairs):
            commands += _chain_commands(CAPTURE_IN_CHAIN, "input", capture_in)
    ruleset = {"nftables": commands}
    check_statement_order(ruleset)
    return ruleset


def _copy_json(value: Any) -> Any:
    """A deep copy of JSON data (dicts, lists, scalars): `copy.deepcopy` without importing `copy`."""
    if isinstance(value, dict):
        return {k: _copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_json(v) for v in value]
    return value


def create_table_commands(ruleset: Json) -> Json:
    """One transaction that creates table `inet aether` as `ruleset`, failing whole if the table already exists.

    The fast path for a fresh netns: deleting anything (even a just-added empty table) puts it on nf_tables' global
    destroy list, and the next close of an nfnetlink socket then waits for an RCU grace period (~10 ms here)."""
    commands = _copy_json(list(ruleset["nftables"]))
    if not commands or "table" not in commands[0].get("add", {}):
        raise RulesetError("a ruleset starts with `add table`")
    commands[0] = {"create": commands[0]["add"]}
    return {"nftables": commands}


def replace_table_commands(ruleset: Json) -> Json:
    """One transaction that makes table `inet aether` exactly `ruleset`: add (so delete cannot fail), flush,
    delete, then re-create it whole. Applying it twice leaves one copy."""
    ref = table_ref()
    prefix = [{"add": {"table": dict(ref)}}, {"flush": {"table": dict(ref)}}, {"delete": {"table": dict(ref)}}]
    return {"nftables": prefix + _copy_json(list(ruleset["nftables"]))}


def delete_table_commands() -> Json:
    """Remove table `inet aether` if it is there (idempotent in one transaction)."""
    ref = table_ref()
    return {"nftables": [{"add": {"table": dict(ref)}}, {"delete": {"table": dict(ref)}}]}


def _objects(items: Iterable[Json]) -> Iterable[tuple[str, Json]]:
    """(kind, body) for each table/chain/rule, whether given as `{"add": {kind: body}}` or listed `{kind: body}`."""
    for item in items:
        if "add" in item:
            item = item["add"]
        for kind in ("table", "chain", "rule"):
            if kind in item:
                yield kind, item[kind]


def _canonical_stmt(stmt: Json) -> Json:
    if "counter" in stmt:
        return {"counter": None}  # anonymous counter: its values are state, not configuration
    return stmt


def check_statement_order(ruleset: Json) -> None:
    """Raise RulesetError if any rule has a statement after a terminal one (nft rejects the whole transaction)."""
    for kind, body in _objects(ruleset.get("nftables", [])):
        if kind != "rule":
            continue
        expr = body.get("expr", [])
        for i, stmt in enumerate(expr[:-1]):
            name = next(iter(stmt), "")
            if name in TERMINAL_STATEMENTS:
                after = ", ".join(next(iter(s), "?") for s in expr[i + 1 :])
                raise RulesetError(
                    f"rule in chain {body.get('chain')!r}: {after} after terminal {name!r} (nft rejects it)"
                )


def canonical(nft_json: Json) -> Json:
    """Table `inet aether` from a ruleset or from `nft -j list table|ruleset`, without handles or counter values.

    `{"tables": [...], "chains": {name: {...}}, "rules": {chain: [[stmt, ...], ...]}}`; rule order within a chain is
    kept (it is meaningful), other objects are keyed by name. Objects of other tables are ignored.
    """
    tables: list[Json] = []
    chains: dict[str, Json] = {}
    rules: dict[str, list[list[Json]]] = {}
    for kind, body in _objects(nft_json.get("nftables", [])):
        if body.get("family") != NFT_TABLE_FAMILY or body.get("table", body.get("name")) != NFT_TABLE_NAME:
            continue
        if kind == "table":
            tables.append({"family": body["family"], "name": body["name"]})
        elif kind == "chain":
            chains[body["name"]] = {k: v for k, v in body.items() if k not in ("handle", "family", "table", "name")}
        else:
            rules.setdefault(body["chain"], []).append([_canonical_stmt(s) for s in body.get("expr", [])])
    return {"tables": tables, "chains": chains, "rules": rules}


def _describe_rule(expr: list[Json]) -> str:
    parts: list[str] = []
    for stmt in expr:
        if "match" in stmt:
            m = stmt["match"]
            left = m["left"]
            if "payload" in left:
                parts.append(f"{left['payload']['protocol']} {left['payload']['field']} {m['op']} {m['right']}")
            elif "meta" in left or "ct" in left:
                key = left.get("meta", left.get("ct", {})).get("key")
                parts.append(f"{'meta' if 'meta' in left else 'ct'} {key} {m['op']} {m['right']}")
            elif "fib" in left:
                parts.append(f"fib {' '.join(left['fib']['flags'])} {left['fib']['result']} {m['op']} {m['right']}")
            else:
                parts.append(f"match {m}")
        elif "mangle" in stmt:
            parts.append(f"meta mark set {stmt['mangle']['value']:#x}")
        elif "redirect" in stmt:
            parts.append(f"redirect to :{stmt['redirect'].get('port', '?')}")
        else:
            parts.append(next(iter(stmt), "?"))
    return " ".join(parts)


def diff(wanted: Json, loaded: Json) -> list[str]:
    """Readable differences between two canonical forms (empty when they are equal)."""
    out: list[str] = []
    if wanted["tables"] != loaded["tables"]:
        if not loaded["tables"]:
            out.append(f"table {NFT_TABLE_FAMILY} {NFT_TABLE_NAME} is missing")
        else:
            out.append(f"tables differ: wanted {wanted['tables']}, loaded {loaded['tables']}")
    for name in sorted(set(wanted["chains"]) | set(loaded["chains"])):
        w, got = wanted["chains"].get(name), loaded["chains"].get(name)
        if w is None:
            out.append(f"extra chain {name!r}")
        elif got is None:
            out.append(f"missing chain {name!r}")
        elif w != got:
            out.append(f"chain {name!r} differs: wanted {w}, loaded {got}")
    for name in sorted(set(wanted["rules"]) | set(loaded["rules"])):
        w_rules, got_rules = wanted["rules"].get(name, []), loaded["rules"].get(name, [])
        here = [f"missing rule in {name!r}: {_describe_rule(r)}" for r in w_rules if r not in got_rules]
        here += [f"extra rule in {name!r}: {_describe_rule(r)}" for r in got_rules if r not in w_rules]
        if not here and w_rules != got_rules:
            here.append(f"rules in {name!r} are in a different order or duplicated ({len(got_rules)} loaded)")
        out += here
    return out
