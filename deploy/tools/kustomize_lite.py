"""Render deploy/ without kubectl: the few kustomize features the kustomization uses, and nothing else.

Supported: `resources` (YAML files, multi-document, and directories holding a kustomization), `namespace`
(set on namespaced objects; cluster-scoped kinds are left alone), `configMapGenerator` (`files`, `literals`)
with `generatorOptions.disableNameSuffixHash: true`, `images` (`name`, `newName`, `newTag`, on containers and
initContainers of pod templates). Any other key is an error, so a kustomization that
grows a feature fails here until the feature is added (and compared with `kubectl kustomize` where kubectl
exists: tests/deploy/test_deploy_render.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CLUSTER_SCOPED = frozenset(
    {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass", "MeshNode"}
)
KNOWN_KEYS = frozenset(
    {"apiVersion", "kind", "namespace", "resources", "configMapGenerator", "generatorOptions", "images"}
)


class KustomizeError(ValueError):
    pass


def _load_docs(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d:
            raise KustomizeError(f"{path}: every document must be a Kubernetes object")
    return docs


def _config_map(root: Path, spec: dict[str, Any]) -> dict[str, Any]:
    unknown = set(spec) - {"name", "files", "literals"}
    if unknown:
        raise KustomizeError(f"configMapGenerator {spec.get('name')}: unsupported keys {sorted(unknown)}")
    data: dict[str, str] = {}
    for item in spec.get("files", []):
        key, _, rel = str(item).partition("=") if "=" in str(item) else (Path(str(item)).name, "", str(item))
        data[key] = (root / rel).read_text()
    for lit in spec.get("literals", []):
        key, sep, value = str(lit).partition("=")
        if not sep:
            raise KustomizeError(f"literal {lit!r} has no '='")
        data[key] = value
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": spec["name"]}, "data": data}


def _split_image(image: str) -> tuple[str, str]:
    """`name[:tag]` (a digest or a registry port is not used here): the name and the `:tag`/`@digest` suffix."""
    at = image.find("@")
    if at >= 0:
        return image[:at], image[at:]
    slash = image.rfind("/")
    colon = image.rfind(":")
    return (image[:colon], image[colon:]) if colon > slash else (image, "")


def _set_images(objects: list[dict[str, Any]], images: list[dict[str, Any]]) -> None:
    for obj in objects:
        pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            name, suffix = _split_image(container["image"])
            for img in images:
                unknown = set(img) - {"name", "newName", "newTag"}
                if unknown:
                    raise KustomizeError(f"images: unsupported keys {sorted(unknown)}")
                if img["name"] == name:
                    new_suffix = f":{img['newTag']}" if "newTag" in img else suffix
                    container["image"] = f"{img.get('newName', name)}{new_suffix}"


def render(root: str | Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize <root>` would print, in resource order (kubectl sorts; compare as sets)."""
    root = Path(root)
    kfile = root / "kustomization.yaml"
    spec = yaml.safe_load(kfile.read_text())
    unknown = set(spec) - KNOWN_KEYS
    if unknown:
        raise KustomizeError(f"{kfile}: kustomize_lite does not implement {sorted(unknown)}")
    objects: list[dict[str, Any]] = []
    for res in spec.get("resources", []):
        path = (root / res).resolve()
        if not path.is_relative_to(root.resolve()) and not (path / "kustomization.yaml").is_file():
            raise KustomizeError(f"{res}: outside {root} (kustomize's load restrictor rejects it)")
        objects.extend(render(path) if path.is_dir() else _load_docs(path))
    if spec.get("configMapGenerator"):
        if not (spec.get("generatorOptions") or {}).get("disableNameSuffixHash"):
            raise KustomizeError("configMapGenerator needs generatorOptions.disableNameSuffixHash: true here")
        objects.extend(_config_map(root, g) for g in spec["configMapGenerator"])
    if spec.get("images"):
        _set_images(objects, spec["images"])
    namespace = spec.get("namespace")
    if namespace:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = namespace
    return objects


def identity(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return (str(obj.get("apiVersion")), str(obj.get("kind")), str(meta.get("namespace", "")), str(meta.get("name")))
