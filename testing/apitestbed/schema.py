"""Validation of custom resources against their CRD's `openAPIV3Schema`, as kube-apiserver does on every write:
unknown fields pruned (unless `x-kubernetes-preserve-unknown-fields`), then the object validated with the
`jsonschema` library (Draft 4 keywords: type, properties, required, items, min/maxItems, min/maxLength, pattern,
enum, minimum/maximum, anyOf/oneOf/allOf/not; `nullable` honoured; `format` and CEL rules not checked). A failure
is a 422 `Invalid` Status whose `details.causes` name each field path (`spec.rules[0].backendRefs[0].weight`)."""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema

Obj = dict[str, Any]
SKIP = ("apiVersion", "kind", "metadata")  # the API server validates these itself


def _json_schema(schema: Any) -> Any:
    """OpenAPI v3 -> JSON Schema: `nullable: true` admits null; vendor extensions dropped."""
    if isinstance(schema, list):
        return [_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: _json_schema(v) if k not in ("enum", "default", "example", "required") else v
        for k, v in schema.items()
        if not k.startswith("x-kubernetes-") and k not in ("nullable", "format", "default", "example")
    }
    if "properties" in schema:
        out["properties"] = {k: _json_schema(v) for k, v in schema["properties"].items()}
    if schema.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


def prune(value: Any, schema: Any) -> Any:
    """Drop the fields the schema does not know, as the API server's structural pruning does."""
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields") is True:
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is None and extra is None:
            return value if schema.get("type") != "object" else {}
        out = {}
        for k, v in value.items():
            if props is not None and k in props:
                out[k] = prune(v, props[k])
            elif isinstance(extra, dict):
                out[k] = prune(v, extra)
            elif extra is True:
                out[k] = v
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(v, schema["items"]) for v in value]
    return value


def _path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


_REASONS = {
    "required": ("FieldValueRequired", "Required value"),
    "enum": ("FieldValueNotSupported", "Unsupported value"),
    "maxItems": ("FieldValueTooMany", "Too many"),
    "maxLength": ("FieldValueTooLong", "Too long"),
    "type": ("FieldValueTypeInvalid", "Invalid value"),
}


def _nullable_inner(err: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """A `nullable` field (anyOf [schema, null]) that fails its schema: report the inner error, as the API server
    does (status.summary.pods, not status.summary)."""
    while err.validator == "anyOf" and err.context:
        inner = [e for e in err.context if e.relative_schema_path and e.relative_schema_path[0] == 0]
        if not inner:
            break
        err = jsonschema.exceptions.best_match(inner) or err
    return err


def causes(obj: Obj, schema: Obj) -> list[Obj]:
    """Every violation as a Status cause: {reason, message, field}."""
    body = {k: v for k, v in obj.items() if k not in SKIP}
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k not in SKIP}
    validator = jsonschema.Draft4Validator(_json_schema({**schema, "properties": props}))
    out = []
    errors = [_nullable_inner(e) for e in validator.iter_errors(body)]
    for err in sorted(errors, key=lambda e: (list(map(str, e.absolute_path)), e.message)):
        parts = list(err.absolute_path)
        if err.validator == "required" and (missing := re.match(r"'([^']*)' is a required property", err.message)):
            parts.append(missing.group(1))
        reason, word = _REASONS.get(str(err.validator), ("FieldValueInvalid", "Invalid value"))
        field = _path(parts)
        out.append({"reason": reason, "message": f"{word}: {field}: {err.message}", "field": field})
    return out


def admit(obj: Obj, schema: Obj | None) -> tuple[Obj, list[Obj]]:
    """The object as stored (pruned) and the causes that refuse it (empty: admitted)."""
    if schema is None:
        return obj, []
    pruned = copy.deepcopy(obj)
    for key in [k for k in pruned if k not in SKIP]:
        props = schema.get("properties") or {}
        if key in props:
            pruned[key] = prune(pruned[key], props[key])
        elif schema.get("x-kubernetes-preserve-unknown-fields") is not True:
            del pruned[key]
    return pruned, causes(pruned, schema)
