"""The codec: proto3-JSON dicts -> ADS bytes, including 1.40 fields xds-protos lacks."""

from __future__ import annotations

import pytest
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.transport_sockets.quic.v3 import quic_transport_pb2

from aether.xds.codec import protojson as codec
from aether.xds.resources import CLUSTER, LISTENER

QUIC_DOWNSTREAM = "type.googleapis.com/envoy.extensions.transport_sockets.quic.v3.QuicDownstreamTransport"


def _quic_listener(**quic: object) -> dict[str, object]:
    return {
        "name": "q",
        "filterChains": [
            {
                "transportSocket": {
                    "name": "envoy.transport_sockets.quic",
                    "typedConfig": {"@type": QUIC_DOWNSTREAM, "downstreamTlsContext": {}, **quic},
                }
            }
        ],
    }


def test_enable_resumption_is_field_3_as_in_envoy_1_40() -> None:
    """api/envoy/extensions/transport_sockets/quic/v3/quic_transport.proto (1.40):
    google.protobuf.BoolValue enable_resumption = 3."""
    data = codec.encode(LISTENER, _quic_listener(enableEarlyData=False, enableResumption=False))
    listener = listener_pb2.Listener.FromString(data)
    value = listener.filter_chains[0].transport_socket.typed_config.value
    # the installed (older) class parses it, keeping field 3 as an unknown field: 0x1a = (3 << 3) | 2
    assert value == b"\x0a\x00\x12\x00\x1a\x00"
    assert quic_transport_pb2.QuicDownstreamTransport.FromString(value).SerializeToString() == value
    true = codec.encode(LISTENER, _quic_listener(enableResumption=True))
    assert (
        listener_pb2.Listener.FromString(true)
        .filter_chains[0]
        .transport_socket.typed_config.value.endswith(b"\x1a\x02\x08\x01")
    )
    back = codec.decode_json(LISTENER, data)
    assert back["filterChains"][0]["transportSocket"]["typedConfig"]["enableResumption"] is False


def test_a_misspelled_field_is_an_error_naming_the_resource() -> None:
    with pytest.raises(codec.CodecError, match=r"Cluster 'c'.*connectTimout"):
        codec.encode(CLUSTER, {"name": "c", "connectTimout": "1s"}, "c")
    with pytest.raises(codec.CodecError, match="enableResumptoin"):
        codec.encode(LISTENER, _quic_listener(enableResumptoin=False))


def test_types_only_named_inside_an_any_resolve() -> None:
    listener = {
        "name": "x",
        "filterChains": [
            {
                "filters": [
                    {
                        "name": "sfs",
                        "typedConfig": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.network.set_filter_state.v3.Config"
                        },
                    }
                ]
            }
        ],
    }
    assert codec.decode_json(LISTENER, codec.encode(LISTENER, listener)) == listener


def test_fast_path_matches_parsedict_on_every_shape_we_render() -> None:
    """The fast filler (aether.xds.codec.fastfill) must give the same messages as json_format.ParseDict."""
    from aether.testing.samples import node_with, records_for
    from aether.xds.translate.compose import translate

    node = node_with(40, 3)
    node.status.tcp.services = [
        a.model_copy(update={"cluster": a.cluster.replace("udp:", "tcp:")}) for a in node.status.udp.services[:7]
    ]
    node.status.udp.services[3] = node.status.udp.services[3].model_copy(
        update={"cluster": "blackhole", "endpoints": []}
    )
    resources = translate(node, records_for(node))
    extra = {LISTENER: {"q": _quic_listener(enableEarlyData=False, enableResumption=True)}}
    seen = 0
    for res in (resources, extra):
        for type_url, named in res.items():
            for name, resource in named.items():
                fast = codec.to_message(type_url, resource, name)
                slow = codec.to_message(type_url, resource, name, fast=False)
                assert codec.decode_json(type_url, fast.SerializeToString()) == codec.decode_json(
                    type_url, slow.SerializeToString()
                ), name
                seen += 1
    assert seen > 50


def test_fast_path_falls_back_for_what_it_does_not_handle() -> None:
    cluster = {"name": "c", "metadata": {"filterMetadata": {"x": {"k": [1, "a", {"b": None}]}}}}  # a Struct
    assert codec.decode_json(CLUSTER, codec.encode(CLUSTER, cluster)) == cluster
