"""Inbound, per local pod, bound into its netns on `<podIP>:18008`: TCP h2 mTLS and UDP QUIC mTLS (pure dicts).

Both listeners carry the same DownstreamTlsContext (`tls.downstream_tls`) and the same filter chains:
one chain per application port matched by the SNI `<port>.<sa>.<ns>.<mesh-domain>`, and a catch-all chain to the
primary port. The HCM sets XFCC from the verified client certificate (`SANITIZE_SET`, URI): the app sees the
source's SPIFFE ID and nothing a client wrote itself. Each chain's HCM runs the RBAC filter (no rules of its own)
and takes its route over RDS (`route_configs`, one per app port): where a MeshAuthorizationPolicy guards the port the
route carries the rules (`rbac.py`), so a policy change is a route update. Each request is logged as one JSON object on Envoy's stdout
(`json_log_format`, docs/operations.md#inbound-access-log).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2  # noqa: F401  (registers ExpressionFilter)

from aether.api.naming import quic_sni
from aether.netns.contract import INBOUND_PORT
from aether.xds.identity.sds import ADS
from aether.xds.resources import seconds
from aether.xds.translate.eastwest.plan import EastWestOptions, LocalPod
from aether.xds.translate.eastwest.rbac import ID_PREFIX, RBAC_METADATA, http_filters, per_route
from aether.xds.translate.eastwest.tls import downstream_tls, quic_downstream_socket, tcp_downstream_socket

HCM_NAME: Final = "envoy.filters.network.http_connection_manager"
HCM_TYPE: Final = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
ROUTER: Final[dict[str, Any]] = {
    "name": "envoy.filters.http.router",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
}
TLS_INSPECTOR: Final[dict[str, Any]] = {
    "name": "envoy.filters.listener.tls_inspector",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"},
}
ACCESS_LOG_FORMAT: Final = (
    "%PROTOCOL% %RESPONSE_CODE% %RESPONSE_FLAGS% %REQ(:AUTHORITY)% peer=%DOWNSTREAM_PEER_URI_SAN% "
    "serial=%DOWNSTREAM_PEER_SERIAL% "
    "sni=%REQUESTED_SERVER_NAME% upstream=%UPSTREAM_CLUSTER%\n"
)


def tcp_listener_name(pod: LocalPod) -> str:
    return f"inbound-h2:{pod.namespace}/{pod.name}"


def quic_listener_name(pod: LocalPod) -> str:
    return f"inbound-h3:{pod.namespace}/{pod.name}"


def app_cluster_name(pod: LocalPod, port: int) -> str:
    return f"inbound:{pod.namespace}/{pod.name}:{port}"


STDOUT_LOG_TYPE: Final = "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog"


def json_log_format(pod: LocalPod, port: int) -> dict[str, Any]:
    """One JSON object per request on Envoy's stdout (docs/operations.md#inbound-access-log): who called (the
    verified peer's SPIFFE ID), which Service it asked for (the request's authority, the Service host the source
    dialled), the pod and app port it reached, over which protocol, with which status."""
    return {
        "log": "aether-inbound",
        "time": "%START_TIME%",
        "source": "%DOWNSTREAM_PEER_URI_SAN%",
        "destinationService": "%REQ(:AUTHORITY)%",
        "destinationPod": f"{pod.namespace}/{pod.name}",
        "appPort": port,
        "protocol": "%PROTOCOL%",
        "status": "%RESPONSE_CODE%",
        "responseFlags": "%RESPONSE_FLAGS%",
        "durationMs": "%DURATION%",
        "sni": "%REQUESTED_SERVER_NAME%",
        "peerSerial": "%DOWNSTREAM_PEER_SERIAL%",
        # the RBAC verdict where a policy guards the port (null where none does: any SPIFFE ID of the trust domain)
        "rbac": f"%DYNAMIC_METADATA({RBAC_METADATA}:enforced_engine_result)%",
        "rbacPolicy": f"%DYNAMIC_METADATA({RBAC_METADATA}:enforced_effective_policy_id)%",
        # the identity check every request meets first (rbac.ID_FILTER): "allowed", or "denied" for a certificate
        # without exactly one SPIFFE ID of the trust domain
        "identity": f"%DYNAMIC_METADATA({RBAC_METADATA}:{ID_PREFIX}enforced_engine_result)%",
        "responseCodeDetails": "%RESPONSE_CODE_DETAILS%",
    }


def access_logs(pod: LocalPod, port: int, options: EastWestOptions) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if options.access_log_json:
        out.append(
            {
                "name": "envoy.access_loggers.stdout",
                "typed_config": {"@type": STDOUT_LOG_TYPE, "log_format": {"json_format": json_log_format(pod, port)}},
            }
        )
    return out + file_access_logs(options.access_log_path)


def file_access_logs(path: str | None) -> list[dict[str, Any]]:
    if path is None:
        return []
    return [
        {
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": path,
                "log_format": {"text_format_source": {"inline_string": ACCESS_LOG_FORMAT}},
            },
        }
    ]


CEL_FILTER_TYPE: Final = "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter"


def handshake_log(pod: LocalPod, transport: str) -> dict[str, Any]:
    """The TCP listener's access log: one JSON line per connection refused at the TLS handshake (a CEL filter on
    the transport failure reason), with that reason (`%DOWNSTREAM_TRANSPORT_FAILURE_REASON%`, e.g. the SAN
    mismatch and the SANs). Envoy 1.40 emits no listener access log for a QUIC connection (seen here: not even for
    one that succeeded), so a refused QUIC handshake is only counted: `listener.<pod IP>_18008.ssl.fail_verify_*`
    (shared with TCP) and `...http3.downstream.tx.quic_connection_close_error_code_<QUIC code>`."""
    fmt = {
        "log": "aether-inbound-handshake",
        "time": "%START_TIME%",
        "destinationPod": f"{pod.namespace}/{pod.name}",
        "transport": transport,
        "peer": "%DOWNSTREAM_REMOTE_ADDRESS%",
        "sni": "%REQUESTED_SERVER_NAME%",
        "reason": "%DOWNSTREAM_TRANSPORT_FAILURE_REASON%",
    }
    cel = {"@type": CEL_FILTER_TYPE, "expression": "connection.transport_failure_reason != ''"}
    return {
        "name": "envoy.access_loggers.stdout",
        "filter": {"extension_filter": {"name": "envoy.access_loggers.extension_filters.cel", "typed_config": cel}},
        "typed_config": {"@type": STDOUT_LOG_TYPE, "log_format": {"json_format": fmt}},
    }


def _rds(options: EastWestOptions) -> dict[str, Any]:
    return dict(options.config_source) if options.config_source else dict(ADS)


def route_name(pod: LocalPod, port: int) -> str:
    """The inbound route of one app port (RDS; the same name as its app cluster, another type)."""
    return app_cluster_name(pod, port)


def route_configs(pod: LocalPod, rbac: Mapping[tuple[str, int], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One route config per app port: everything to the app cluster, with the port's RBAC rules where a policy
    guards it (`rbac.inbound_rbac`). Served over RDS: a policy change updates the route, never the listener."""
    out: dict[str, dict[str, Any]] = {}
    for port in pod.app_ports:
        route: dict[str, Any] = {"match": {"prefix": "/"}, "route": {"cluster": app_cluster_name(pod, port)}}
        guard = rbac.get((pod.uid, port))
        if guard is not None:
            route["typed_per_filter_config"] = per_route(guard)
        name = route_name(pod, port)
        out[name] = {"name": name, "virtual_hosts": [{"name": "app", "domains": ["*"], "routes": [route]}]}
    return out


def _hcm(pod: LocalPod, port: int, codec: str, trust_domain: str, options: EastWestOptions) -> dict[str, Any]:
    return {
        "name": HCM_NAME,
        "typed_config": {
            "@type": HCM_TYPE,
            "stat_prefix": f"inbound_{codec.lower()}",
            "codec_type": codec,
            "forward_client_cert_details": "SANITIZE_SET",
            "set_current_client_cert_details": {"uri": True},
            "rds": {"route_config_name": route_name(pod, port), "config_source": _rds(options)},
            "http_filters": [*http_filters(trust_domain), ROUTER],
            "access_log": access_logs(pod, port, options),
        },
    }


def _chains(
    pod: LocalPod,
    codec: str,
    socket: dict[str, Any],
    domains: tuple[str, str],
    options: EastWestOptions,
) -> list[dict[str, Any]]:
    trust_domain, mesh_domain = domains
    chains = [
        {
            "name": f"port-{port}",
            "filter_chain_match": {"server_names": [quic_sni(port, pod.service_account, pod.namespace, mesh_domain)]},
            "filters": [_hcm(pod, port, codec, trust_domain, options)],
            "transport_socket": socket,
        }
        for port in pod.app_ports
    ]
    chains.append(
        {
            "name": "primary",
            "filters": [_hcm(pod, pod.app_ports[0], codec, trust_domain, options)],
            "transport_socket": socket,
        }
    )
    return chains


def _address(pod: LocalPod, protocol: str, ip: str) -> dict[str, Any]:
    return {
        "socket_address": {
            "protocol": protocol,
            "address": ip,
            "port_value": INBOUND_PORT,
            "network_namespace_filepath": pod.netns,
        }
    }


def listeners(
    pod: LocalPod,
    trust_domain: str,
    mesh_domain: str,
    options: EastWestOptions,
) -> dict[str, dict[str, Any]]:
    """The pod's inbound TCP (h2) and QUIC (h3) listeners on `<pod IP>:18008`, one pair per address of the pod: a
    dual-stack pod's IPv6 pair is named `<name>@ipv6` and is otherwise the same (chains, identity, RBAC)."""
    cs = dict(options.config_source) if options.config_source else None
    ctx = downstream_tls(pod.identity, trust_domain, cs)
    names = (trust_domain, mesh_domain)
    h2 = _chains(pod, "HTTP2", tcp_downstream_socket(ctx), names, options)
    h3 = _chains(pod, "HTTP3", quic_downstream_socket(ctx), names, options)
    out: dict[str, dict[str, Any]] = {}
    for ip in pod.addresses:
        suffix = "" if ip == pod.ip else "@ipv6" if ":" in ip else "@ipv4"
        tcp: dict[str, Any] = {
            "name": tcp_listener_name(pod) + suffix,
            "address": _address(pod, "TCP", ip),
            "listener_filters": [TLS_INSPECTOR],
            "access_log": [handshake_log(pod, "TCP")] if options.access_log_json else [],
            "filter_chains": h2,
        }
        quic: dict[str, Any] = {
            "name": quic_listener_name(pod) + suffix,
            "address": _address(pod, "UDP", ip),
            "udp_listener_config": {
                "quic_options": {},
                "downstream_socket_config": {"prefer_gro": options.prefer_gro},
            },
            "filter_chains": h3,
        }
        out[tcp["name"]] = tcp
        out[quic["name"]] = quic
    return out


def app_clusters(pod: LocalPod, options: EastWestOptions) -> dict[str, dict[str, Any]]:
    """One static cluster per application port: the pod's own IP and port, dialled from a socket Envoy makes inside
    the pod's netns (`upstream_bind_config` with the pod's `network_namespace_filepath`, which Envoy 1.40 honours
    for upstream connections: seen here). The hop to the app is then local to the pod and arrives over loopback, so
    STRICT admits it as the proxy's own traffic; it never needs the gateway, which any process on the node can send
    from (docs/operations.md#inbound-enforcement)."""
    out: dict[str, dict[str, Any]] = {}
    bind = {"address": pod.ip, "port_value": 0, "network_namespace_filepath": pod.netns}
    for port in pod.app_ports:
        name = app_cluster_name(pod, port)
        out[name] = {
            "name": name,
            "type": "STATIC",
            "connect_timeout": seconds(options.connect_timeout_s),
            "upstream_bind_config": {"source_address": dict(bind)},
            "load_assignment": {
                "cluster_name": name,
                "endpoints": [
                    {
                        "lb_endpoints": [
                            {"endpoint": {"address": {"socket_address": {"address": pod.ip, "port_value": port}}}}
                        ]
                    }
                ],
            },
        }
    return out
