"""crds/ is generated from the pydantic model; the MeshNode CRD is structural and has the contract's shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from aether.api import crdgen
from aether.api.meshnode import MeshNodeStatus


def test_crds_are_not_stale() -> None:
    assert crdgen.stale() == [], "crds/ is stale: run `.venv/bin/python -m aether.api.crdgen`"


def test_stale_check_sees_a_changed_model_negative_control(tmp_path: Path) -> None:
    """The staleness gate must go red: an edited copy of the CRD is reported, a missing one too."""
    for name in crdgen.render():
        (tmp_path / name).write_text((crdgen.crds_dir() / name).read_text())
    assert crdgen.stale(tmp_path) == []
    for name in ("meshnode.yaml", "meshserviceslices.yaml"):
        text = (crdgen.crds_dir() / name).read_text()
        assert "serviceAccount" in text
        (tmp_path / name).write_text(text.replace("serviceAccount", "serviceAcount"))
        assert crdgen.stale(tmp_path) == [name]
        (tmp_path / name).unlink()
        assert crdgen.stale(tmp_path) == [name]
        (tmp_path / name).write_text(text)


def _walk(schema: Any, path: str = "") -> list[str]:
    bad = []
    if isinstance(schema, dict):
        for forbidden in ("$ref", "anyOf", "title", "$defs"):
            if forbidden in schema:
                bad.append(f"{path}: {forbidden}")
        typed = "type" in schema or "x-kubernetes-preserve-unknown-fields" in schema
        if ("properties" in schema or "items" in schema) and not typed:
            bad.append(f"{path}: no type")
        for k, v in schema.items():
            bad += _walk(v, f"{path}/{k}")
    elif isinstance(schema, list):
        for i, v in enumerate(schema):
            bad += _walk(v, f"{path}[{i}]")
    return bad


def test_meshnode_crd_shape() -> None:
    crd = yaml.safe_load((crdgen.crds_dir() / "meshnode.yaml").read_text())
    assert crd["spec"]["scope"] == "Cluster"
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Pods",
        "Slices",
        "QUIC Pairs",
        "Dormant Pairs",
        "Ready",
        "Programmed",
        "Degraded",
        "Age",
    ]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert _walk(status) == []
    props = status["properties"]
    assert set(props) >= {"conditions", "pods", "quic", "serviceSlices"}
    assert not {"udp", "tcp"} & set(props), "a node's arms and shapes are in its MeshServiceSlices"
    assert set(props["quic"]["properties"]) >= {"identities", "destinations", "ineligible", "pairs", "dormantPairs"}
    # every field of the model is in the schema (camelCase)
    wire = MeshNodeStatus.model_json_schema(by_alias=True)["properties"]
    assert set(wire) == set(props)


def test_slice_crd_shape() -> None:
    crd = yaml.safe_load((crdgen.crds_dir() / "meshserviceslices.yaml").read_text())
    assert crd["spec"]["scope"] == "Cluster" and crd["spec"]["names"]["kind"] == "MeshServiceSlice"
    version = crd["spec"]["versions"][0]
    assert "subresources" not in version, "the operator writes a slice whole: no status"
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert _walk(spec) == []
    assert set(spec["properties"]) == {"namespace", "index", "count", "services", "udp", "tcp", "quic"}
    assert set(spec["properties"]["udp"]["properties"]) == {"services", "unsupportedShapes"}


def test_policy_crd_shape() -> None:
    crd = yaml.safe_load((crdgen.crds_dir() / "meshauthorizationpolicy.yaml").read_text())
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["kind"] == "MeshAuthorizationPolicy"
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    props = version["schema"]["openAPIV3Schema"]["properties"]
    assert sorted(props["spec"]["properties"]) == ["rules", "targetRefs"]
    assert sorted(props["spec"]["properties"]["rules"]["items"]["properties"]) == ["from", "ports"]
    assert sorted(props["status"]["properties"]) == ["conditions", "errors", "observedGeneration", "services"]
    assert _walk(props) == []
