"""Proto3-JSON resource dicts -> protobuf bytes for ADS (`xds-protos`, plus fields newer than it).

`xds-protos` carries an Envoy API snapshot older than Envoy 1.40. Fields 1.40 has and it lacks are declared in
`EXTRA_FIELDS` (message, field name, number, type, checked against envoyproxy/envoy's api/ tree) and added to a
private copy of the descriptor pool, so `json_format.ParseDict` accepts them and the bytes carry them under
their real field numbers. Everything else comes from the installed descriptors unchanged.

Why xds-protos and not envoy-data-plane: bench/xds_translate.py's `--codec` comparison (docs/performance.md).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, json_format, message, message_factory

from aether.xds.codec import (
    fastfill,
    protos,  # noqa: F401  (importing it registers the descriptors in the default pool, the private copy's source)
)
from aether.xds.resources import ResourceDict

_FDP = descriptor_pb2.FieldDescriptorProto


@dataclass(frozen=True)
class ExtraField:
    """A field Envoy 1.40 knows that xds-protos lacks: `message` is the full proto name."""

    message: str
    name: str
    number: int
    type: int  # FieldDescriptorProto.TYPE_*
    type_name: str = ""  # for TYPE_MESSAGE / TYPE_ENUM: ".pkg.Message"
    json_name: str = ""


EXTRA_FIELDS: Final[tuple[ExtraField, ...]] = (
    # api/envoy/extensions/transport_sockets/quic/v3/quic_transport.proto (1.40):
    #   google.protobuf.BoolValue enable_resumption = 3;
    ExtraField(
        "envoy.extensions.transport_sockets.quic.v3.QuicDownstreamTransport",
        "enable_resumption",
        3,
        _FDP.TYPE_MESSAGE,
        ".google.protobuf.BoolValue",
        "enableResumption",
    ),
)


class CodecError(ValueError):
    """A resource dict that does not parse as its type (names the type, the resource and why)."""


class _PatchedDB:
    """Descriptor database over the default pool that adds EXTRA_FIELDS to their messages' files."""

    def __init__(self, extras: tuple[ExtraField, ...]) -> None:
        self._default = descriptor_pool.Default()
        self._by_message = {e.message: e for e in extras}
        self._extras = extras

    def _patched(self, fd: Any) -> descriptor_pb2.FileDescriptorProto:
        proto = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(proto)
        for extra in self._extras:
            pkg, _, msg_name = extra.message.rpartition(".")
            if pkg != proto.package:
                continue
            for msg in proto.message_type:
                if msg.name == msg_name and all(f.number != extra.number for f in msg.field):
                    msg.field.add(
                        name=extra.name,
                        number=extra.number,
                        type=extra.type,
                        label=_FDP.LABEL_OPTIONAL,
                        type_name=extra.type_name or None,
                        json_name=extra.json_name or None,
                    )
        return proto

    def FindFileByName(self, name: str) -> descriptor_pb2.FileDescriptorProto:
        return self._patched(self._default.FindFileByName(name))

    def FindFileContainingSymbol(self, symbol: str) -> descriptor_pb2.FileDescriptorProto:
        try:
            fd = self._default.FindFileContainingSymbol(symbol)
        except KeyError:
            _import_package_of(symbol)
            fd = self._default.FindFileContainingSymbol(symbol)
        return self._patched(fd)

    def FindFileContainingExtension(self, *args: object) -> descriptor_pb2.FileDescriptorProto:
        raise KeyError(args)

    def FindAllExtensionNumbers(self, *args: object) -> list[int]:
        return []


def _import_package_of(symbol: str) -> None:
    """Import every generated `*_pb2` module of the proto package holding `symbol` (xds-protos lays packages out
    as folders), so a type referenced only by an `Any` inside a resource resolves without a hand-kept list."""
    parts = symbol.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        pkg = ".".join(parts[:cut])
        try:
            mod = importlib.import_module(pkg)
        except ImportError:
            continue
        for path in getattr(mod, "__path__", []):
            for entry in sorted(Path(path).glob("*_pb2.py")):
                importlib.import_module(f"{pkg}.{entry.stem}")
        return


_lock = threading.Lock()
_pool: Any = None
# Every message class of the private pool, held for the life of the process. upb makes a message's class on demand
# (a sub-message field read or set, an Any's content) and its descriptor keeps no strong reference to it, so a class
# only the messages of one translation use became garbage with them and was made again by the next one: some 65
# classes a minute per sidecar under churn, each a type object, its dict and its MRO freed by the cyclic collector
# minutes later, in the middle of the allocator's arenas. Holding a class holds its descriptor, which then finds it.
_classes: dict[str, Callable[[], message.Message]] = {}


def pool() -> Any:
    """The private descriptor pool (default pool + EXTRA_FIELDS)."""
    with _lock:
        return _pool_locked()


def message_class(full_name: str) -> Callable[[], message.Message]:
    """The class of message type `full_name` in the private pool; it and the class of every message type its fields
    reach (sub-messages, map entries, recursively) are made once and held (`_classes`)."""
    cls = _classes.get(full_name)
    if cls is None:
        with _lock:
            _hold(_pool_locked().FindMessageTypeByName(full_name))
        cls = _classes[full_name]
    return cls


def _pool_locked() -> Any:
    global _pool
    if _pool is None:
        _pool = descriptor_pool.DescriptorPool(_PatchedDB(EXTRA_FIELDS))
    return _pool


def _hold(root: Any) -> None:
    """Make and hold the class of `root` and of every message type reachable from its fields (caller holds _lock)."""
    todo = [root]
    while todo:
        desc = todo.pop()
        if desc.full_name in _classes:
            continue
        _classes[desc.full_name] = message_factory.GetMessageClass(desc)
        todo += [f.message_type for f in desc.fields if f.message_type is not None]


def full_name(type_url: str) -> str:
    return type_url.rsplit("/", 1)[-1]


def _fast(msg: message.Message, resource: ResourceDict) -> bool:
    try:
        fastfill.fill(msg, resource, message_class)
    except (fastfill.Unsupported, TypeError, ValueError, KeyError, AttributeError):
        msg.Clear()
        return False
    return True


def to_message(type_url: str, resource: ResourceDict, name: str = "?", fast: bool = True) -> message.Message:
    msg = message_class(full_name(type_url))()
    if fast and _fast(msg, resource):
        return msg
    try:
        json_format.ParseDict(resource, msg, descriptor_pool=pool())
    except (json_format.ParseError, TypeError, ValueError, KeyError) as exc:
        raise CodecError(f"{full_name(type_url)} {name!r}: {exc}") from exc
    return msg


def encode(type_url: str, resource: ResourceDict, name: str = "?", fast: bool = True) -> bytes:
    """The resource's serialized message bytes (deterministic): the `value` of its ADS `Any`. `fast=False`
    forces json_format.ParseDict (the reference the fast path is tested against)."""
    data: bytes = to_message(type_url, resource, name, fast).SerializeToString(deterministic=True)
    return data


def to_any(type_url: str, value: bytes) -> any_pb2.Any:
    return any_pb2.Any(type_url=type_url, value=value)


def decode_json(type_url: str, value: bytes) -> ResourceDict:
    """Bytes back to proto3-JSON (for tests and debugging), through the patched pool."""
    msg = message_class(full_name(type_url))()
    msg.ParseFromString(value)
    out: ResourceDict = json_format.MessageToDict(msg, descriptor_pool=pool())
    return out
