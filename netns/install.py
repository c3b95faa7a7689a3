"""Install, check and remove the capture in a network namespace given by path.

All of it runs with the calling thread inside the netns (`nsthread.call_in_netns`, which returns it home after):
one libnftables transaction that creates table `inet aether` whole or - when it exists - adds, flushes and deletes it
and re-creates it whole (re-apply leaves one copy; either transaction is atomic), then, for `tproxy`, the ip rule and
the local route over rtnetlink. What loaded is read back and compared with what was asked: nft
rejects a statement after `redirect` and `-f` is atomic, so a silently empty ruleset is the failure to catch. If any
step fails after the table loaded, everything is removed again: nothing is left half-installed.
"""

from __future__ import annotations

import _thread
import errno
import os

from aether.netns import rules as nftrules
from aether.netns.contract import (
    CAPTURE_DIVERT_FWMARK,
    CAPTURE_ROUTE_TABLE,
    CAPTURE_RULE_PRIORITY,
    CAPTURED_PORTS,
    CaptureMode,
    InboundPolicy,
    Transport,
)
from aether.netns.libnft import Nft, NftError
from aether.netns.nsthread import NetnsError, NetnsMissing, call_in_netns
from aether.netns.rtnl import RT_SCOPE_HOST, RTN_LOCAL, Route, RtnlSocket, Rule

TYPE_CHECKING = False  # on the CNI plugin's start-up path: see aether.netns.lite
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any
    from typing import NamedTuple as Record
else:
    from aether.netns.lite import Record

LOOPBACK_IFINDEX = 1  # `lo` is ifindex 1 in every network namespace

DIVERT_RULE = Rule(
    priority=CAPTURE_RULE_PRIORITY, fwmark=CAPTURE_DIVERT_FWMARK, fwmask=0xFFFFFFFF, table=CAPTURE_ROUTE_TABLE
)
LOCAL_ROUTE = Route(table=CAPTURE_ROUTE_TABLE, type=RTN_LOCAL, scope=RT_SCOPE_HOST, oif=LOOPBACK_IFINDEX, dst_len=0)

# libnftables keeps some process-global state; one capture operation at a time per process (cheap: a builtin lock).
_LOCK = _thread.allocate_lock()

# The only public way to change what gets loaded is `ports`; tests that need a broken ruleset swap this name.
build_ruleset = nftrules.build_ruleset


class CaptureError(RuntimeError):
    """The capture could not be installed (or removed) as asked; nothing is left half-installed."""


class CaptureDrift(CaptureError):
    """What is installed in the netns differs from what the mode asks for; `reasons` says how."""

    def __init__(self, netns: str, reasons: Sequence[str]) -> None:
        self.netns = netns
        self.reasons = list(reasons)
        super().__init__(f"capture in {netns} drifted: " + "; ".join(self.reasons))


class CaptureState(Record):
    """What is in a netns now: the aether table (canonical form), and our ip rules and routes."""

    table: dict[str, Any]
    rules: list[Rule]
    routes: list[Route]


def _ours(rule: Rule) -> bool:
    return rule.fwmark == CAPTURE_DIVERT_FWMARK or rule.table == CAPTURE_ROUTE_TABLE


def _list_table(nft: Nft) -> dict[str, Any]:
    res = nft.run({"nftables": [{"list": {"table": nftrules.table_ref()}}]})
    if res.rc != 0:
        if "No such file or directory" in res.error:
            return {"nftables": []}
        raise NftError(f"nft list table failed: {res.error.strip()}")
    return res.json()


def _read_state(nft: Nft, rtnl: RtnlSocket) -> CaptureState:
    table = nftrules.canonical(_list_table(nft))
    return CaptureState(
        table=table, rules=[r for r in rtnl.rules() if _ours(r)], routes=rtnl.routes(CAPTURE_ROUTE_TABLE)
    )


def drift_reasons(
    state: CaptureState,
    mode: CaptureMode,
    ports: Mapping[Transport, Sequence[int]],
    inbound: InboundPolicy | None = None,
) -> list[str]:
    """Pure: how `state` differs from what `mode` (and `inbound`) asks for (empty when it is exactly right)."""
    wanted = nftrules.canonical(build_ruleset(mode, ports, inbound))
    reasons = nftrules.diff(wanted, state.table)
    want_routing = CaptureMode(mode) is CaptureMode.TPROXY
    divert_rules = [r for r in state.rules if r == DIVERT_RULE]
    if want_routing and not divert_rules:
        reasons.append(
            f"missing ip rule: pref {CAPTURE_RULE_PRIORITY} fwmark {CAPTURE_DIVERT_FWMARK:#x} lookup {CAPTURE_ROUTE_TABLE}"
        )
    if len(divert_rules) > 1:
        reasons.append(f"ip rule fwmark {CAPTURE_DIVERT_FWMARK:#x} installed {len(divert_rules)} times")
    for r in state.rules:
        if r != DIVERT_RULE or not want_routing:
            reasons.append(f"extra ip rule: pref {r.priority} fwmark {r.fwmark:#x}/{r.fwmask:#x} lookup {r.table}")
    local = [r for r in state.routes if r == LOCAL_ROUTE]
    if want_routing and not local:
        reasons.append(f"missing route: local default dev lo table {CAPTURE_ROUTE_TABLE}")
    for rt in state.routes:
        if rt != LOCAL_ROUTE or not want_routing:
            reasons.append(f"extra route in table {CAPTURE_ROUTE_TABLE}: type {rt.type} /{rt.dst_len} oif {rt.oif}")
    return reasons


def _remove_all(nft: Nft, rtnl: RtnlSocket) -> None:
    res = nft.run(nftrules.delete_table_commands())
    if res.rc != 0:
        raise NftError(f"nft could not delete table inet aether: {res.error.strip()}")
    for rule in [r for r in rtnl.rules() if _ours(r)]:
        rtnl.delete_rule(rule)
    for route in rtnl.routes(CAPTURE_ROUTE_TABLE):
        rtnl.delete_route(route)


def _install_here(
    path: str, mode: CaptureMode, ports: Mapping[Transport, Sequence[int]], inbound: InboundPolicy | None
) -> None:
    ruleset = build_ruleset(mode, ports, inbound)
    with Nft() as nft, RtnlSocket() as rtnl:
        # a fresh netns (the CNI ADD case): create, deleting nothing; if the table exists: replace it whole
        res = nft.run(nftrules.create_table_commands(ruleset))
        if res.rc != 0:
            res = nft.run(nftrules.replace_table_commands(ruleset))
        if res.rc != 0:
            why = "; ".join(dict.fromkeys(line.strip() for line in res.error.splitlines() if line.strip()))
            raise CaptureError(f"nft rejected the {mode.value} ruleset for {path} (nothing loaded): {why}")
        try:
            stale = [r for r in rtnl.rules() if _ours(r) and r != DIVERT_RULE]
            for rule in stale:
                rtnl.delete_rule(rule)
            if mode is CaptureMode.TPROXY:
                rtnl.add_rule(DIVERT_RULE)
                for route in rtnl.routes(CAPTURE_ROUTE_TABLE):
                    if route != LOCAL_ROUTE:
                        rtnl.delete_route(route)
                rtnl.replace_route(LOCAL_ROUTE)
            else:
                rtnl.delete_rule(DIVERT_RULE)
                for route in rtnl.routes(CAPTURE_ROUTE_TABLE):
                    rtnl.delete_route(route)
            reasons = drift_reasons(_read_state(nft, rtnl), mode, ports, inbound)
            if reasons:
                raise CaptureError(f"{mode.value} capture in {path} did not load as asked: " + "; ".join(reasons))
        except BaseException as exc:
            try:
                _remove_all(nft, rtnl)
            except (OSError, NftError) as cleanup:
                raise CaptureError(f"{exc}; and the rollback failed too: {cleanup}") from exc
            if isinstance(exc, CaptureError):
                raise
            if isinstance(exc, (OSError, NftError)):
                raise CaptureError(
                    f"installing the {mode.value} capture in {path} failed (rolled back): {exc}"
                ) from exc
            raise


def _netns_error(path: str, exc: NetnsError) -> CaptureError:
    return CaptureError(exc.strerror or str(exc))


def install_capture(
    netns_path: str | os.PathLike[str],
    mode: CaptureMode = CaptureMode.TPROXY,
    *,
    ports: Mapping[Transport, Sequence[int]] = CAPTURED_PORTS,
    inbound: InboundPolicy | None = None,
) -> None:
    """Make the capture in the netns at `netns_path` exactly `mode` over `ports` (with `inbound`'s enforcement when
    it is STRICT), atomically; raise CaptureError (with nothing left half-installed) when it cannot, or when what
    loaded differs from what was asked."""
    path = os.fspath(netns_path)
    mode = CaptureMode(mode)
    try:
        with _LOCK:
            call_in_netns(path, lambda: _install_here(path, mode, ports, inbound))
    except NetnsError as exc:
        raise _netns_error(path, exc) from exc
    except NftError as exc:
        raise CaptureError(str(exc)) from exc


def capture_state(netns_path: str | os.PathLike[str]) -> CaptureState:
    """What is installed in the netns now (for checks and diagnostics)."""
    path = os.fspath(netns_path)

    def read() -> CaptureState:
        with Nft() as nft, RtnlSocket() as rtnl:
            return _read_state(nft, rtnl)

    try:
        with _LOCK:
            return call_in_netns(path, read)
    except NetnsError as exc:
        raise _netns_error(path, exc) from exc
    except (OSError, NftError) as exc:
        raise CaptureError(f"cannot read the capture in {path}: {exc}") from exc


def check_capture(
    netns_path: str | os.PathLike[str],
    mode: CaptureMode = CaptureMode.TPROXY,
    *,
    ports: Mapping[Transport, Sequence[int]] = CAPTURED_PORTS,
    inbound: InboundPolicy | None = None,
) -> None:
    """Raise CaptureDrift, with every reason, unless the netns holds exactly the capture `mode` (and `inbound`)
    asks for."""
    path = os.fspath(netns_path)
    reasons = drift_reasons(capture_state(path), CaptureMode(mode), ports, inbound)
    if reasons:
        raise CaptureDrift(path, reasons)


def remove_capture(netns_path: str | os.PathLike[str]) -> bool:
    """Remove table, rule and route; idempotent. A vanished netns is not an error (returns False)."""
    path = os.fspath(netns_path)

    def remove() -> None:
        with Nft() as nft, RtnlSocket() as rtnl:
            _remove_all(nft, rtnl)

    try:
        with _LOCK:
            call_in_netns(path, remove)
    except NetnsMissing:
        return False
    except NetnsError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise _netns_error(path, exc) from exc
    except (OSError, NftError) as exc:
        raise CaptureError(f"removing the capture from {path} failed: {exc}") from exc
    return True
