"""The `gateway-passthrough` gate (pure): a TCP listener on the east-west gateway's port never terminates and never
forwards an SNI nobody exported.

Envoy accepts each of these silently, and each breaks the gateway's promise (docs/architecture.md#the-east-west-gateway):
- a chain with a transport socket terminates TLS there: the destination would see the gateway's certificate (or
  refuse it), and the gateway would hold a key and see plaintext;
- a `default_filter_chain` forwards a connection whose SNI no chain names (or that sent none) somewhere;
- a chain without `server_names` matches every SNI, a default by another name.
"""

from __future__ import annotations

from typing import Any

from aether.netns.contract import EAST_WEST_PORT
from aether.xds.gates.core import GateFailure
from aether.xds.resources import LISTENER, Resources

GATE = "gateway-passthrough"


def _get(d: dict[str, Any], camel: str) -> Any:
    """A field by its proto3-JSON name, or by its proto name (builders may write either)."""
    if camel in d:
        return d[camel]
    return d.get("".join(f"_{c.lower()}" if c.isupper() else c for c in camel))


def _on_gateway_port(listener: dict[str, Any]) -> bool:
    sa = _get(_get(listener, "address") or {}, "socketAddress") or {}
    return (_get(sa, "protocol") or "TCP") == "TCP" and int(_get(sa, "portValue") or 0) == EAST_WEST_PORT


def gateway_passthrough(resources: Resources) -> list[GateFailure]:
    out = []
    for name, listener in sorted(resources.get(LISTENER, {}).items()):
        if not _on_gateway_port(listener):
            continue
        if _get(listener, "defaultFilterChain") is not None:
            out.append(GateFailure(GATE, f"listener {name!r}: a default filter chain forwards an unknown SNI"))
        for i, chain in enumerate(_get(listener, "filterChains") or []):
            label = f"listener {name!r} chain {_get(chain, 'name') or i!r}"
            if _get(chain, "transportSocket") is not None:
                out.append(GateFailure(GATE, f"{label}: a transport socket terminates TLS at the gateway"))
            if not _get(_get(chain, "filterChainMatch") or {}, "serverNames"):
                out.append(GateFailure(GATE, f"{label}: no server_names, so it matches every SNI"))
    return out
