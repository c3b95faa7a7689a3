"""The operations docs name what the code has: every metric, every MeshNode status field, every port role, the
deployed version. A field or metric added to the code without a line in docs/ fails here."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from aether.api.meshnode import MeshNodeStatus
from aether.api.slices import SliceSpec
from aether.metrics import REGISTRY
from aether.netns.contract import PORT_ROLES

REPO = Path(__file__).resolve().parents[2]
OPERATIONS = (REPO / "docs" / "operations.md").read_text()
ARCHITECTURE = (REPO / "docs" / "architecture.md").read_text()


def _wire_fields(model: type[BaseModel]) -> set[str]:
    out: set[str] = set()
    for name, field in model.model_fields.items():
        out.add(field.alias or name)
        for arg in [field.annotation, *getattr(field.annotation, "__args__", ())]:
            for inner in [arg, *getattr(arg, "__args__", ())]:
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    out |= _wire_fields(inner)
    return out


def test_every_metric_is_documented() -> None:
    names = set()
    for metric in REGISTRY.collect():
        names.add(f"{metric.name}_total" if metric.type == "counter" else metric.name)
    missing = sorted(n for n in names if f"`{n}`" not in OPERATIONS)
    assert names and missing == []


def _undocumented(fields: set[str], text: str) -> list[str]:
    section = text.split("## MeshNode and MeshServiceSlice fields", 1)[1].split("\n## ", 1)[0]
    words = {w for span in re.findall(r"`([^`\n]*)`", section) for w in re.findall(r"\w+", span)}
    return sorted(fields - words)


def test_every_meshnode_status_field_is_documented() -> None:
    fields = _wire_fields(MeshNodeStatus)
    assert {"conditions", "serviceSlices", "dormantPairs", "serviceAccount", "lastTransitionTime"} <= fields
    assert _undocumented(fields, OPERATIONS) == []
    slice_fields = _wire_fields(SliceSpec)
    assert {"namespace", "index", "count", "services", "destinations"} <= slice_fields
    assert _undocumented(slice_fields, OPERATIONS) == []


def test_the_field_check_sees_red() -> None:
    """Negative control: drop one field's mention and the check names it."""
    assert _undocumented(_wire_fields(MeshNodeStatus), OPERATIONS.replace("`evidence`", "evidence")) == ["evidence"]


def test_port_roles_in_the_architecture_table() -> None:
    for role in PORT_ROLES:
        assert re.search(rf"\| `{role.name}` \| {role.number} \|", ARCHITECTURE), role.name


def test_deployed_version_is_the_package_version(
    daemonset: dict[str, Any], operator_deployment: dict[str, Any]
) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    pods = [daemonset["spec"]["template"]["spec"], operator_deployment["spec"]["template"]["spec"]]
    images = {c["image"] for p in pods for c in [*p.get("initContainers", []), *p["containers"]]}
    assert {image.rpartition(":")[2] for image in images} == {version}  # the names: test_deploy_image_names
    init = {e["name"]: e.get("value") for e in pods[0]["initContainers"][0]["env"]}
    assert init["AETHER_VERSION"] == version, "the host bundle directory is named by it: bump it with the image"
