"""Envoy bootstraps: the node's ADS bootstrap (points delta ADS at the sidecar) and, for `--mode validate`
tests, a static bootstrap holding rendered resources."""

from __future__ import annotations

from typing import Any, Final

from aether.api.addresses import parse_addr
from aether.xds.resources import CLUSTER, ENDPOINT, LISTENER, ResourceDict, Resources

XDS_CLUSTER: Final = "aether-xds"
# The sidecar's delta-ADS address, a unix socket (mode 0600): the stream carries SDS, every local workload's private
# key. The DaemonSet passes the same path (deploy/node/daemonset.yaml, an emptyDir shared by sidecar and Envoy only).
DEFAULT_XDS_ADDR: Final = "unix:/run/aether-xds/ads.sock"
# Envoy's allocator (Google's tcmalloc) keeps the pages it frees: without a release rate its RSS only ever rises to
# the largest heap it has held (the soak: RSS up 60-400 KiB a minute while the heap in use stayed flat). With
# `memory_allocator_manager.bytes_to_release` set, Envoy starts tcmalloc's background thread (TcmallocProcess...),
# which hands free pages back to the kernel at up to this many bytes a second (Envoy 1.40 logs "Configured tcmalloc
# with background release rate: N bytes per second"; the interval field is not used with this allocator).
RELEASE_BYTES_PER_S: Final = 1 << 20
HTTP_PROTOCOL_OPTIONS: Final = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def _address(addr: str) -> dict[str, Any]:
    parsed = parse_addr(addr)
    if isinstance(parsed, str):
        return {"pipe": {"path": parsed}}
    return {"socket_address": {"address": parsed[0], "port_value": parsed[1]}}


def ads_bootstrap(
    node_id: str, xds_addr: str = DEFAULT_XDS_ADDR, admin_addr: str = "127.0.0.1:19000"
) -> dict[str, Any]:
    """The bootstrap a node's Envoy runs with: LDS and CDS (EDS through CDS) over delta ADS."""
    ads = {"ads": {}, "resource_api_version": "V3"}
    return {
        "node": {"id": node_id, "cluster": "aether"},
        "admin": {"address": _address(admin_addr)},
        "memory_allocator_manager": {"bytes_to_release": RELEASE_BYTES_PER_S},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC",
                "transport_api_version": "V3",
                "grpc_services": [
                    {
                        "envoy_grpc": {
                            "cluster_name": XDS_CLUSTER,
                            # reconnect fast after a sidecar restart (Envoy's default backoff reached 12 s here)
                            "retry_policy": {"retry_back_off": {"base_interval": "0.25s", "max_interval": "2s"}},
                        }
                    }
                ],
                "set_node_on_first_message_only": True,
            },
            "cds_config": ads,
            "lds_config": ads,
        },
        "static_resources": {
            "clusters": [
                {
                    "name": XDS_CLUSTER,
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": HTTP_PROTOCOL_OPTIONS,
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                    "load_assignment": {
                        "cluster_name": XDS_CLUSTER,
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(xds_addr)}}]}],
                    },
                }
            ]
        },
    }


def static_bootstrap(node_id: str, resources: Resources, admin_addr: str = "127.0.0.1:19000") -> dict[str, Any]:
    """Rendered resources as a static bootstrap (for `envoy --mode validate`): listeners as they are; each EDS
    cluster becomes STATIC with its rendered load assignment inline, so both shapes are validated."""
    clas = resources.get(ENDPOINT, {})
    clusters: list[ResourceDict] = []
    for name, cluster in sorted(resources.get(CLUSTER, {}).items()):
        if cluster.get("type") == "EDS":
            cluster = {k: v for k, v in cluster.items() if k != "edsClusterConfig"}
            cluster["type"] = "STATIC"
            cluster["loadAssignment"] = clas.get(name, {"clusterName": name})
        clusters.append(cluster)
    return {
        "node": {"id": node_id, "cluster": "aether"},
        "admin": {"address": _address(admin_addr)},
        "static_resources": {
            "listeners": [v for _, v in sorted(resources.get(LISTENER, {}).items())],
            "clusters": clusters,
        },
    }
