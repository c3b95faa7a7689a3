"""A recording stand-in for the capture installer's effects (`aether.netns.install.CaptureEffects`), so install
and rollback are tested without privileges: it keeps one netns's table, ip rules and routes in memory, records
every call in order, and fails where a test says.

    fx = RecordingEffects()
    apply_capture(fx, "ns", CaptureMode.TPROXY, CAPTURED_PORTS, None)
    assert fx.names()[0] == "nft create"

`calls` holds tuples: `("nft", op)` with op one of create, replace, delete, list; `("rules",)`, `("routes", table)`,
`("add_rule", rule)`, `("delete_rule", rule)`, `("replace_route", route)`, `("delete_route", route)`, `("close",)`.
The nft part models what the installer relies on: `create` fails when the table exists, `replace` and `delete` are
whole transactions, `list` returns what loaded in nft's listing form (or "No such file or directory" without a
table). It checks no nft syntax: the privileged tests do that against the kernel.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aether.netns.libnft import NftResult
from aether.netns.rtnl import Route, Rule

Call = tuple[Any, ...]
NO_TABLE = "Error: No such file or directory; did you mean table 'aether' in family inet?\n"
TABLE_EXISTS = "Error: Could not process rule: File exists\n"


def nft_op(command: dict[str, Any]) -> str:
    """Which of the installer's four nft commands `command` is: create, replace, delete or list."""
    items = command.get("nftables", [])
    first = items[0] if items else {}
    if "create" in first:
        return "create"
    if "list" in first:
        return "list"
    if len(items) > 1 and "flush" in items[1]:
        return "replace"
    if len(items) == 2 and "delete" in items[1]:
        return "delete"
    raise ValueError(f"not a command the installer sends: {command}")


@dataclass
class RecordingEffects:
    """One netns in memory. `fail`: a call's name (`nft create`, `add_rule`, ...) -> what that call raises;
    `refuse`: nft ops answered rc 1 with `refusal` (as nft refuses a ruleset)."""

    table: list[dict[str, Any]] | None = None  # the loaded objects as nft lists them ({kind: body}); None: no table
    ip_rules: list[Rule] = field(default_factory=list)
    ip_routes: list[Route] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    fail: dict[str, BaseException] = field(default_factory=dict)
    refuse: set[str] = field(default_factory=set)
    refusal: str = "Error: Could not process rule: Operation not supported\n"
    closed: bool = False
    ipv6: bool = True  # False: a netns without IPv6 (a kernel booted with ipv6.disable=1)

    def _call(self, *call: Any) -> None:
        self.calls.append(call)
        exc = self.fail.get(_name(call))
        if exc is not None:
            raise exc

    def names(self) -> list[str]:
        """The calls' names in order (`nft create`, `rules`, `add_rule`, ...): the order a test asserts."""
        return [_name(call) for call in self.calls]

    def nft(self, command: dict[str, Any]) -> NftResult:
        op = nft_op(command)
        self._call("nft", op)
        if op in self.refuse:
            return NftResult(1, "", self.refusal)
        items = command["nftables"]
        if op == "create":
            if self.table is not None:
                return NftResult(1, "", TABLE_EXISTS)
            self.table = [dict(items[0]["create"]), *(dict(i["add"]) for i in items[1:])]
        elif op == "replace":
            self.table = [dict(i["add"]) for i in items[3:]]  # after add, flush and delete of the table
        elif op == "delete":
            self.table = None
        elif self.table is None:
            return NftResult(1, "", NO_TABLE)
        else:
            return NftResult(0, json.dumps({"nftables": self.table}), "")
        return NftResult(0, "", "")

    def rules(self) -> list[Rule]:
        self._call("rules")
        return list(self.ip_rules)

    def routes(self, table: int) -> list[Route]:
        self._call("routes", table)
        return [r for r in self.ip_routes if r.table == table]

    def has_ipv6(self) -> bool:
        return self.ipv6  # the kernel's answer, not an effect: not recorded

    def add_rule(self, rule: Rule) -> bool:
        self._call("add_rule", rule)
        if rule.family == 10 and not self.ipv6:
            raise OSError(97, "Address family not supported by protocol")
        if rule in self.ip_rules:
            return False
        self.ip_rules.append(rule)
        return True

    def delete_rule(self, rule: Rule) -> int:
        self._call("delete_rule", rule)
        gone = self.ip_rules.count(rule)
        self.ip_rules = [r for r in self.ip_rules if r != rule]
        return gone

    def replace_route(self, route: Route) -> None:
        self._call("replace_route", route)
        key = (route.family, route.table, route.dst_len)
        self.ip_routes = [r for r in self.ip_routes if (r.family, r.table, r.dst_len) != key] + [route]

    def delete_route(self, route: Route) -> bool:
        self._call("delete_route", route)
        if route not in self.ip_routes:
            return False
        self.ip_routes.remove(route)
        return True

    def close(self) -> None:
        self.calls.append(("close",))
        self.closed = True

    def untouched(self) -> bool:
        """Nothing of ours is left: no table, no rule, no route."""
        return self.table is None and not self.ip_rules and not self.ip_routes


def _name(call: Call) -> str:
    return f"nft {call[1]}" if call[0] == "nft" else str(call[0])
