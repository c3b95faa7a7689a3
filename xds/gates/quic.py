"""Our own gates for the east-west QUIC path, run on the merged translation before anything is served (pure).

Each guards a failure Envoy accepts silently:
- R4 `quic-no-resumption`: every mTLS QUIC chain writes `enable_early_data: false` and `enable_resumption: false`.
  QUIC never re-verifies a client certificate on a resumed session, and an absent field is a default that moves.
- `tcp-no-resumption`: every mTLS TCP chain (a DownstreamTlsContext requiring a client certificate) writes
  `disable_stateless_session_resumption: true` and `disable_stateful_session_resumption: true`. A resumed TLS
  session presents no certificate: with tickets (TLS 1.3, 48 h by default) or the session cache (TLS 1.2) a
  client keeps the identity it once proved past its SVID's expiry (`tests/xds/test_inbound_tls.py` shows it).
- R5 `classes-separated`: the plaintext UDP class (udp_proxy) and the QUIC class never share a port, and each
  sits on its own role's port (plaintext on 18082, QUIC on 18008/18009), so a datagram is told apart by port
  before any matcher runs. The gateway's QUIC passthrough (udp_proxy behind the `aether_quic_sni` module, which
  opens a session only for a QUIC Initial naming an exported SNI) is of the QUIC class.
- `identity-hashable`: every stamped source identity that an upstream pool partitions on is made by
  `envoy.hashable_string` and shared with the upstream. With `envoy.string` the pool is not partitioned and a
  second source's requests ride the first source's connection, arriving as the first source.
- `twin-per-identity`: no two source identities select the same twin (each twin carries one source's SVID).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from aether.netns.contract import EAST_WEST_PORT, INBOUND_PORT, L4_OUTBOUND_PORT
from aether.xds.gates.authz import rbac_enforced
from aether.xds.gates.core import GateFailure
from aether.xds.gates.gateway import gateway_passthrough, sni_module_first
from aether.xds.resources import LISTENER, ROUTE, Resources
from aether.xds.translate.eastwest.outbound import CLUSTER_ACTION_TYPE, MATCHER_SPECIFIER_TYPE, SET_FILTER_STATE_TYPE
from aether.xds.translate.eastwest.tls import DOWNSTREAM_TLS, HASHABLE_FACTORY, IDENTITY_KEY, QUIC_DOWNSTREAM

UDP_PROXY_FILTER: Final = "envoy.filters.udp_listener.udp_proxy"
QUIC_PORTS: Final = frozenset({INBOUND_PORT, EAST_WEST_PORT})
PLAINTEXT_UDP_PORTS: Final = frozenset({L4_OUTBOUND_PORT})


def _find(obj: Any, type_url: str) -> Iterator[dict[str, Any]]:
    """Every dict with `"@type": type_url` anywhere inside `obj`."""
    if isinstance(obj, dict):
        if obj.get("@type") == type_url:
            yield obj
        for v in obj.values():
            yield from _find(v, type_url)
    elif isinstance(obj, list):
        for v in obj:
            yield from _find(v, type_url)


def _get(d: dict[str, Any], camel: str) -> Any:
    """A field by its proto3-JSON name, or by its proto name (builders may write either)."""
    if camel in d:
        return d[camel]
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
    return d.get(snake)


def quic_no_resumption(resources: Resources) -> list[GateFailure]:
    out = []
    for name, listener in sorted(resources.get(LISTENER, {}).items()):
        for i, chain in enumerate(_get(listener, "filterChains") or []):
            for qt in _find(chain, QUIC_DOWNSTREAM):
                tls = _get(qt, "downstreamTlsContext") or {}
                if not _get(tls, "requireClientCertificate"):
                    continue
                missing = [f for f in ("enableEarlyData", "enableResumption") if _get(qt, f) is not False]
                if missing:
                    out.append(
                        GateFailure(
                            "quic-no-resumption",
                            f"listener {name!r} chain {i}: mTLS QUIC without explicit false for {missing} (R4)",
                        )
                    )
    return out


def tcp_no_resumption(resources: Resources) -> list[GateFailure]:
    out = []
    for name, listener in sorted(resources.get(LISTENER, {}).items()):
        for i, chain in enumerate(_get(listener, "filterChains") or []):
            for ctx in _find(chain, DOWNSTREAM_TLS):
                if not _get(ctx, "requireClientCertificate"):
                    continue
                fields = ("disableStatelessSessionResumption", "disableStatefulSessionResumption")
                missing = [f for f in fields if _get(ctx, f) is not True]
                if missing:
                    out.append(
                        GateFailure(
                            "tcp-no-resumption",
                            f"listener {name!r} chain {i}: mTLS TCP without {missing} true (a resumed session "
                            "presents no certificate)",
                        )
                    )
    return out


def _udp_class(listener: dict[str, Any]) -> tuple[int, str] | None:
    sa = _get(_get(listener, "address") or {}, "socketAddress") or {}
    if _get(sa, "protocol") != "UDP":
        return None
    port = int(_get(sa, "portValue") or 0)
    udp_cfg = _get(listener, "udpListenerConfig") or {}
    is_quic = _get(udp_cfg, "quicOptions") is not None or any(True for _ in _find(listener, QUIC_DOWNSTREAM))
    is_plain = any(_get(f, "name") == UDP_PROXY_FILTER for f in _get(listener, "listenerFilters") or [])
    if is_plain and sni_module_first(listener):
        return port, "quic"  # the gateway's QUIC passthrough: only QUIC Initials of an exported SNI open a session
    if is_quic and is_plain:
        return port, "both"
    return (port, "quic") if is_quic else (port, "plaintext") if is_plain else None


def classes_separated(resources: Resources) -> list[GateFailure]:
    out = []
    by_port: dict[int, dict[str, list[str]]] = {}
    for name, listener in sorted(resources.get(LISTENER, {}).items()):
        cls = _udp_class(listener)
        if cls is None:
            continue
        port, kind = cls
        if kind == "both":
            out.append(GateFailure("classes-separated", f"listener {name!r} carries udp_proxy and QUIC (R5)"))
            continue
        by_port.setdefault(port, {}).setdefault(kind, []).append(name)
        allowed = QUIC_PORTS if kind == "quic" else PLAINTEXT_UDP_PORTS
        if port not in allowed:
            out.append(
                GateFailure(
                    "classes-separated", f"{kind} listener {name!r} on UDP {port}, not its role's {sorted(allowed)}"
                )
            )
    for port, kinds in sorted(by_port.items()):
        if len(kinds) > 1:
            out.append(GateFailure("classes-separated", f"UDP {port} carries both classes: {kinds} (R5)"))
    return out


def identity_hashable(resources: Resources) -> list[GateFailure]:
    out = []
    for name, listener in sorted(resources.get(LISTENER, {}).items()):
        for cfg in _find(listener, SET_FILTER_STATE_TYPE):
            for value in _get(cfg, "onNewConnection") or []:
                if _get(value, "objectKey") != IDENTITY_KEY:
                    continue
                factory = _get(value, "factoryKey")
                if factory != HASHABLE_FACTORY:
                    out.append(
                        GateFailure(
                            "identity-hashable",
                            f"listener {name!r} stamps {IDENTITY_KEY} with factory {factory!r}, not "
                            f"{HASHABLE_FACTORY!r}: upstream pools would not partition by source",
                        )
                    )
                if _get(value, "sharedWithUpstream") not in ("ONCE", "TRANSITIVE"):
                    out.append(
                        GateFailure("identity-hashable", f"listener {name!r}: {IDENTITY_KEY} not shared with upstream")
                    )
    return out


def twin_per_identity(resources: Resources) -> list[GateFailure]:
    out = []
    for rname, rc in sorted(resources.get(ROUTE, {}).items()):
        for spec in _find(rc, MATCHER_SPECIFIER_TYPE):
            tree = _get(_get(spec, "clusterMatcher") or {}, "matcherTree") or {}
            arms = _get(_get(tree, "exactMatchMap") or {}, "map") or {}
            seen: dict[str, str] = {}
            for ident, arm in sorted(arms.items()):
                cluster = next((_get(a, "cluster") for a in _find(arm, CLUSTER_ACTION_TYPE)), None)
                if cluster is None:
                    continue
                if cluster in seen:
                    out.append(
                        GateFailure(
                            "twin-per-identity",
                            f"route {rname!r}: {seen[cluster]} and {ident} both select {cluster!r}",
                        )
                    )
                seen[cluster] = ident
    return out


def run_quic_gates(resources: Resources) -> list[GateFailure]:
    """All east-west gates; an empty list means the state may be served."""
    return [
        *quic_no_resumption(resources),
        *tcp_no_resumption(resources),
        *classes_separated(resources),
        *identity_hashable(resources),
        *twin_per_identity(resources),
        *rbac_enforced(resources),  # aether.xds.gates.authz: policies' rules are enforced where they are served
        *gateway_passthrough(resources),  # aether.xds.gates.gateway: TCP 18009 never terminates, never defaults
    ]
