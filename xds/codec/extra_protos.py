"""Two Envoy 1.40 messages `xds-protos` lacks, registered in the default descriptor pool so `aether.xds.codec.protojson` can
pack them: the `on_demand_secret` certificate selector and the `filter_state_override` certificate mapper (the
per-source client certificate of the h2 path).

Field names and numbers as in envoyproxy/envoy api/ (1.40):
- envoy/extensions/transport_sockets/tls/cert_selectors/on_demand_secret/v3/config.proto `Config`:
  config_source = 1, certificate_mapper = 2, prefetch_secret_names = 3, max_secrets = 4, cache_idle_timeout = 5
- envoy/extensions/transport_sockets/tls/cert_mappers/filter_state_override/v3/config.proto `Config`:
  default_value = 1
Validation annotations are left out (Envoy validates; we only need the wire format). Importing this module is
enough; it is idempotent.
"""

from __future__ import annotations

from typing import Final

from envoy.config.core.v3 import config_source_pb2, extension_pb2  # noqa: F401  (dependencies, registered)
from google.protobuf import descriptor_pb2, descriptor_pool, duration_pb2, wrappers_pb2  # noqa: F401

_FDP = descriptor_pb2.FieldDescriptorProto
SELECTOR_FILE: Final = "envoy/extensions/transport_sockets/tls/cert_selectors/on_demand_secret/v3/config.proto"
SELECTOR_PACKAGE: Final = "envoy.extensions.transport_sockets.tls.cert_selectors.on_demand_secret.v3"
MAPPER_FILE: Final = "envoy/extensions/transport_sockets/tls/cert_mappers/filter_state_override/v3/config.proto"
MAPPER_PACKAGE: Final = "envoy.extensions.transport_sockets.tls.cert_mappers.filter_state_override.v3"


def _selector_file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(
        name=SELECTOR_FILE,
        package=SELECTOR_PACKAGE,
        syntax="proto3",
        dependency=[
            "envoy/config/core/v3/config_source.proto",
            "envoy/config/core/v3/extension.proto",
            "google/protobuf/duration.proto",
            "google/protobuf/wrappers.proto",
        ],
    )
    msg = fd.message_type.add(name="Config")
    opt, rep = _FDP.LABEL_OPTIONAL, _FDP.LABEL_REPEATED
    for name, number, ftype, label, type_name, json_name in (
        ("config_source", 1, _FDP.TYPE_MESSAGE, opt, ".envoy.config.core.v3.ConfigSource", "configSource"),
        (
            "certificate_mapper",
            2,
            _FDP.TYPE_MESSAGE,
            opt,
            ".envoy.config.core.v3.TypedExtensionConfig",
            "certificateMapper",
        ),
        ("prefetch_secret_names", 3, _FDP.TYPE_STRING, rep, "", "prefetchSecretNames"),
        ("max_secrets", 4, _FDP.TYPE_MESSAGE, opt, ".google.protobuf.UInt32Value", "maxSecrets"),
        ("cache_idle_timeout", 5, _FDP.TYPE_MESSAGE, opt, ".google.protobuf.Duration", "cacheIdleTimeout"),
    ):
        field = msg.field.add(name=name, number=number, type=ftype, label=label, json_name=json_name)
        if type_name:
            field.type_name = type_name
    return fd


def _mapper_file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name=MAPPER_FILE, package=MAPPER_PACKAGE, syntax="proto3")
    msg = fd.message_type.add(name="Config")
    msg.field.add(
        name="default_value", number=1, type=_FDP.TYPE_STRING, label=_FDP.LABEL_OPTIONAL, json_name="defaultValue"
    )
    return fd


def register() -> None:
    pool = descriptor_pool.Default()
    for make, name in ((_selector_file, SELECTOR_FILE), (_mapper_file, MAPPER_FILE)):
        try:
            pool.FindFileByName(name)
        except KeyError:
            pool.Add(make())


register()
