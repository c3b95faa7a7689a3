"""Import the xds-protos modules whose message types appear in our resources (registers their descriptors)."""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2  # noqa: F401
from envoy.config.endpoint.v3 import endpoint_pb2  # noqa: F401
from envoy.config.listener.v3 import listener_pb2  # noqa: F401
from envoy.config.route.v3 import route_pb2  # noqa: F401
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2  # noqa: F401
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2  # noqa: F401
from envoy.extensions.filters.udp.udp_proxy.v3 import udp_proxy_pb2  # noqa: F401
from envoy.extensions.matching.common_inputs.network.v3 import network_inputs_pb2  # noqa: F401
from envoy.extensions.transport_sockets.quic.v3 import quic_transport_pb2  # noqa: F401
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2, tls_pb2  # noqa: F401
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
from envoy.service.discovery.v3 import ads_pb2, discovery_pb2  # noqa: F401

# Message types xds-protos lacks (the h2 certificate selector and its mapper), registered from descriptors
# written by hand: importing them here makes the codec independent of whether eastwest was imported first.
from aether.xds.codec import extra_protos  # noqa: F401
