"""The extra h3 arms of `bench.quic_cpu` (`--variant LABEL=JSON`) and the resource patches they apply.

Each patch takes the builders' resources and returns a changed copy; nothing here is served outside the bench.
"""

from __future__ import annotations

import argparse
import copy
import json
from dataclasses import dataclass
from typing import Any

from aether.xds.resources import LISTENER, ROUTE, Resources

# Holds each response until it is complete (Lua `body()`), so node B's QUIC stream gets headers, then body + FIN
# back to back instead of a separate FIN-only write (3 -> 2 datagrams per response with this app).
RESPONSE_BUFFER: dict[str, Any] = {
    "name": "envoy.filters.http.lua",
    "typedConfig": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
        "defaultSourceCode": {"inlineString": "function envoy_on_response(handle)\n  handle:body()\nend\n"},
    },
}


# The same hold in C++: the file-system buffer filter fully buffering responses (in memory below its limit).
FS_RESPONSE_BUFFER: dict[str, Any] = {
    "name": "envoy.filters.http.file_system_buffer",
    "typedConfig": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.file_system_buffer.v3.FileSystemBufferFilterConfig",
        "managerConfig": {"threadPool": {"threadCount": 1}},
        "request": {"behavior": {"bypass": {}}},
        "response": {"behavior": {"fullyBuffer": {}}},
    },
}
BUFFERS = {"lua": RESPONSE_BUFFER, "fs": FS_RESPONSE_BUFFER}


def buffer_quic_responses(res: Resources, kind: str = "lua") -> Resources:
    """`res` with a response buffer (BUFFERS[kind]) before the router in every HCM of the inbound QUIC listeners
    (a copy)."""
    out = copy.deepcopy(res)
    for name, listener in out[LISTENER].items():
        if not name.startswith("inbound-h3:"):
            continue
        for chain in listener["filterChains"]:
            for f in chain["filters"]:
                filters = f["typedConfig"]["httpFilters"]
                filters.insert(len(filters) - 1, copy.deepcopy(BUFFERS[kind]))
    return out


@dataclass(frozen=True)
class Variant:
    label: str
    quic: dict[str, Any]
    h3: dict[str, Any]
    runtime: dict[str, tuple[str, str]]  # key -> (variant value, baseline value)
    dest_buffer: str = ""  # node B: buffer_quic_responses(kind) ("lua", "fs"; a listener update, then a drain wait)
    dest_udp: str = ""  # node B: JSON deep-merged into the inbound QUIC listeners' udpListenerConfig
    src_direct: bool = False  # node A: the route names the twin (no MatcherClusterSpecifier)


def parse_variant(text: str) -> Variant:
    label, sep, spec = text.partition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"--variant wants LABEL=JSON, got {text!r}")
    data = json.loads(spec)
    unknown = set(data) - {"quic", "h3", "runtime", "dest_buffer", "dest_udp", "src_direct"}
    if unknown:
        raise argparse.ArgumentTypeError(f"--variant {label}: unknown keys {sorted(unknown)}")
    rt = {k: (_rt(v[0]), _rt(v[1])) for k, v in data.get("runtime", {}).items()}
    udp = json.dumps(data["dest_udp"], sort_keys=True) if data.get("dest_udp") else ""
    buffer = _buffer_kind(data.get("dest_buffer"))
    return Variant(
        label, dict(data.get("quic", {})), dict(data.get("h3", {})), rt, buffer, udp, bool(data.get("src_direct"))
    )


def _deep_merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _deep_merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


def patch_quic_listeners(res: Resources, udp_json: str) -> Resources:
    """`res` with `udp_json` deep-merged into every inbound QUIC listener's udpListenerConfig (a copy)."""
    out = copy.deepcopy(res)
    for name, listener in out[LISTENER].items():
        if name.startswith("inbound-h3:"):
            _deep_merge(listener["udpListenerConfig"], json.loads(udp_json))
    return out


def route_twins_directly(res: Resources) -> Resources:
    """`res` with each route that picks a twin through the matcher naming the (single) twin instead (a copy)."""
    out = copy.deepcopy(res)
    for rc in out.get(ROUTE, {}).values():
        for vh in rc["virtualHosts"]:
            for r in vh["routes"]:
                plugin = r["route"].get("inlineClusterSpecifierPlugin")
                if plugin:
                    arms = plugin["extension"]["typedConfig"]["clusterMatcher"]["matcherTree"]["exactMatchMap"]["map"]
                    (arm,) = arms.values()
                    r["route"] = {"cluster": arm["action"]["typedConfig"]["cluster"]}
    return out


def _buffer_kind(value: object) -> str:
    kind = "lua" if value is True else (value or "")
    if kind and kind not in BUFFERS:
        raise argparse.ArgumentTypeError(f"dest_buffer: one of {sorted(BUFFERS)} or true (lua), got {value!r}")
    return str(kind)


def _rt(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
