"""Install, check and remove the capture in a network namespace given by path.

All of it runs with the calling thread inside the netns (`nsthread.call_in_netns`, which returns it home after):
one libnftables transaction that creates table `inet aether` whole or - when it exists - adds, flushes and deletes it
and re-creates it whole (re-apply leaves one copy; either transaction is atomic), then, for `tproxy`, the ip rule and
the local route over rtnetlink, for IPv4 and IPv6 both (table `inet aether` marks both families). What loaded is read back and compared with what was asked: nft
rejects a statement after `redirect` and `-f` is atomic, so a silently empty ruleset is the failure to catch. If any
step fails after the table loaded, everything is removed again: nothing is left half-installed.

The effects on the netns go through one small interface, `CaptureEffects` (run a libnftables JSON command; list,
add and delete ip rules; list, replace and delete routes), opened on the thread inside the netns: `KernelEffects` is
the real one (libnftables and rtnetlink), and `apply_capture`, `read_state` and `remove_all` take any, so the
order of what install and rollback do is tested without privileges too (`aether.testing.capture_effects`, in the
way Istio's `cni/pkg/iptables` injects its `Dependencies`).
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
from aether.netns.libnft import Nft, NftError, NftResult
from aether.netns.nsthread import NetnsError, NetnsMissing, call_in_netns
from aether.netns.rtnl import AF_INET6, AF_UNSPEC, RT_SCOPE_HOST, RT_SCOPE_UNIVERSE, RTN_LOCAL, Route, RtnlSocket, Rule

TYPE_CHECKING = False  # on the CNI plugin's start-up path: see aether.netns.lite
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, Protocol, TypeVar
    from typing import NamedTuple as Record

    T = TypeVar("T")
else:
    from aether.netns.lite import Record

    Protocol = object  # `typing` costs the plugin ~19 ms: the interface is checked by mypy only

LOOPBACK_IFINDEX = 1  # `lo` is ifindex 1 in every network namespace

DIVERT_RULE = Rule(
    priority=CAPTURE_RULE_PRIORITY, fwmark=CAPTURE_DIVERT_FWMARK, fwmask=0xFFFFFFFF, table=CAPTURE_ROUTE_TABLE
)
LOCAL_ROUTE = Route(table=CAPTURE_ROUTE_TABLE, type=RTN_LOCAL, scope=RT_SCOPE_HOST, oif=LOOPBACK_IFINDEX, dst_len=0)
# The same two objects for IPv6 (`ip -6 rule ... lookup 0xae71`, `ip -6 route add local ::/0 dev lo table 0xae71`):
# table `inet aether` marks both families, and a marked IPv6 packet without them would leave on the pod's route.
DIVERT_RULE6 = DIVERT_RULE._replace(family=AF_INET6)
LOCAL_ROUTE6 = LOCAL_ROUTE._replace(family=AF_INET6, scope=RT_SCOPE_UNIVERSE)  # IPv6 routes are dumped universe
DIVERT_RULES = (DIVERT_RULE, DIVERT_RULE6)
LOCAL_ROUTES = (LOCAL_ROUTE, LOCAL_ROUTE6)

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
    """What is in a netns now: the aether table (canonical form), and our ip rules and routes; `ipv6`: whether the
    netns has IPv6 at all (a kernel booted with ipv6.disable=1 has none, and then no IPv6 routing is wanted)."""

    table: dict[str, Any]
    rules: list[Rule]
    routes: list[Route]
    ipv6: bool = True


class CaptureEffects(Protocol):
    """What the installer does to the netns it was opened in (`KernelEffects`, or a test's recording stub)."""

    def nft(self, command: dict[str, Any]) -> NftResult:
        """Run one libnftables JSON command (a transaction, or a list); rc != 0 is a refusal, not an exception."""
        ...

    def rules(self) -> list[Rule]: ...

    def routes(self, table: int) -> list[Route]: ...

    def has_ipv6(self) -> bool:
        """Whether the netns has IPv6 (not an effect: the kernel's answer)."""
        ...

    def add_rule(self, rule: Rule) -> bool: ...

    def delete_rule(self, rule: Rule) -> int: ...

    def replace_route(self, route: Route) -> None: ...

    def delete_route(self, route: Route) -> bool: ...

    def close(self) -> None: ...


class KernelEffects:
    """The real effects: one libnftables context and one rtnetlink socket, in the netns of the opening thread."""

    def __init__(self) -> None:
        self._nft = Nft()
        try:
            self._rtnl = RtnlSocket()
        except BaseException:
            self._nft.close()
            raise

    def nft(self, command: dict[str, Any]) -> NftResult:
        return self._nft.run(command)

    def rules(self) -> list[Rule]:
        return self._rtnl.rules(AF_UNSPEC)  # both families

    def routes(self, table: int) -> list[Route]:
        return self._rtnl.routes(table, AF_UNSPEC)

    def has_ipv6(self) -> bool:
        return os.path.isdir("/proc/sys/net/ipv6")  # absent under ipv6.disable=1; per netns (the opener's)

    def add_rule(self, rule: Rule) -> bool:
        return self._rtnl.add_rule(rule)

    def delete_rule(self, rule: Rule) -> int:
        return self._rtnl.delete_rule(rule)

    def replace_route(self, route: Route) -> None:
        self._rtnl.replace_route(route)

    def delete_route(self, route: Route) -> bool:
        return self._rtnl.delete_route(route)

    def close(self) -> None:
        try:
            self._rtnl.close()
        finally:
            self._nft.close()


def _ours(rule: Rule) -> bool:
    return rule.fwmark == CAPTURE_DIVERT_FWMARK or rule.table == CAPTURE_ROUTE_TABLE


def _list_table(fx: CaptureEffects) -> dict[str, Any]:
    res = fx.nft({"nftables": [{"list": {"table": nftrules.table_ref()}}]})
    if res.rc != 0:
        if "No such file or directory" in res.error:
            return {"nftables": []}
        raise NftError(f"nft list table failed: {res.error.strip()}")
    return res.json()


def read_state(fx: CaptureEffects) -> CaptureState:
    """What `fx`'s netns holds: the aether table (canonical form), our ip rules and our routes."""
    table = nftrules.canonical(_list_table(fx))
    rules, routes = [r for r in fx.rules() if _ours(r)], fx.routes(CAPTURE_ROUTE_TABLE)
    return CaptureState(table=table, rules=rules, routes=routes, ipv6=fx.has_ipv6())


def _wanted(ipv6: bool) -> tuple[tuple[Rule, ...], tuple[Route, ...]]:
    """The divert's rules and routes for a netns with (or without) IPv6."""
    if ipv6:
        return DIVERT_RULES, LOCAL_ROUTES
    return tuple(r for r in DIVERT_RULES if r.family != AF_INET6), tuple(
        r for r in LOCAL_ROUTES if r.family != AF_INET6
    )


def _ip_word(family: int) -> str:
    return "ip -6" if family == AF_INET6 else "ip"


def _route_word(family: int) -> str:
    return "IPv6 route" if family == AF_INET6 else "route"


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
    wanted_rules, wanted_routes = _wanted(state.ipv6)
    for wanted_rule in wanted_rules:
        ip = _ip_word(wanted_rule.family)
        divert_rules = [r for r in state.rules if r == wanted_rule]
        if want_routing and not divert_rules:
            reasons.append(
                f"missing {ip} rule: pref {CAPTURE_RULE_PRIORITY} fwmark {CAPTURE_DIVERT_FWMARK:#x} "
                f"lookup {CAPTURE_ROUTE_TABLE}"
            )
        if len(divert_rules) > 1:
            reasons.append(f"{ip} rule fwmark {CAPTURE_DIVERT_FWMARK:#x} installed {len(divert_rules)} times")
    for r in state.rules:
        if r not in wanted_rules or not want_routing:
            reasons.append(
                f"extra {_ip_word(r.family)} rule: pref {r.priority} fwmark {r.fwmark:#x}/{r.fwmask:#x} lookup {r.table}"
            )
    for wanted_route in wanted_routes:
        if want_routing and wanted_route not in state.routes:
            default = "::/0" if wanted_route.family == AF_INET6 else "default"
            reasons.append(
                f"missing {_route_word(wanted_route.family)}: local {default} dev lo table {CAPTURE_ROUTE_TABLE}"
            )
    for rt in state.routes:
        if rt not in wanted_routes or not want_routing:
            reasons.append(
                f"extra {_route_word(rt.family)} in table {CAPTURE_ROUTE_TABLE}: type {rt.type} /{rt.dst_len} "
                f"oif {rt.oif}"
            )
    return reasons


def remove_all(fx: CaptureEffects) -> None:
    """Delete table, rules and routes, in that order (each idempotent)."""
    res = fx.nft(nftrules.delete_table_commands())
    if res.rc != 0:
        raise NftError(f"nft could not delete table inet aether: {res.error.strip()}")
    for rule in [r for r in fx.rules() if _ours(r)]:
        fx.delete_rule(rule)
    for route in fx.routes(CAPTURE_ROUTE_TABLE):
        fx.delete_route(route)


def _load_table(fx: CaptureEffects, where: str, mode: CaptureMode, ruleset: dict[str, Any]) -> None:
    """A fresh netns (the CNI ADD case): create, deleting nothing; if the table exists: replace it whole."""
    res = fx.nft(nftrules.create_table_commands(ruleset))
    if res.rc != 0:
        res = fx.nft(nftrules.replace_table_commands(ruleset))
    if res.rc != 0:
        why = "; ".join(dict.fromkeys(line.strip() for line in res.error.splitlines() if line.strip()))
        raise CaptureError(f"nft rejected the {mode.value} ruleset for {where} (nothing loaded): {why}")


def _route(fx: CaptureEffects, mode: CaptureMode) -> None:
    """Our ip rule and local route exactly as `mode` wants them: stale rules first, then the divert's own."""
    rules, routes = _wanted(fx.has_ipv6())
    stale = [r for r in fx.rules() if _ours(r) and r not in rules]
    for rule in stale:
        fx.delete_rule(rule)
    if mode is CaptureMode.TPROXY:
        for rule in rules:
            fx.add_rule(rule)
        for route in fx.routes(CAPTURE_ROUTE_TABLE):
            if route not in routes:
                fx.delete_route(route)
        for route in routes:
            fx.replace_route(route)
    else:
        for rule in rules:
            fx.delete_rule(rule)
        for route in fx.routes(CAPTURE_ROUTE_TABLE):
            fx.delete_route(route)


def apply_capture(
    fx: CaptureEffects,
    where: str,
    mode: CaptureMode,
    ports: Mapping[Transport, Sequence[int]],
    inbound: InboundPolicy | None,
) -> None:
    """Make `fx`'s netns (named `where` in errors) hold exactly the capture `mode` asks for: the table, then the
    routing, then a read-back; any failure after the table loaded removes everything (`remove_all`)."""
    _load_table(fx, where, mode, build_ruleset(mode, ports, inbound))
    try:
        _route(fx, mode)
        reasons = drift_reasons(read_state(fx), mode, ports, inbound)
        if reasons:
            raise CaptureError(f"{mode.value} capture in {where} did not load as asked: " + "; ".join(reasons))
    except BaseException as exc:
        try:
            remove_all(fx)
        except (OSError, NftError) as cleanup:
            raise CaptureError(f"{exc}; and the rollback failed too: {cleanup}") from exc
        if isinstance(exc, CaptureError):
            raise
        if isinstance(exc, (OSError, NftError)):
            raise CaptureError(f"installing the {mode.value} capture in {where} failed (rolled back): {exc}") from exc
        raise


def _with_effects(open_effects: Callable[[], CaptureEffects], fn: Callable[[CaptureEffects], T]) -> T:
    fx = open_effects()
    try:
        return fn(fx)
    finally:
        fx.close()


def _in_netns(path: str, open_effects: Callable[[], CaptureEffects], fn: Callable[[CaptureEffects], T]) -> T:
    """`fn` on a thread inside the netns at `path`, with effects opened there, one capture change at a time."""
    with _LOCK:
        return call_in_netns(path, lambda: _with_effects(open_effects, fn))


def _netns_error(path: str, exc: NetnsError) -> CaptureError:
    return CaptureError(exc.strerror or str(exc))


def install_capture(
    netns_path: str | os.PathLike[str],
    mode: CaptureMode = CaptureMode.TPROXY,
    *,
    ports: Mapping[Transport, Sequence[int]] = CAPTURED_PORTS,
    inbound: InboundPolicy | None = None,
    effects: Callable[[], CaptureEffects] = KernelEffects,
) -> None:
    """Make the capture in the netns at `netns_path` exactly `mode` over `ports` (with `inbound`'s enforcement when
    it is STRICT), atomically; raise CaptureError (with nothing left half-installed) when it cannot, or when what
    loaded differs from what was asked. `effects` is opened on the thread inside the netns."""
    path = os.fspath(netns_path)
    mode = CaptureMode(mode)
    try:
        _in_netns(path, effects, lambda fx: apply_capture(fx, path, mode, ports, inbound))
    except NetnsError as exc:
        raise _netns_error(path, exc) from exc
    except NftError as exc:
        raise CaptureError(str(exc)) from exc


def capture_state(
    netns_path: str | os.PathLike[str], *, effects: Callable[[], CaptureEffects] = KernelEffects
) -> CaptureState:
    """What is installed in the netns now (for checks and diagnostics)."""
    path = os.fspath(netns_path)
    try:
        return _in_netns(path, effects, read_state)
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


def remove_capture(
    netns_path: str | os.PathLike[str], *, effects: Callable[[], CaptureEffects] = KernelEffects
) -> bool:
    """Remove table, rule and route; idempotent. A vanished netns is not an error (returns False)."""
    path = os.fspath(netns_path)
    try:
        _in_netns(path, effects, remove_all)
    except NetnsMissing:
        return False
    except NetnsError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise _netns_error(path, exc) from exc
    except (OSError, NftError) as exc:
        raise CaptureError(f"removing the capture from {path} failed: {exc}") from exc
    return True
