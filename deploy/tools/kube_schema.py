"""Validate rendered manifests against the Kubernetes schemas of the `kubernetes` python client.

The client's models (kubernetes>=37, pinned in pyproject.toml) are pydantic models with `extra="forbid"` and strict types, so
`Model.model_validate(obj)` already fails on unknown fields, wrong types and missing required fields. Two
holes remain and are closed here: the models also accept the snake_case Python names (`host_network`)
where the API only knows the wire names (`hostNetwork`), and a kind must be served by its own apiVersion.
Both are caught by a round trip: validate, serialize by wire name, and require the same document back.
"""

from __future__ import annotations

from typing import Any

import kubernetes.client
from pydantic import BaseModel, ValidationError

# (apiVersion, kind) -> model class name. A kind not listed here is an error: add it deliberately.
MODELS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("v1", "Pod"): "V1Pod",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): "V1CustomResourceDefinition",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): "V1ValidatingAdmissionPolicy",
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): "V1ValidatingAdmissionPolicyBinding",
}


def _prune(value: Any) -> Any:
    """Drop None (unset fields) recursively, the way the API omits them."""
    if isinstance(value, dict):
        return {k: _prune(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def _diff(want: Any, got: Any, path: str, out: list[str]) -> None:
    if isinstance(want, dict) and isinstance(got, dict):
        for key in want.keys() - got.keys():
            out.append(f"{path}.{key}: not a field of the schema (by its wire name)")
        for key in got.keys() - want.keys():
            out.append(f"{path}.{key}: appeared in the round trip (a snake_case or defaulted field?)")
        for key in want.keys() & got.keys():
            _diff(want[key], got[key], f"{path}.{key}", out)
    elif isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            _diff(w, g, f"{path}[{i}]", out)
    elif want != got or type(want) is not type(got):
        out.append(f"{path}: {want!r} came back as {got!r}")


def model_for(obj: dict[str, Any]) -> type[BaseModel]:
    key = (str(obj.get("apiVersion")), str(obj.get("kind")))
    if key not in MODELS:
        raise KeyError(f"no schema known for apiVersion={key[0]} kind={key[1]}")
    cls = getattr(kubernetes.client, MODELS[key])
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        raise RuntimeError(f"kubernetes {kubernetes.__version__}: {cls} is not a pydantic model (need kubernetes>=37)")
    return cls


def validate(obj: dict[str, Any]) -> list[str]:
    """Problems with one object against its Kubernetes schema; empty when it is valid."""
    where = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
    try:
        cls = model_for(obj)
    except KeyError as exc:
        return [f"{where}: {exc.args[0]}"]
    try:
        model = cls.model_validate(obj)
    except ValidationError as exc:
        return [f"{where}: {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
    back = _prune(model.to_dict(serialize=True))  # type: ignore[attr-defined]
    problems: list[str] = []
    _diff(obj, back, where, problems)
    return problems
