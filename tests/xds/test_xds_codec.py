"""The codec: proto3-JSON dicts -> ADS bytes, including 1.40 fields xds-protos lacks."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.transport_sockets.quic.v3 import quic_transport_pb2

from aether.testing.samples import quic_listener
from aether.xds.codec import protojson as codec
from aether.xds.resources import (
    CLUSTER,
    LISTENER,
)


def test_enable_resumption_is_field_3_as_in_envoy_1_40() -> None:
    """api/envoy/extensions/transport_sockets/quic/v3/quic_transport.proto (1.40):
    google.protobuf.BoolValue enable_resumption = 3."""
    data = codec.encode(LISTENER, quic_listener(enableEarlyData=False, enableResumption=False))
    listener = listener_pb2.Listener.FromString(data)
    value = listener.filter_chains[0].transport_socket.typed_config.value
    # the installed (older) class parses it, keeping field 3 as an unknown field: 0x1a = (3 << 3) | 2
    assert value == b"\x0a\x00\x12\x00\x1a\x00"
    assert quic_transport_pb2.QuicDownstreamTransport.FromString(value).SerializeToString() == value
    true = codec.encode(LISTENER, quic_listener(enableResumption=True))
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
        codec.encode(LISTENER, quic_listener(enableResumptoin=False))


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


def test_fast_path_falls_back_for_what_it_does_not_handle() -> None:
    cluster = {"name": "c", "metadata": {"filterMetadata": {"x": {"k": [1, "a", {"b": None}]}}}}  # a Struct
    assert codec.decode_json(CLUSTER, codec.encode(CLUSTER, cluster)) == cluster


def _classes_the_collector_frees(work: Callable[[], object]) -> list[str]:
    """The message classes `work` leaves as cyclic garbage (full names), found with the collector keeping what it
    frees (DEBUG_SAVEALL), the collector's state restored after."""
    gc.collect()
    flags = gc.get_debug()
    gc.set_debug(flags | gc.DEBUG_SAVEALL)
    try:
        work()
        gc.collect()
        return sorted(o.DESCRIPTOR.full_name for o in gc.garbage if isinstance(o, type) and hasattr(o, "DESCRIPTOR"))
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()


def test_no_message_class_is_made_again_for_each_resource() -> None:
    """upb makes a sub-message's class on demand and its descriptor does not keep it, so a class only one
    translation's messages used was freed with them and made again for the next (a sidecar under churn freed some 65
    classes a minute, each a type object, its dict and MRO, left for the cyclic collector): the codec holds the class
    of every message type its resources reach, so encoding and decoding them again makes no class."""
    listener = quic_listener(enableEarlyData=False, enableResumption=True)
    cluster = {
        "name": "c",
        "type": "STATIC",
        "load_assignment": {
            "cluster_name": "c",
            "endpoints": [
                {
                    "lb_endpoints": [
                        {"endpoint": {"address": {"socket_address": {"address": "10.0.0.1", "port_value": 80}}}}
                    ]
                }
            ],
        },
    }

    def work() -> None:
        for _ in range(3):
            codec.decode_json(LISTENER, codec.encode(LISTENER, listener))
            codec.decode_json(CLUSTER, codec.encode(CLUSTER, cluster, fast=False))

    work()  # the first use makes the classes
    assert _classes_the_collector_frees(work) == []
    sub = codec.message_class("envoy.config.listener.v3.Listener")().address.socket_address
    assert type(sub) is codec.message_class("envoy.config.core.v3.SocketAddress")
