"""The node's guard of the mesh sources: a packet that claims a mesh source must arrive the way that source is routed.

STRICT admits new inbound flows from the mesh sources (`aether.netns.rules`): the pod's gateway, from which its own
node proxy delivers, and the nodes' addresses (`meshSources`), from which another node's proxy delivers plaintext
UDP and raw TCP. Those are addresses, and with the pod network's anti-spoofing off (`rp_filter=0`, as on the lab's
veths) any pod on a node could send with one of them: a meshed pod's own netns stops it (`egress_out`), a pod
without aether's ruleset (not meshed, or its ADD failed) could not be stopped there. In the node's netns (the host's,
where the DaemonSet runs) this table stops it where it enters:

    table inet aether_guard { chain mesh_sources_in {
        type filter hook prerouting priority raw; policy accept;
        ip saddr 10.250.0.0/16 fib saddr . iif oif missing counter drop     # one rule per mesh source
        ip saddr 169.254.1.1 fib saddr . iif oif missing counter drop } }

`fib saddr . iif oif missing` is a strict reverse-path check: the route back to the packet's source does not leave
through the interface it came in on. Another node's genuine packet arrives on the node link its address is routed
through and passes; the same source arriving from a pod's veth is dropped and counted; a source that is the node's
own address (the gateway, the node's IP) is never routed out of any interface, so it only passes from the node's own
stack (locally sent packets do not cross prerouting, and loopback is exempt). Only packets claiming a mesh source are
looked at: everything else the node forwards is untouched.

What it does not stop (docs/limits.md, Security): a process on a node (any hostNetwork pod) sends from that node's
addresses as the node's proxy does; and a node network whose routing back to a node is asymmetric (the reply route
leaves through another interface than the packets arrive on) would have that node's packets dropped, as the
kernel's own strict `rp_filter` would.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Final

from aether.netns.libnft import Nft, NftError
from aether.netns.nsthread import NetnsError, call_in_netns
from aether.netns.rules import RulesetError, source_prefix

GUARD_TABLE: Final = "aether_guard"
GUARD_CHAIN: Final = "mesh_sources_in"
PRIO_RAW: Final = -300

Json = dict[str, Any]


class NodeGuardError(RuntimeError):
    """The guard could not be built, installed, checked or removed as asked."""


def _ref() -> Json:
    return {"family": "inet", "name": GUARD_TABLE}


def rules(sources: tuple[str, ...]) -> list[list[Json]]:
    """One rule per distinct mesh source, in order: `<ip|ip6> saddr <prefix> fib saddr . iif oif missing counter
    drop` (pure; raises NodeGuardError for what is not an address or prefix, or for no source at all)."""
    out: list[list[Json]] = []
    for source in sources:
        try:
            proto, right = source_prefix(source)
        except RulesetError as exc:
            raise NodeGuardError(str(exc)) from exc
        saddr: Json = {
            "match": {"op": "==", "left": {"payload": {"protocol": proto, "field": "saddr"}}, "right": right}
        }
        rpf: Json = {
            "match": {"op": "==", "left": {"fib": {"result": "oif", "flags": ["saddr", "iif"]}}, "right": False}
        }
        rule: list[Json] = [saddr, rpf, {"counter": {"packets": 0, "bytes": 0}}, {"drop": None}]
        if rule not in out:
            out.append(rule)
    if not out:
        raise NodeGuardError("no mesh sources to guard: name at least one (--mesh-source)")
    return out


def build_ruleset(sources: tuple[str, ...]) -> Json:
    """The nft commands that (re)create table inet aether_guard whole, atomically (pure)."""
    chain: Json = {"family": "inet", "table": GUARD_TABLE, "name": GUARD_CHAIN}
    chain |= {"type": "filter", "hook": "prerouting", "prio": PRIO_RAW, "policy": "accept"}
    body = [
        {"add": {"rule": {"family": "inet", "table": GUARD_TABLE, "chain": GUARD_CHAIN, "expr": e}}}
        for e in rules(sources)
    ]
    reset = [{"add": {"table": _ref()}}, {"delete": {"table": _ref()}}, {"add": {"table": _ref()}}]
    return {"nftables": [*reset, {"add": {"chain": chain}}, *body]}


def _drift(nft: Nft, sources: tuple[str, ...]) -> list[str]:
    loaded = nft.table_rules(_ref())
    if loaded is None:
        return [f"missing nft table inet {GUARD_TABLE}"]
    if loaded != rules(sources):
        return [f"table inet {GUARD_TABLE} holds {loaded!r}, expected one rule per mesh source of {list(sources)}"]
    return []


def _in(netns_path: str | os.PathLike[str] | None, fn: Any) -> Any:
    path = None if netns_path is None else os.fspath(netns_path)
    try:
        return fn() if path is None else call_in_netns(path, fn)
    except (NetnsError, NftError, OSError) as exc:
        raise NodeGuardError(f"mesh-source guard in {path or 'this netns'}: {exc}") from exc


def install(sources: tuple[str, ...], netns_path: str | os.PathLike[str] | None = None) -> None:
    """Make the guard exactly as above in the netns (default: the current one); a no-op when it already is (its
    counters kept); read it back."""
    ruleset = build_ruleset(sources)

    def run() -> None:
        with Nft() as nft:
            if not _drift(nft, sources):
                return
            res = nft.run(ruleset)
            if res.rc != 0:
                raise NodeGuardError(f"nft rejected table inet {GUARD_TABLE}: {res.error.strip()}")
            reasons = _drift(nft, sources)
            if reasons:
                raise NodeGuardError("mesh-source guard did not load as asked: " + "; ".join(reasons))

    _in(netns_path, run)


def check(sources: tuple[str, ...], netns_path: str | os.PathLike[str] | None = None) -> list[str]:
    """How the netns differs from the guard for `sources` (empty when exactly right)."""

    def run() -> list[str]:
        with Nft() as nft:
            return _drift(nft, sources)

    result: list[str] = _in(netns_path, run)
    return result


def remove(netns_path: str | os.PathLike[str] | None = None) -> None:
    def run() -> None:
        with Nft() as nft:
            nft.run({"nftables": [{"add": {"table": _ref()}}, {"delete": {"table": _ref()}}]})

    _in(netns_path, run)


def main(argv: list[str]) -> int:
    """`aether node-guard install|check|remove [--mesh-source P ...] [--netns PATH]`."""
    import argparse

    p = argparse.ArgumentParser(prog="aether node-guard", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["install", "check", "remove"])
    p.add_argument("--mesh-source", action="append", default=[], help="a mesh source (address or prefix); repeat")
    p.add_argument("--netns", help="netns path (default: this process's, the host's for the DaemonSet)")
    args = p.parse_args(argv)
    sources = tuple(s.strip() for arg in args.mesh_source for s in arg.split(",") if s.strip())
    try:
        if args.action == "install":
            install(sources, args.netns)
            print(f"mesh-source guard installed (table inet {GUARD_TABLE}: {', '.join(sources)})")
        elif args.action == "check":
            reasons = check(sources, args.netns)
            for reason in reasons:
                print(f"aether node-guard: {reason}")
            return 1 if reasons else 0
        else:
            remove(args.netns)
    except NodeGuardError as exc:
        print(f"aether node-guard: {exc}", file=sys.stderr)
        return 1
    return 0
