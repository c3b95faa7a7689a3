"""Config the sidecar did not make, in a node's Envoy: a stale route naming clusters the sidecar may refuse.

The routes the sidecar builds name only twins that pass its check, so a real Envoy asks for a failing name only
from other config: a route left from an earlier version, a hand-made one, a proxy that kept old config. A
`stale_listener` is such config, put into a node's bootstrap before its Envoy starts (`MeshNodeProxy.static_listeners`):
a plain HTTP listener on a loopback port of the node netns whose virtual hosts each route (by Host) to one named
cluster, with the sidecar outbound's own `on_demand` filter before the router (`outbound.on_demand_filter`: on-demand
CDS over the same ADS stream, the same timeout), and an access log of what each request got.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple

from aether.testing.envoy import Envoy
from aether.xds.translate.eastwest.inbound import HCM_NAME, HCM_TYPE, ROUTER
from aether.xds.translate.eastwest.outbound import ON_DEMAND_TYPE, on_demand_filter
from aether.xds.translate.eastwest.plan import EastWestOptions

STALE_PORT: Final = 18077  # on 127.0.0.1 of the node netns (nothing of ours listens there)
LISTENER: Final = "stale-routes"
_FILE_LOG: Final = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog"
_FORMAT: Final = "%REQ(:AUTHORITY)% %RESPONSE_CODE% %RESPONSE_FLAGS% %DURATION%\n"


def stale_listener(
    routes: Mapping[str, str], access_log: Path, port: int = STALE_PORT, options: EastWestOptions | None = None
) -> dict[str, Any]:
    """A static listener on 127.0.0.1:`port`: Host -> the cluster its route names (`routes`)."""
    vhosts = [
        {"name": host, "domains": [host], "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}]}
        for host, cluster in sorted(routes.items())
    ]
    log = {"path": str(access_log), "log_format": {"text_format_source": {"inline_string": _FORMAT}}}
    hcm = {
        "@type": HCM_TYPE,
        "stat_prefix": "stale_routes",
        "codec_type": "AUTO",
        # a bootstrap route config checks its clusters at load by default: these exist only on demand (or never)
        "route_config": {"name": LISTENER, "validate_clusters": False, "virtual_hosts": vhosts},
        "http_filters": [on_demand_filter(options or EastWestOptions()), ROUTER],
        "access_log": [{"name": "envoy.access_loggers.file", "typed_config": {"@type": _FILE_LOG, **log}}],
    }
    return {
        "name": LISTENER,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{"name": HCM_NAME, "typed_config": hcm}]}],
    }


class Served(NamedTuple):
    """One access log line of the stale listener."""

    host: str
    status: int
    flags: str  # Envoy's response flags (`NC`: no cluster)
    duration_ms: int  # Envoy's own time for the request


def served(access_log: Path) -> list[Served]:
    if not access_log.exists():
        return []
    out = []
    for line in access_log.read_text().splitlines():
        host, status, flags, ms = line.split()
        out.append(Served(host, int(status), flags, int(ms)))
    return out


def _walk(x: Any) -> Iterator[dict[str, Any]]:
    if isinstance(x, dict):
        yield x
        for v in x.values():
            yield from _walk(v)
    elif isinstance(x, list):
        for v in x:
            yield from _walk(v)


def odcds_timeouts(envoy: Envoy) -> dict[str, float]:
    """Listener name -> the on-demand CDS timeout (s) of its `on_demand` filter, for every static and active
    dynamic listener of `envoy` that has one (read from its config dump: what Envoy runs)."""
    out: dict[str, float] = {}
    for section, key in (("static_listeners", "listener"), ("dynamic_listeners", "active_state")):
        for entry in envoy.config_dump(section).get("configs", []):
            listener = entry.get(key) or {}
            listener = listener.get("listener", listener)
            for d in _walk(listener):
                if d.get("@type") == ON_DEMAND_TYPE and "odcds" in d:
                    out[listener["name"]] = float(str(d["odcds"]["timeout"]).removesuffix("s"))
    return out
