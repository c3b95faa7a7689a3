"""TLS contexts of the east-west path (pure dicts): inbound, the h2 client with the per-source selector, the QUIC
client per source.

Identity lives in one filter-state key, `envoy.tls.certificate_mappers.on_demand_secret`, whose value is the
source's SPIFFE ID, which is also the name of its SVID's SDS secret (`aether.xds.identity.svid`). It must be made by
the `envoy.hashable_string` factory: the upstream transport folds hashable shared objects into the connection-pool
key, so pools partition per source. With `envoy.string` two sources share one pool, and the second source's
requests ride the first source's connection and arrive as the first source: seen here on Envoy 1.40, and kept as
the negative control of the `identity-hashable` gate (`tests/xds/test_quic_datapath.py`).
"""

from __future__ import annotations

from typing import Any, Final

from aether.xds.identity.sds import sds_ref
from aether.xds.identity.svid import bundle_secret_name, svid_secret_name
from aether.xds.resources import TYPE_URL_PREFIX

IDENTITY_KEY: Final = "envoy.tls.certificate_mappers.on_demand_secret"
HASHABLE_FACTORY: Final = "envoy.hashable_string"
TLS_SOCKET: Final = "envoy.transport_sockets.tls"
QUIC_SOCKET: Final = "envoy.transport_sockets.quic"
DOWNSTREAM_TLS: Final = TYPE_URL_PREFIX + "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
UPSTREAM_TLS: Final = TYPE_URL_PREFIX + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
QUIC_DOWNSTREAM: Final = TYPE_URL_PREFIX + "envoy.extensions.transport_sockets.quic.v3.QuicDownstreamTransport"
QUIC_UPSTREAM: Final = TYPE_URL_PREFIX + "envoy.extensions.transport_sockets.quic.v3.QuicUpstreamTransport"
ON_DEMAND_SELECTOR: Final = "envoy.tls.certificate_selectors.on_demand_secret"
ON_DEMAND_SELECTOR_TYPE: Final = (
    TYPE_URL_PREFIX + "envoy.extensions.transport_sockets.tls.cert_selectors.on_demand_secret.v3.Config"
)
FILTER_STATE_MAPPER: Final = "envoy.tls.upstream_certificate_mappers.filter_state_override"
FILTER_STATE_MAPPER_TYPE: Final = (
    TYPE_URL_PREFIX + "envoy.extensions.transport_sockets.tls.cert_mappers.filter_state_override.v3.Config"
)
# The mapper's fallback when no identity was stamped: a secret the sidecar never serves, so such a handshake
# cannot pick up any workload's certificate (fails closed).
NO_IDENTITY_SECRET: Final = "aether:no-source-identity"


def validation(
    trust_domain: str, san_uris: list[dict[str, str]], config_source: dict[str, Any] | None
) -> dict[str, Any]:
    """CA bundle from SDS, SAN matchers on URI SANs (e.g. `{"prefix": "spiffe://td/"}` or `{"exact": id}`)."""
    return {
        "default_validation_context": {
            "match_typed_subject_alt_names": [{"san_type": "URI", "matcher": m} for m in san_uris]
        },
        "validation_context_sds_secret_config": sds_ref(bundle_secret_name(trust_domain), config_source),
    }


def downstream_tls(server_identity: str, trust_domain: str, config_source: dict[str, Any] | None) -> dict[str, Any]:
    """The inbound's one DownstreamTlsContext, shared by the TCP h2 and the QUIC listener: this pod's SVID, a
    client certificate required, the peer's URI SAN in the mesh trust domain."""
    return {
        "@type": DOWNSTREAM_TLS,
        "require_client_certificate": True,
        "common_tls_context": {
            "tls_certificate_sds_secret_configs": [sds_ref(svid_secret_name(server_identity), config_source)],
            "combined_validation_context": validation(
                trust_domain, [{"prefix": f"spiffe://{trust_domain}/"}], config_source
            ),
        },
    }


def tcp_downstream_socket(ctx: dict[str, Any]) -> dict[str, Any]:
    """The TCP inbound: no session resumption of either kind (a resumed session presents no client certificate, so
    a ticket would outlive the SVID that earned it; `aether.xds.gates.quic.tcp_no_resumption`), ALPN h2 (the HCM
    speaks HTTP/2 only)."""
    typed = {
        **ctx,
        "common_tls_context": {**ctx["common_tls_context"], "alpn_protocols": ["h2"]},
        "disable_stateless_session_resumption": True,
        "disable_stateful_session_resumption": True,
    }
    return {"name": TLS_SOCKET, "typed_config": typed}


def quic_downstream_socket(ctx: dict[str, Any]) -> dict[str, Any]:
    """R4: early data and resumption written explicitly false (QUIC never re-verifies a resumed client)."""
    return {
        "name": QUIC_SOCKET,
        "typed_config": {
            "@type": QUIC_DOWNSTREAM,
            "downstream_tls_context": {k: v for k, v in ctx.items() if k != "@type"},
            "enable_early_data": False,
            "enable_resumption": False,
        },
    }


def h2_upstream_socket(
    sni: str, dest_identity: str, trust_domain: str, config_source: dict[str, Any] | None
) -> dict[str, Any]:
    """One TLS context for every source: the certificate is chosen per connection from the stamped identity."""
    return {
        "name": TLS_SOCKET,
        "typed_config": {
            "@type": UPSTREAM_TLS,
            "sni": sni,
            "common_tls_context": {
                "alpn_protocols": ["h2"],
                "custom_tls_certificate_selector": {
                    "name": ON_DEMAND_SELECTOR,
                    "typed_config": {
                        "@type": ON_DEMAND_SELECTOR_TYPE,
                        "config_source": dict(config_source or {"ads": {}, "resource_api_version": "V3"}),
                        "certificate_mapper": {
                            "name": FILTER_STATE_MAPPER,
                            "typed_config": {"@type": FILTER_STATE_MAPPER_TYPE, "default_value": NO_IDENTITY_SECRET},
                        },
                    },
                },
                "combined_validation_context": validation(trust_domain, [{"exact": dest_identity}], config_source),
            },
        },
    }


def quic_upstream_socket(
    sni: str, source_identity: str, dest_identity: str, trust_domain: str, config_source: dict[str, Any] | None
) -> dict[str, Any]:
    """A twin's transport: the source's own SVID (QUIC rejects the certificate selector), SNI from the destination's
    ServiceAccount, the destination's SPIFFE ID pinned."""
    return {
        "name": QUIC_SOCKET,
        "typed_config": {
            "@type": QUIC_UPSTREAM,
            "upstream_tls_context": {
                "sni": sni,
                "common_tls_context": {
                    "tls_certificate_sds_secret_configs": [sds_ref(svid_secret_name(source_identity), config_source)],
                    "combined_validation_context": validation(trust_domain, [{"exact": dest_identity}], config_source),
                },
            },
        },
    }
