"""The `gateway-passthrough` gate (pure): a TCP or UDP listener on the east-west gateway's port never terminates
and never forwards an SNI nobody exported.

Envoy accepts each of these silently, and each breaks the gateway's promise (docs/architecture.md#the-east-west-gateway):
- a chain with a transport socket terminates TLS there: the destination would see the gateway's certificate (or
  refuse it), and the gateway would hold a key and see plaintext;
- a `default_filter_chain` forwards a connection whose SNI no chain names (or that sent none) somewhere;
- a chain without `server_names` matches every SNI, a default by another name;
- a UDP listener with `quic_options` terminates QUIC there (an Envoy QUIC listener always does);
- a UDP listener whose first listener filter is not the `aether_quic_sni` module forwards every datagram,
  whatever SNI its connection names (a default).
"""

from __future__ import annotations

from typing import Any

from aether.netns.contract import EAST_WEST_PORT
from aether.xds.gates.core import GateFailure
from aether.xds.resources import LISTENER, Resources
from aether.xds.translate.eastwest.gateway_quic import MODULE as QUIC_SNI

GATE = "gateway-passthrough"


def _get(d: dict[str, Any], camel: str) -> Any:
    """A field by its proto3-JSON name, or by its proto name (builders may write either)."""
    if camel in d:
        return d[camel]
    return d.get("".join(f"_{c.lower()}" if c.isupper() else c for c in camel))


def _on_gateway_port(listener: dict[str, Any], protocol: str = "TCP") -> bool:
    sa = _get(_get(listener, "address") or {}, "socketAddress") or {}
    return (_get(sa, "protocol") or "TCP") == protocol and int(_get(sa, "portValue") or 0) == EAST_WEST_PORT


def sni_module_first(listener: dict[str, Any]) -> bool:
    """The listener's first listener filter is the QUIC SNI module (the gateway's UDP passthrough)."""
    filters = _get(listener, "listenerFilters") or [{}]
    typed = _get(filters[0], "typedConfig") or {}
    module = _get(typed, "dynamicModuleConfig") or {}
    return str(typed.get("@type", "")).endswith(".DynamicModuleUdpListenerFilter") and module.get("name") == QUIC_SNI


def _udp_failures(name: str, listener: dict[str, Any]) -> list[GateFailure]:
    out = []
    if _get(_get(listener, "udpListenerConfig") or {}, "quicOptions") is not None:
        out.append(GateFailure(GATE, f"listener {name!r}: quic_options terminates QUIC at the gateway"))
    if not sni_module_first(listener):
        out.append(GateFailure(GATE, f"listener {name!r}: not the {QUIC_SNI} module first, so every SNI passes"))
    return out


def gateway_passthrough(resources: Resources) -> list[GateFailure]:
    out: list[GateFailure] = []
    for name, listener in sorted(resources.get(LISTENER, {}).items()):
        if _on_gateway_port(listener, "UDP"):
            out += _udp_failures(name, listener)
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
