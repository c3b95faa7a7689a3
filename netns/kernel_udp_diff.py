"""The in-kernel UDP path's tables in a canonical form, and the one nft transaction that turns the tables one set of
arms builds into the tables another builds (`update_commands`), touching only what differs.

Canonical form of table `<family> aether_udp` (`canonical`): objects keyed by name, without handles or counter
values, set elements as a sorted list (a set is unordered; nft lists big ones in its own hash order), each chain's
rules in order (order is meaningful). The same function reads what the builder made and what `nft -j list table`
printed, so a read-back compares the two.

`update_commands` diffs the canonical forms family by family and orders the transaction so that every reference is
valid at each step (nft checks them as the commands come): new counters, timeouts and chains first; then the rules
of new chains and, for a chain whose rules changed, `flush chain` and its new rules; then the set and map elements
that went (by key) and those that came; last the chains and objects nothing refers to any more (a chain is flushed
before it is deleted). A Service whose arm did not change is not in the transaction at all: its chains, its
elements and its named counters stay as they are, counts included.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

from aether.netns.kernel_udp import FAMILIES, KERNEL_UDP_TABLE, Family, Json, KernelArm, build_kernel_udp, by_family

_OBJECTS = {"counter": "counters", "ct timeout": "timeouts"}
# nft lists a ct timeout's state only when it differs from these (its own UDP defaults; measured with 1.0.6:
# `unreplied 30, replied 30` lists as `{"replied": 30}`, `120, 120` as `{"unreplied": 120}`)
NFT_UDP_TIMEOUT_DEFAULTS = {"unreplied": 30, "replied": 120}


def _key(value: Any) -> str:
    """A set element's sort and identity key: its repr (a tenth of `json.dumps(sort_keys=True)`'s cost, measured
    at 1,000 Services, and as exact here: the builder's and nft's element dicts have one key each)."""
    return repr(value)


def _canonical_stmt(stmt: Json) -> Json:
    counter = stmt.get("counter")
    return {"counter": None} if isinstance(counter, dict) and "map" not in counter else stmt


def empty() -> Json:
    return {"tables": [], "sets": {}, "chains": {}, "rules": {}, "counters": {}, "timeouts": {}}


def _add_object(out: Json, kind: str, body: Json) -> None:
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
    elif kind in _OBJECTS:
        spec: Json = {k: body[k] for k in ("protocol", "l3proto") if k in body}
        if kind == "ct timeout":
            spec["policy"] = NFT_UDP_TIMEOUT_DEFAULTS | (body.get("policy") or {})
        out[_OBJECTS[kind]][body["name"]] = spec


def canonical(nft_json: Json, family: Family = "ip") -> Json:
    """Table `<family> aether_udp` from a ruleset or from `nft -j list table`; other tables are ignored."""
    out = empty()
    for item in nft_json.get("nftables", []):
        item = item.get("add", item)
        for kind, body in item.items():
            if not isinstance(body, dict) or body.get("family") != family:
                continue
            if body.get("table", body.get("name")) == KERNEL_UDP_TABLE:
                _add_object(out, kind, body)
    for entry in out["sets"].values():
        entry["elem"] = sorted(entry["elem"], key=_key)
    return out


def _ref(family: Family, kind: str, name: str, **body: Any) -> Json:
    return {kind: {"family": family, "table": KERNEL_UDP_TABLE, "name": name} | body}


def _rule(family: Family, chain: str, expr: list[Json]) -> Json:
    return {"add": {"rule": {"family": family, "table": KERNEL_UDP_TABLE, "chain": chain, "expr": expr}}}


def _elem_key(elem: Any, is_map: bool) -> Any:
    return elem[0] if is_map else elem


def _element_changes(family: Family, old: Json, new: Json) -> tuple[list[Json], list[Json]]:
    """(deletes, adds) of set and map elements, by key; a key whose value changed is deleted and added again."""
    deletes: list[Json] = []
    adds: list[Json] = []
    for name, entry in new["sets"].items():
        before = {_key(e): e for e in old["sets"].get(name, {}).get("elem", [])}
        after = {_key(e): e for e in entry["elem"]}
        gone = [before[k] for k in sorted(before.keys() - after.keys())]
        came = [after[k] for k in sorted(after.keys() - before.keys())]
        is_map = "map" in entry
        if gone:
            deletes.append({"delete": _ref(family, "element", name, elem=[_elem_key(e, is_map) for e in gone])})
        if came:
            adds.append({"add": _ref(family, "element", name, elem=came)})
    return deletes, adds


def _rule_changes(family: Family, old: Json, new: Json) -> list[Json]:
    out: list[Json] = []
    for chain, rules in new["rules"].items():
        if old["rules"].get(chain) == rules:
            continue
        if chain in old["chains"]:
            out.append({"flush": _ref(family, "chain", chain)})
        out += [_rule(family, chain, expr) for expr in rules]
    for chain in old["rules"].keys() - new["rules"].keys():
        if chain in new["chains"]:  # kept, now without rules
            out.append({"flush": _ref(family, "chain", chain)})
    return out


def diff_family(family: Family, old: Json, new: Json) -> list[Json]:
    """The commands that turn canonical table `old` into `new` (both of `family`, both with the same table, sets and
    hooked chains: what the builder makes)."""
    out: list[Json] = []
    for kind, field in _OBJECTS.items():
        for name in sorted(new[field].keys() - old[field].keys()):
            out.append({"add": _ref(family, kind, name, **new[field][name])})
    for name in sorted(new["chains"].keys() - old["chains"].keys()):
        out.append({"add": _ref(family, "chain", **new["chains"][name])})
    out += _rule_changes(family, old, new)
    deletes, adds = _element_changes(family, old, new)
    out += deletes + adds
    for name in sorted(old["chains"].keys() - new["chains"].keys()):
        out += [{"flush": _ref(family, "chain", name)}, {"delete": _ref(family, "chain", name)}]
    for kind, field in _OBJECTS.items():
        for name in sorted(old[field].keys() - new[field].keys()):
            out.append({"delete": _ref(family, kind, name)})
    return out


class Plan(NamedTuple):
    """What programming a netns from `previous` to `arms` needs: the canonical tables `previous` builds (what the
    netns should hold), the canonical tables `arms` build, the incremental transaction, and the endpoints whose
    flows are to be forgotten."""

    previous: dict[Family, Json]
    wanted: dict[Family, Json]
    update: Json
    departed: tuple[tuple[str, str, int], ...]  # (VIP, backend ip, port)


@functools.lru_cache(maxsize=2)
def tables(arms: tuple[KernelArm, ...], default: float | None) -> dict[Family, Json]:
    """The canonical tables `arms` build, by family (kept for the last 2 arm sets: a change's new arms are the next
    change's previous ones; about 8 MiB each at 1,000 Services, tracemalloc). Shared: read them, never change them."""
    ruleset = build_kernel_udp(arms, default_idle_timeout_s=default)
    return {f: canonical(ruleset, f) for f in FAMILIES}


@functools.lru_cache(maxsize=1)  # a plan holds its two tables: more plans would keep older tables alive
def _plan(previous: tuple[KernelArm, ...], arms: tuple[KernelArm, ...], default: float | None) -> Plan:
    old, new = tables(previous, default), tables(arms, default)
    update = {"nftables": [c for f in FAMILIES for c in diff_family(f, old[f], new[f])]}
    return Plan(old, new, update, _departed(previous, arms))


def replace_commands(wanted: dict[Family, Json]) -> Json:
    """One transaction that makes both tables exactly the canonical `wanted` (add so delete cannot fail, delete,
    re-create: the sets and maps, then what `diff_family` adds to an empty table); all or nothing."""
    commands: list[Json] = []
    for family in FAMILIES:
        ref = {"family": family, "name": KERNEL_UDP_TABLE}
        commands += [{"add": {"table": dict(ref)}}, {"delete": {"table": dict(ref)}}]
    for family in FAMILIES:
        commands.append({"add": {"table": {"family": family, "name": KERNEL_UDP_TABLE}}})
        for name, entry in wanted[family]["sets"].items():
            spec = {k: entry[k] for k in ("type", "map") if k in entry}
            commands.append({"add": _ref(family, "map" if "map" in entry else "set", name, **spec)})
        commands += sorted(diff_family(family, empty(), wanted[family]), key=_by_service)
    return {"nftables": commands}


def _by_service(command: Json) -> tuple[int, str]:
    """Objects first, then each Service's counters, chains and rules together, then the hooked chains, then the
    elements (a stable sort keeps the diff's order inside each). nft loads this order of the same commands faster:
    412 ms against 488 ms for grouped by kind, 1,000 Services (medians of 6, one netns)."""
    ((kind, body),) = next(iter(command.values())).items()
    if kind == "element":
        return (3, "")
    name = body.get("chain") if kind == "rule" else body.get("name", "")
    if kind in ("counter", "chain", "rule") and str(name).startswith("svc_"):
        return (1, str(name).split("__")[0])
    return (2, "") if kind in ("chain", "rule") else (0, "")


def _endpoints(arms: Sequence[KernelArm]) -> dict[str, set[tuple[str, int]]]:
    """VIP -> its valid backends' (ip, port), weight 0 included (a drained backend's flows finish)."""
    split = by_family(arms)
    return {a.vip: {(b.ip, b.port) for b in a.backends if b.valid} for f in FAMILIES for a in split[f]}


def _departed(old: Sequence[KernelArm], new: Sequence[KernelArm]) -> tuple[tuple[str, str, int], ...]:
    before, after = _endpoints(old), _endpoints(new)
    return tuple(sorted((v, ip, port) for v, eps in before.items() for ip, port in eps - after.get(v, set())))


def plan(
    previous: Sequence[KernelArm], arms: Sequence[KernelArm], *, default_idle_timeout_s: float | None = None
) -> Plan:
    """The `Plan` from `previous` to `arms` (pure; the last one is kept, since a node programs the same change into
    every pod netns and building and diffing 1,000 Services is most of a change's cost otherwise). The result is
    shared: read it, never change it."""
    return _plan(tuple(previous), tuple(arms), default_idle_timeout_s)


def update_commands(
    previous: Sequence[KernelArm], arms: Sequence[KernelArm], *, default_idle_timeout_s: float | None = None
) -> Json:
    """One transaction that turns the tables `previous` builds into the tables `arms` build (both with the same
    node default). Empty (no commands) when nothing changed."""
    return plan(previous, arms, default_idle_timeout_s=default_idle_timeout_s).update
