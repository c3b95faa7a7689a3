"""The repo's Envoy dynamic modules (envoy-modules/, Rust) for tests: built once with cargo, found by directory.

Envoy loads a module by name from `ENVOY_DYNAMIC_MODULES_SEARCH_PATH` (`lib<name>.so`): a test sets it to
`build()`'s answer before it starts Envoy."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKSPACE = ROOT / "envoy-modules"
RELEASE = WORKSPACE / "target" / "release"
QUIC_SNI = "aether_quic_sni"
LB_POLICY = "envoy.load_balancing_policies.dynamic_modules"


def cargo() -> str:
    found = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    if not Path(found).is_file():
        raise RuntimeError("cargo is needed to build envoy-modules/ (rustup's stable toolchain)")
    return found


def build() -> Path:
    """`cargo build --release --locked` (a no-op when up to date); returns the directory holding the modules."""
    subprocess.run([cargo(), "build", "--release", "--locked", "-q"], cwd=WORKSPACE, check=True, timeout=600)
    if not (RELEASE / f"lib{QUIC_SNI}.so").is_file():
        raise RuntimeError(f"cargo built no lib{QUIC_SNI}.so in {RELEASE}")
    return RELEASE


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def gateway_bootstrap(
    admin: Path, gateway_port: int, server_port: int, exported: Sequence[str], *, with_module: bool = True
) -> dict[str, Any]:
    """A static Envoy bootstrap: a UDP listener on 127.0.0.1:`gateway_port` with the `aether_quic_sni` filter
    (exporting `exported`) before `udp_proxy` to one cluster at 127.0.0.1:`server_port`; `with_module=False` is
    the same listener with `udp_proxy` alone (the control for cost)."""
    module = {
        "name": "quic_sni",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.udp.dynamic_modules.v3.DynamicModuleUdpListenerFilter",
            "dynamic_module_config": {"name": QUIC_SNI},
            "filter_name": "quic_sni",
            "filter_config": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": ",".join(exported)},
        },
    }
    route = {"@type": "type.googleapis.com/envoy.extensions.filters.udp.udp_proxy.v3.Route", "cluster": "dest"}
    proxy = {
        "name": "envoy.filters.udp_listener.udp_proxy",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.udp.udp_proxy.v3.UdpProxyConfig",
            "stat_prefix": "gw",
            "matcher": {"on_no_match": {"action": {"name": "route", "typed_config": route}}},
        },
    }
    udp = {"protocol": "UDP", "address": "127.0.0.1"}
    endpoint = {"endpoint": {"address": {"socket_address": {**udp, "port_value": server_port}}}}
    return {
        "admin": {"address": {"pipe": {"path": str(admin)}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "gw-udp",
                    "address": {"socket_address": {**udp, "port_value": gateway_port}},
                    "listener_filters": [module, proxy] if with_module else [proxy],
                }
            ],
            "clusters": [
                {
                    "name": "dest",
                    "type": "STATIC",
                    "load_assignment": {"cluster_name": "dest", "endpoints": [{"lb_endpoints": [endpoint]}]},
                }
            ],
        },
    }


def per_sni_gateway_bootstrap(admin: Path, gateway_port: int, servers: dict[str, int]) -> dict[str, Any]:
    """The gateway with per-SNI endpoints: the filter exports `servers`' SNIs, `udp_proxy` routes to one cluster
    whose load balancer is the module's (`lb_policy_name: quic_sni`), and each endpoint 127.0.0.1:`port` carries the
    SNI it serves in `filter_metadata["aether.quic_sni"]["sni"]`."""
    boot = gateway_bootstrap(admin, gateway_port, 0, sorted(servers))
    cluster = boot["static_resources"]["clusters"][0]
    cluster["load_assignment"]["endpoints"] = [
        {
            "lb_endpoints": [
                {
                    "endpoint": {
                        "address": {"socket_address": {"protocol": "UDP", "address": "127.0.0.1", "port_value": port}}
                    },
                    "metadata": {"filter_metadata": {"aether.quic_sni": {"sni": sni}}},
                }
                for sni, port in sorted(servers.items())
            ]
        }
    ]
    lb = "type.googleapis.com/envoy.extensions.load_balancing_policies.dynamic_modules.v3.DynamicModulesLoadBalancerConfig"
    cluster["load_balancing_policy"] = {
        "policies": [
            {
                "typed_extension_config": {
                    "name": LB_POLICY,
                    "typed_config": {
                        "@type": lb,
                        "dynamic_module_config": {"name": QUIC_SNI},
                        "lb_policy_name": "quic_sni",
                    },
                }
            }
        ]
    }
    return boot
