"""`rbac-enforced`: where authorization rules are served, an RBAC filter runs them (pure gate).

A MeshAuthorizationPolicy's rules ride on the inbound routes (`RBACPerRoute`, `aether.xds.translate.eastwest.rbac`).
Envoy accepts such a route whatever the connection manager's filter chain holds: without `envoy.filters.http.rbac`
before the router the rules are ignored and every caller gets through (`tests/xds/test_inbound_authz.py` shows it
on the real data path). So this gate refuses a state where
- an inbound connection manager (on a listener named `inbound-...`) lacks the RBAC filter before the router (a
  policy added later would be a route change that enforces nothing), or
- any connection manager whose route carries RBAC rules lacks it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from aether.xds.gates.core import GateFailure
from aether.xds.resources import LISTENER, ROUTE, Resources
from aether.xds.translate.eastwest.rbac import RBAC_FILTER

ROUTER: Final = "envoy.filters.http.router"
HCM_TYPE: Final = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)


def _hcms(listener: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    for i, chain in enumerate(listener.get("filterChains") or []):
        for f in chain.get("filters") or []:
            cfg = f.get("typedConfig") or {}
            if cfg.get("@type") == HCM_TYPE:
                yield i, cfg


def _guarded_routes(resources: Resources) -> set[str]:
    out = set()
    for name, rc in resources.get(ROUTE, {}).items():
        for vh in rc.get("virtualHosts") or []:
            if RBAC_FILTER in (vh.get("typedPerFilterConfig") or {}) or any(
                RBAC_FILTER in (r.get("typedPerFilterConfig") or {}) for r in vh.get("routes") or []
            ):
                out.add(name)
    return out


def _enforces(hcm: dict[str, Any]) -> bool:
    names = [f.get("name") for f in hcm.get("httpFilters") or []]
    return RBAC_FILTER in names and ROUTER in names and names.index(RBAC_FILTER) < names.index(ROUTER)


def rbac_enforced(resources: Resources) -> list[GateFailure]:
    guarded = _guarded_routes(resources)
    out = []
    for name, listener in sorted(resources.get(LISTENER, {}).items()):
        for i, hcm in _hcms(listener):
            route = ((hcm.get("rds") or {}).get("routeConfigName")) or (hcm.get("routeConfig") or {}).get("name")
            if _enforces(hcm):
                continue
            if name.startswith("inbound-"):
                why = "an inbound connection manager without the RBAC filter before the router"
            elif route in guarded:
                why = (
                    f"its route {route!r} carries RBAC rules but the connection manager runs no RBAC filter before them"
                )
            else:
                continue
            out.append(GateFailure("rbac-enforced", f"listener {name!r} chain {i}: {why} (policies would not apply)"))
    return out
