"""The resource types the test bed serves from the start, and how a CRD adds one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: frozenset[str] = field(default_factory=frozenset)
    short_names: tuple[str, ...] = ()
    printer_columns: tuple[tuple[str, str, str], ...] = ()  # (name, type, jsonPath)
    schema: dict[str, Any] | None = field(default=None, compare=False, hash=False)  # a CRD's openAPIV3Schema

    @property
    def key(self) -> tuple[str, str]:
        """Storage key: objects are shared across versions of one group/plural."""
        return (self.group, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


_STATUS = frozenset({"status"})

BUILTIN: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "namespaces", "Namespace", False, _STATUS, ("ns",)),
    ResourceType("", "v1", "nodes", "Node", False, _STATUS, ("no",)),
    ResourceType("", "v1", "pods", "Pod", True, _STATUS, ("po",)),
    ResourceType("", "v1", "services", "Service", True, _STATUS, ("svc",)),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, frozenset(), ("sa",)),
    ResourceType("", "v1", "events", "Event", True, frozenset(), ("ev",)),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, frozenset(), ("cm",)),
    ResourceType("events.k8s.io", "v1", "events", "Event", True),
    ResourceType("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True),
    ResourceType(
        "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False, _STATUS, ("crd",)
    ),
)


def from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """The resource types one CustomResourceDefinition serves (one per served version)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
    if not (isinstance(group, str) and isinstance(plural, str) and isinstance(kind, str)):
        raise ValueError("a CRD needs spec.group, spec.names.plural and spec.names.kind")
    out = []
    for ver in spec.get("versions") or []:
        if not isinstance(ver, dict) or not ver.get("served", True) or not isinstance(ver.get("name"), str):
            continue
        subs = frozenset(k for k in (ver.get("subresources") or {}) if k in ("status", "scale"))
        columns = tuple(
            (str(c.get("name")), str(c.get("type", "string")), str(c.get("jsonPath")))
            for c in ver.get("additionalPrinterColumns") or []
            if isinstance(c, dict) and c.get("jsonPath")
        )
        out.append(
            ResourceType(
                group,
                ver["name"],
                plural,
                kind,
                spec.get("scope", "Namespaced") == "Namespaced",
                subs,
                tuple(names.get("shortNames") or ()),
                columns,
                (ver.get("schema") or {}).get("openAPIV3Schema"),
            )
        )
    return out
