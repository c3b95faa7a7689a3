"""The node's return path for source-preserving plaintext UDP (opt-in: `aether xds --udp-preserve-source`).

With udp_proxy's `use_original_src_ip`, Envoy sends to a backend from the client pod's own address (a transparent
upstream socket bound to it), so the backend sees who called. Its replies are addressed to the client pod, and
every node routes that address to the pod itself, which would drop them (the pod's socket talks to VIP:18082).
On the node where Envoy runs (its netns: the host's, for the hostNetwork DaemonSet) three objects steer them back:

    table inet aether_node { chain return_in {
        type filter hook prerouting priority mangle; policy accept;
        ct state invalid counter
        meta l4proto udp socket transparent 1 counter meta mark set 0xae81 } }
    ip rule add pref 4371 fwmark 0xae81 lookup 44673
    ip route add local default dev lo table 44673

`socket transparent 1` matches only a datagram that belongs to an existing transparent socket: Envoy's session
socket for that client. The lookup needs whole datagrams: a reply over the link MTU arrives in fragments, and only
the first carries the UDP ports. The `ct` rule (it only counts invalid packets) makes the kernel track connections
in that netns, and with tracking it reassembles fragments before prerouting; without it every reply over ~1,472
bytes was lost (seen with a 9,000-byte echo). Nothing else a pod receives is touched, and on a backend's node (where no such socket
exists) the reply is forwarded as usual. Same node and across nodes were both seen to work with Envoy 1.40
(tests/xds/test_udp_preserve_source.py, tests/e2e/test_e2e_udp_preserve_source.py).

The mark differs from the pod capture's marks and neither is a bitmask superset of the other (a test pins it).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Final

from aether.netns.contract import CAPTURE_DIVERT_FWMARK, CAPTURE_PASSTHROUGH_FWMARK, KERNEL_UDP_FWMARK
from aether.netns.libnft import Nft, NftError
from aether.netns.nsthread import NetnsError, call_in_netns
from aether.netns.rtnl import RT_SCOPE_HOST, RTN_LOCAL, Route, RtnlSocket, Rule

NODE_TABLE: Final = "aether_node"
NODE_CHAIN: Final = "return_in"
NODE_RETURN_FWMARK: Final = 0xAE81
NODE_ROUTE_TABLE: Final = 0xAE81  # 44673
NODE_RULE_PRIORITY: Final = 4371  # before `main` (32766), which routes the client pod's address to the pod
PRIO_MANGLE: Final = -150
LOOPBACK_IFINDEX: Final = 1

RETURN_RULE: Final = Rule(
    priority=NODE_RULE_PRIORITY, fwmark=NODE_RETURN_FWMARK, fwmask=0xFFFFFFFF, table=NODE_ROUTE_TABLE
)
RETURN_ROUTE: Final = Route(
    table=NODE_ROUTE_TABLE, type=RTN_LOCAL, scope=RT_SCOPE_HOST, oif=LOOPBACK_IFINDEX, dst_len=0
)
MARKS_IN_USE: Final = (CAPTURE_DIVERT_FWMARK, CAPTURE_PASSTHROUGH_FWMARK, KERNEL_UDP_FWMARK, NODE_RETURN_FWMARK)

Json = dict[str, Any]


class NodeReturnError(RuntimeError):
    """The return path could not be installed, checked or removed as asked."""


def _ref() -> Json:
    return {"family": "inet", "name": NODE_TABLE}


def defrag_expr() -> list[Json]:
    """`ct state invalid counter`: any `ct` expression turns on tracking, hence reassembly, in the netns (pure)."""
    return [
        {"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "invalid"}},
        {"counter": {"packets": 0, "bytes": 0}},
    ]


def rule_expr() -> list[Json]:
    """`meta l4proto udp socket transparent 1 counter meta mark set 0xae81` (pure)."""
    return [
        {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "udp"}},
        {"match": {"op": "==", "left": {"socket": {"key": "transparent"}}, "right": 1}},
        {"counter": {"packets": 0, "bytes": 0}},
        {"mangle": {"key": {"meta": {"key": "mark"}}, "value": NODE_RETURN_FWMARK}},
    ]


def rules() -> list[list[Json]]:
    return [defrag_expr(), rule_expr()]


def build_ruleset() -> Json:
    """The nft commands that (re)create table inet aether_node whole: flush-by-delete first, atomically (pure)."""
    chain = {"family": "inet", "table": NODE_TABLE, "name": NODE_CHAIN}
    return {
        "nftables": [
            {"add": {"table": _ref()}},
            {"delete": {"table": _ref()}},
            {"add": {"table": _ref()}},
            {
                "add": {
                    "chain": {**chain, "type": "filter", "hook": "prerouting", "prio": PRIO_MANGLE, "policy": "accept"}
                }
            },
            *(
                {"add": {"rule": {"family": "inet", "table": NODE_TABLE, "chain": NODE_CHAIN, "expr": e}}}
                for e in rules()
            ),
        ]
    }


def _drift(nft: Nft, rtnl: RtnlSocket) -> list[str]:
    reasons: list[str] = []
    loaded = nft.table_rules(_ref())
    if loaded is None:
        reasons.append(f"missing nft table inet {NODE_TABLE}")
    elif loaded != rules():
        reasons.append(f"table inet {NODE_TABLE} holds {loaded!r}, expected its two rules")
    ours = [r for r in rtnl.rules() if r.fwmark == NODE_RETURN_FWMARK or r.table == NODE_ROUTE_TABLE]
    if ours != [RETURN_RULE]:
        reasons.append(f"ip rules for fwmark {NODE_RETURN_FWMARK:#x}: {ours}, expected [{RETURN_RULE}]")
    routes = rtnl.routes(NODE_ROUTE_TABLE)
    if routes != [RETURN_ROUTE]:
        reasons.append(f"routes in table {NODE_ROUTE_TABLE}: {routes}, expected local default dev lo")
    return reasons


def _in(netns_path: str | None, fn: Any) -> Any:
    try:
        return fn() if netns_path is None else call_in_netns(netns_path, fn)
    except (NetnsError, NftError, OSError) as exc:
        raise NodeReturnError(f"node return path in {netns_path or 'this netns'}: {exc}") from exc


def install(netns_path: str | os.PathLike[str] | None = None) -> None:
    """Make the return path exactly as above in the netns (default: the current one), idempotently; read it back."""
    path = None if netns_path is None else os.fspath(netns_path)

    def run() -> None:
        with Nft() as nft, RtnlSocket() as rtnl:
            res = nft.run(build_ruleset())
            if res.rc != 0:
                raise NodeReturnError(f"nft rejected table inet {NODE_TABLE}: {res.error.strip()}")
            for rule in [r for r in rtnl.rules() if r.fwmark == NODE_RETURN_FWMARK and r != RETURN_RULE]:
                rtnl.delete_rule(rule)
            rtnl.add_rule(RETURN_RULE)
            rtnl.replace_route(RETURN_ROUTE)
            reasons = _drift(nft, rtnl)
            if reasons:
                raise NodeReturnError("node return path did not load as asked: " + "; ".join(reasons))

    _in(path, run)


def check(netns_path: str | os.PathLike[str] | None = None) -> list[str]:
    """How the netns differs from the return path (empty when exactly right)."""
    path = None if netns_path is None else os.fspath(netns_path)

    def run() -> list[str]:
        with Nft() as nft, RtnlSocket() as rtnl:
            return _drift(nft, rtnl)

    result: list[str] = _in(path, run)
    return result


def remove(netns_path: str | os.PathLike[str] | None = None) -> None:
    path = None if netns_path is None else os.fspath(netns_path)

    def run() -> None:
        with Nft() as nft, RtnlSocket() as rtnl:
            nft.run({"nftables": [{"add": {"table": _ref()}}, {"delete": {"table": _ref()}}]})
            for rule in [r for r in rtnl.rules() if r.fwmark == NODE_RETURN_FWMARK]:
                rtnl.delete_rule(rule)
            for route in rtnl.routes(NODE_ROUTE_TABLE):
                rtnl.delete_route(route)

    _in(path, run)


def main(argv: list[str]) -> int:
    """`aether node-return install|check|remove [--netns PATH]`."""
    import argparse

    p = argparse.ArgumentParser(prog="aether node-return", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["install", "check", "remove"])
    p.add_argument("--netns", help="netns path (default: this process's, the host's for the DaemonSet)")
    args = p.parse_args(argv)
    try:
        if args.action == "install":
            install(args.netns)
            print(f"node return path installed (fwmark {NODE_RETURN_FWMARK:#x}, table {NODE_ROUTE_TABLE})")
        elif args.action == "check":
            reasons = check(args.netns)
            for reason in reasons:
                print(f"aether node-return: {reason}")
            return 1 if reasons else 0
        else:
            remove(args.netns)
    except NodeReturnError as exc:
        print(f"aether node-return: {exc}", file=sys.stderr)
        return 1
    return 0
