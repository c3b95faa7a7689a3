"""A recording stand-in for the kernel UDP path's effects (`aether.netns.kernel_udp_install.KernelUdpEffects`): it
keeps one netns's tables `ip|ip6 aether_udp` as a model (the canonical form of `aether.netns.kernel_udp_diff`) and
its UDP flows in memory, records every call in order, and refuses an nft transaction where a test says.

It applies a transaction's commands one by one to a copy of the model and keeps the copy only when all of them
applied (all or nothing, as nft). What it checks is what nft checks about references, as the commands come: a rule
or element may name only a chain, counter or timeout that exists; a chain, counter or timeout still named by a
rule or element cannot be deleted; an element deleted must exist. It checks no nft syntax: the privileged tests do
that against the kernel.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from aether.netns.kernel_udp import KernelArm, KernelBackend
from aether.netns.kernel_udp_diff import canonical, empty
from aether.netns.libnft import NftResult

# A sample node's arms, which the pure tests share: a 70/25 split with an invalid 5% (dropped), a Service with one
# backend drained (weight 0), one with no backend (dropped)
B1, B2, B3, B4 = "10.29.1.2", "10.29.1.3", "10.29.1.4", "10.29.1.5"
ARMS = (
    KernelArm(
        "10.96.0.10",
        (KernelBackend(B1, 5353, 70), KernelBackend(B2, 5353, 25), KernelBackend(B3, 5353, 5, valid=False)),
    ),
    KernelArm("10.96.0.12", (KernelBackend(B1, 53, 1), KernelBackend(B4, 53, 0))),  # B4 drained
    KernelArm("10.96.0.11", ()),  # no backend: dropped
)

Flow = tuple[str, int, str, int]  # (vip, vip port, backend ip, backend port)
Model = dict[str, Any]
Json = dict[str, Any]
_FIELDS = {"chain": "chains", "counter": "counters", "ct timeout": "timeouts"}


class Refused(Exception):
    pass


def _key(value: Any) -> str:
    return repr(value)  # the order and identity `aether.netns.kernel_udp_diff.canonical` gives set elements


def _names_in(value: Any, kind: str) -> set[str]:
    """Every chain (`goto` targets) or ct timeout named anywhere inside `value`."""
    found: set[str] = set()
    if isinstance(value, dict):
        if kind == "chain" and "goto" in value:
            found.add(value["goto"]["target"])
        if kind == "ct timeout" and "ct timeout" in value:
            found.add(value["ct timeout"])
        for v in value.values():
            found |= _names_in(v, kind)
    elif isinstance(value, list):
        for v in value:
            found |= _names_in(v, kind)
    return found


def _referenced(t: Model, kind: str) -> set[str]:
    out = _names_in(t["rules"], kind)
    for entry in t["sets"].values():
        if entry.get("map") == "counter" and kind == "counter":
            out |= {e[1] for e in entry["elem"]}
        elif entry.get("map") == "verdict":
            out |= _names_in(entry["elem"], kind)
    return out


def _check_exists(t: Model, value: Any) -> None:
    for kind, field_ in (("chain", "chains"), ("ct timeout", "timeouts")):
        missing = _names_in(value, kind) - t[field_].keys()
        if missing:
            raise Refused(f"No such file or directory: {kind} {sorted(missing)}")


def _element(t: Model, op: str, body: Json) -> None:
    entry = t["sets"].get(body["name"])
    if entry is None:
        raise Refused(f"No such file or directory: set {body['name']}")
    is_map = "map" in entry
    have = {_key(e[0] if is_map else e): e for e in entry["elem"]}
    for e in body["elem"]:
        if op == "add":
            _check_exists(t, e)
            if entry.get("map") == "counter" and e[1] not in t["counters"]:
                raise Refused(f"No such file or directory: counter {e[1]}")
            have.setdefault(_key(e[0] if is_map else e), e)
        elif have.pop(_key(e), None) is None:
            raise Refused(f"No such file or directory: element {e}")
    entry["elem"] = sorted(have.values(), key=_key)


def _apply(t: Model, op: str, kind: str, body: Json) -> None:
    name = body.get("name")
    if kind in ("set", "map") and op == "add":
        t["sets"].setdefault(name, {"elem": []} | {k: body[k] for k in ("type", "map") if k in body})
    elif kind == "element":
        _element(t, op, body)
    elif kind == "rule":
        if body["chain"] not in t["chains"]:
            raise Refused(f"No such file or directory: chain {body['chain']}")
        _check_exists(t, body["expr"])
        rule = canonical({"nftables": [{"rule": body}]}, body["family"])["rules"][body["chain"]]
        t["rules"].setdefault(body["chain"], []).extend(rule)
    elif op == "flush" and kind == "chain":
        t["rules"].pop(name, None)
    elif op == "add" and kind in _FIELDS:
        made = canonical({"nftables": [{kind: body}]}, body["family"])[_FIELDS[kind]][name]
        t[_FIELDS[kind]].setdefault(name, made)
    elif op == "delete" and kind in _FIELDS:
        if name not in t[_FIELDS[kind]] or name in _referenced(t, kind) or (kind == "chain" and t["rules"].get(name)):
            raise Refused(f"Device or resource busy (or missing): {kind} {name}")
        del t[_FIELDS[kind]][name]
    else:
        raise Refused(f"the recording effects do not model {op} {kind}")


@dataclass
class RecordingKernelUdp:
    tables: dict[str, Model] = field(default_factory=dict)  # family -> the table's model (absent: no table)
    flows: list[Flow] = field(default_factory=list)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # counter name -> (packets, bytes)
    refuse: bool = False
    closed: bool = False
    gen: int = 0  # the nft generation: one more per transaction that applied (tests move it to play another writer)

    def _listing(self, family: str, what: str) -> NftResult:
        t = self.tables.get(family)
        if t is None:
            return NftResult(1, "", "Error: No such file or directory\n")
        ref = {"family": family, "table": "aether_udp"}
        out: list[Json] = [{"table": {"family": family, "name": "aether_udp"}}] if what == "table" else []
        for name in t["counters"]:
            packets, bytes_ = self.counts.get(name, (0, 0))
            out.append({"counter": ref | {"name": name, "packets": packets, "bytes": bytes_}})
        if what == "table":
            out += [{"ct timeout": ref | {"name": n} | spec} for n, spec in t["timeouts"].items()]
            out += [{"map" if "map" in e else "set": ref | {"name": n} | e} for n, e in t["sets"].items()]
            out += [{"chain": ref | spec} for spec in t["chains"].values()]
            for chain, rules in t["rules"].items():
                for expr in rules:
                    stmts = [{"counter": {"packets": 0, "bytes": 0}} if s == {"counter": None} else s for s in expr]
                    out.append({"rule": ref | {"chain": chain, "expr": stmts}})
        return NftResult(0, json.dumps({"nftables": out}), "")

    def _transaction(self, items: list[Json]) -> dict[str, Model]:
        tables = copy.deepcopy(self.tables)
        for item in items:
            ((op, obj),) = item.items()
            ((kind, body),) = obj.items()
            family = body["family"]
            if kind == "table":
                if op == "add":
                    tables.setdefault(family, empty() | {"tables": [{"family": family, "name": body["name"]}]})
                elif tables.pop(family, None) is None:
                    raise Refused("No such file or directory: table")
                continue
            if family not in tables:
                raise Refused(f"No such file or directory: table {family}")
            _apply(tables[family], op, kind, body)
        return tables

    def nft(self, command: dict[str, Any]) -> NftResult:
        items = command["nftables"]
        if "list" in items[0]:
            ((what, ref),) = items[0]["list"].items()
            self.calls.append(("nft", "list", what, ref["family"]))
            return self._listing(ref["family"], what)
        first = [next(iter(i)) + " " + next(iter(next(iter(i.values())))) for i in items[:2]]
        op = "replace" if first == ["add table", "delete table"] and len(items) > 4 else "update"
        op = "delete" if all("table" in next(iter(i.values())) for i in items) else op
        self.calls.append(("nft", op))
        if self.refuse:
            return NftResult(1, "", "Error: Could not process rule: Operation not supported\n")
        try:
            self.tables = self._transaction(items)
        except Refused as exc:
            return NftResult(1, "", f"Error: {exc}\n")
        self.gen += 1
        return NftResult(0, "", "")

    def generation(self) -> int:
        self.calls.append(("generation",))
        return self.gen

    def forget_flows(self, vip: str, vip_port: int, backend_ip: str, backend_port: int) -> int:
        self.calls.append(("forget_flows", vip, backend_ip, backend_port))
        gone = [f for f in self.flows if f == (vip, vip_port, backend_ip, backend_port)]
        self.flows = [f for f in self.flows if f not in gone]
        return len(gone)

    def close(self) -> None:
        self.calls.append(("close",))
        self.closed = True
