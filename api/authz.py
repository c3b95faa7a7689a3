"""MeshAuthorizationPolicy: which source identities may call a Service, on which ports (docs/identity.md#authorization).

The smallest policy that answers that question, shaped after Istio's AuthorizationPolicy (`action: ALLOW` only,
`targetRefs` to Services, `rules[].from` principals, `rules[].ports`) and matched on SPIFFE IDs:

    apiVersion: mesh.aether.dev/v1alpha1
    kind: MeshAuthorizationPolicy
    metadata: {name: web-callers, namespace: default}
    spec:
      targetRefs: [{kind: Service, name: web}]        # Services of the policy's namespace
      rules:                                          # none: every caller is denied
      - from: [spiffe://cluster.local/ns/default/sa/client, spiffe://cluster.local/ns/team-b/sa/*]
        ports: [8080]                                 # omitted: every port of the Service

A Service no policy targets admits any SPIFFE ID of the trust domain (the inbound's TLS check); a Service one or
more policies target admits only what their rules allow (deny by default). A policy that is not Accepted allows
nothing but still closes its Services (it fails closed, as Istio does for an ALLOW rule it cannot honour).

Default-deny (Istio's allow-nothing policy; Gateway API policy attachment, GEP-713, with the Namespace as target):
a policy whose targetRefs name its own Namespace (`{kind: Namespace, name: <its namespace>}`) applies to every
meshed pod of the namespace on every port; with no rules it denies everything no other policy allows. Such a policy
in `ROOT_NAMESPACE` (Istio's root namespace) applies to every pod of the mesh. Policies add up (ALLOW semantics):
a caller gets through if any policy that applies to the pod and port allows it.

This *is* the CRD schema (crds/ is generated from it, `aether.api.crdgen`). `check` is the one validation, used by the
operator (the policy's status) and the sidecar (what it compiles); `compiled` gives the sidecar's hashable input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from aether.api.meshnode import API_GROUP, API_VERSION, Condition, MeshObject, validation_problems

KIND: Final = "MeshAuthorizationPolicy"
# the mesh's root namespace (deploy/ installs the operator there): a Namespace-wide policy in it is mesh-wide
ROOT_NAMESPACE: Final = "aether-system"
PLURAL: Final = "meshauthorizationpolicies"
SHORT_NAMES: Final = ["mauthz"]
MAX_TARGETS: Final = 16
MAX_RULES: Final = 64
MAX_SOURCES: Final = 64  # per rule
MAX_PORTS: Final = 16  # per rule

# reasons of the Accepted condition
ACCEPTED, DENY_ALL, INVALID_SOURCE, TOO_MANY_RULES, INVALID_SPEC, NO_TARGETS = (
    "Accepted",
    "DenyAll",
    "InvalidSource",
    "TooManyRules",
    "InvalidSpec",
    "NoTargets",
)
# reasons of the ResolvedRefs condition
RESOLVED, SERVICE_NOT_FOUND, PORT_NOT_FOUND = "ResolvedRefs", "ServiceNotFound", "PortNotFound"

_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN: Final = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_SPIFFE: Final = re.compile(r"spiffe://(?P<td>[^/]*)(?P<path>/.*)?")
_PATH: Final = re.compile(r"/ns/(?P<ns>[^/]+)/sa/(?P<sa>[^/]+)")


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class TargetRef(_Model):
    group: str = Field(default="", description='"" (the core API group): Services and Namespaces are targets')
    kind: str = Field(
        default="Service",
        description="Service, or Namespace: every pod of the namespace (the policy's own; in the mesh's root "
        "namespace, every pod of the mesh)",
    )
    name: str = Field(min_length=1, description="a Service in the policy's namespace, or that namespace's name")


class Rule(_Model):
    sources: list[str] = Field(
        default_factory=list,
        alias="from",
        description="SPIFFE IDs allowed: spiffe://<trust domain>/ns/<ns>/sa/<sa>, or .../ns/<ns>/sa/* for every "
        "ServiceAccount of a namespace",
    )
    ports: list[int] = Field(default_factory=list, description="Service ports this rule opens; empty: all of them")


class PolicySpec(_Model):
    target_refs: list[TargetRef] = Field(
        default_factory=list, description="the Services this policy protects, or its own Namespace (all its pods)"
    )
    rules: list[Rule] = Field(default_factory=list, description="what is allowed (ALLOW); none: every caller denied")


class PolicyStatus(_Model):
    """Written by the operator: conditions Accepted and ResolvedRefs, the Services selected, every error found."""

    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    services: list[str] = Field(default_factory=list, description="<namespace>/<name> of each Service it selects")
    errors: list[str] = Field(default_factory=list)


class PolicyMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    namespace: str = Field(min_length=1)


class MeshAuthorizationPolicy(MeshObject):
    kind: Literal["MeshAuthorizationPolicy"] = "MeshAuthorizationPolicy"
    metadata: PolicyMeta
    spec: PolicySpec = Field(default_factory=PolicySpec)
    status: PolicyStatus | None = None


@dataclass(frozen=True)
class Verdict:
    """What `check` found: `errors` (each names its field) make the policy not Accepted; `reason` is the Accepted
    condition's reason; `services` are the Service names it targets (also when it is invalid: it closes them);
    `namespace_wide`: it targets its own Namespace (every pod of it; of the mesh in `ROOT_NAMESPACE`)."""

    reason: str
    errors: tuple[str, ...]
    services: tuple[str, ...]
    namespace_wide: bool = False

    @property
    def accepted(self) -> bool:
        return not self.errors


def check_source(source: str, trust_domain: str) -> str | None:
    """Why `source` is not a source a rule can name, or None."""
    if source.strip() in ("*", "**"):
        return f"{source!r} is a wildcard over every identity: that is the default without a policy (name sources)"
    m = _SPIFFE.fullmatch(source)
    if m is None:
        return f"{source!r} is not a SPIFFE ID (spiffe://<trust domain>/ns/<namespace>/sa/<serviceaccount>)"
    if m["td"] != trust_domain:
        return f"{source!r}: trust domain {m['td']!r} is not the mesh's ({trust_domain!r}): it can never authenticate"
    path = _PATH.fullmatch(m["path"] or "")
    if path is None:
        if "*" in source:
            return f"{source!r}: only the ServiceAccount may be a wildcard (spiffe://{trust_domain}/ns/<ns>/sa/*)"
        return f"{source!r}: the path must be /ns/<namespace>/sa/<serviceaccount>"
    if not _LABEL.fullmatch(path["ns"]):
        return f"{source!r}: {path['ns']!r} is not a namespace name"
    if path["sa"] != "*" and not _SUBDOMAIN.fullmatch(path["sa"]):
        return f"{source!r}: {path['sa']!r} is not a ServiceAccount name (or * for all of the namespace)"
    return None


def check(policy: MeshAuthorizationPolicy, trust_domain: str) -> Verdict:
    spec = policy.spec
    errors: list[str] = []
    reason = ACCEPTED
    services: list[str] = []
    ns, wide = policy.metadata.namespace, False
    for i, t in enumerate(spec.target_refs[:MAX_TARGETS]):
        if (t.group, t.kind) == ("", "Namespace"):
            if t.name == ns:
                wide = True
            else:
                errors.append(f"targetRefs[{i}]: a policy targets only its own Namespace ({ns!r}), not {t.name!r}")
                reason = INVALID_SPEC
        elif (t.group, t.kind) != ("", "Service"):
            errors.append(
                f"targetRefs[{i}]: only Services and the policy's own Namespace are targets (group ''), not {t.kind!r}"
            )
        elif t.name not in services:
            services.append(t.name)
    if not spec.target_refs:
        errors.append("targetRefs: empty: the policy protects nothing (name the Services it is for)")
        reason = NO_TARGETS
    if len(spec.target_refs) > MAX_TARGETS:
        errors.append(f"targetRefs: {len(spec.target_refs)} targets, at most {MAX_TARGETS}")
        reason = TOO_MANY_RULES
    if len(spec.rules) > MAX_RULES:
        errors.append(f"rules: {len(spec.rules)} rules, at most {MAX_RULES} (list sources in fewer rules)")
        reason = TOO_MANY_RULES
    for i, rule in enumerate(spec.rules[:MAX_RULES]):
        if not rule.sources:
            errors.append(f"rules[{i}].from: empty: a rule must name at least one source")
            reason = reason if reason != ACCEPTED else INVALID_SOURCE
        if len(rule.sources) > MAX_SOURCES:
            errors.append(f"rules[{i}].from: {len(rule.sources)} sources, at most {MAX_SOURCES}")
            reason = TOO_MANY_RULES
        for j, src in enumerate(rule.sources[:MAX_SOURCES]):
            why = check_source(src, trust_domain)
            if why is not None:
                errors.append(f"rules[{i}].from[{j}]: {why}")
                reason = reason if reason != ACCEPTED else INVALID_SOURCE
        if len(rule.ports) > MAX_PORTS:
            errors.append(f"rules[{i}].ports: {len(rule.ports)} ports, at most {MAX_PORTS}")
            reason = TOO_MANY_RULES
        for j, port in enumerate(rule.ports):
            if not 1 <= port <= 65535:
                errors.append(f"rules[{i}].ports[{j}]: {port} is not a port (1-65535)")
                reason = reason if reason != ACCEPTED else INVALID_SPEC
    if not errors and not spec.rules:
        reason = DENY_ALL
    return Verdict(reason, tuple(errors), tuple(services), wide)


@dataclass(frozen=True)
class CompiledRule:
    sources: tuple[str, ...]
    ports: tuple[int, ...]  # empty: every port


@dataclass(frozen=True)
class CompiledPolicy:
    """The sidecar's input (hashable): an invalid policy keeps its services and has no rules (it fails closed)."""

    namespace: str
    name: str
    services: tuple[str, ...]
    rules: tuple[CompiledRule, ...]
    accepted: bool
    namespace_wide: bool = False  # targets its own Namespace: every pod of it (of the mesh: `mesh_wide`)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def mesh_wide(self) -> bool:
        return self.namespace_wide and self.namespace == ROOT_NAMESPACE

    def covers_namespace(self, namespace: str) -> bool:
        """Whether it applies to every pod of `namespace` (its own Namespace, or every one from the root)."""
        return self.namespace_wide and (self.namespace == namespace or self.mesh_wide)


def compiled(policy: MeshAuthorizationPolicy, trust_domain: str) -> CompiledPolicy:
    v = check(policy, trust_domain)
    rules = tuple(CompiledRule(tuple(r.sources), tuple(sorted(set(r.ports)))) for r in policy.spec.rules)
    meta = policy.metadata
    return CompiledPolicy(
        meta.namespace, meta.name, v.services, rules if v.accepted else (), v.accepted, v.namespace_wide
    )


class PolicyParseError(ValueError):
    """A policy object that does not fit the schema; `targets` are the Service names still readable in it,
    `namespace_wide` whether it still reads as targeting its own Namespace (then it closes the namespace)."""

    def __init__(
        self,
        message: str,
        namespace: str | None,
        name: str | None,
        targets: tuple[str, ...],
        namespace_wide: bool = False,
    ) -> None:
        super().__init__(message)
        self.namespace, self.name, self.targets, self.namespace_wide = namespace, name, targets, namespace_wide


def _lenient_targets(body: Mapping[str, Any], namespace: Any) -> tuple[tuple[str, ...], bool]:
    spec = body.get("spec")
    refs = spec.get("targetRefs") if isinstance(spec, Mapping) else None
    out: list[str] = []
    wide = False
    for r in refs if isinstance(refs, list) else []:
        if isinstance(r, Mapping) and isinstance(r.get("name"), str) and r.get("kind", "Service") == "Service":
            out.append(r["name"])
        elif isinstance(r, Mapping) and r.get("kind") == "Namespace" and r.get("name") == namespace:
            wide = True
    return tuple(dict.fromkeys(out)), wide


def parse_policy(body: Any, source: str = "<input>") -> MeshAuthorizationPolicy:
    try:
        return MeshAuthorizationPolicy.model_validate(body)
    except ValidationError as exc:
        meta = body.get("metadata") if isinstance(body, Mapping) else None
        meta = meta if isinstance(meta, Mapping) else {}
        targets, wide = _lenient_targets(body, meta.get("namespace")) if isinstance(body, Mapping) else ((), False)
        raise PolicyParseError(
            f"{source}: " + "; ".join(validation_problems(exc)), meta.get("namespace"), meta.get("name"), targets, wide
        ) from exc


def compile_bodies(bodies: Iterable[Any], trust_domain: str) -> tuple[CompiledPolicy, ...]:
    """Policy objects as read from the API or a state file -> the sidecar's input, sorted; one that does not fit
    the schema still closes the Services it names (no rules), one without a readable name or namespace is skipped."""
    out: list[CompiledPolicy] = []
    for body in bodies:
        try:
            out.append(compiled(parse_policy(body), trust_domain))
        except PolicyParseError as exc:
            if exc.namespace and exc.name:
                out.append(CompiledPolicy(exc.namespace, exc.name, exc.targets, (), False, exc.namespace_wide))
    return tuple(sorted(out, key=lambda p: (p.namespace, p.name)))


__all__ = [
    "API_GROUP",
    "API_VERSION",
    "KIND",
    "PLURAL",
    "ROOT_NAMESPACE",
    "CompiledPolicy",
    "CompiledRule",
    "MeshAuthorizationPolicy",
    "Verdict",
    "check",
    "check_source",
    "compile_bodies",
    "compiled",
    "parse_policy",
]
