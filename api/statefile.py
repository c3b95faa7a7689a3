"""A node's state file (`aether xds --state FILE`, `aether xds render --state FILE`): one MeshNode object, or a
`kind: List` whose items are one MeshNode and the other objects the sidecar reads (MeshAuthorizationPolicies), as
`kubectl get ... -o yaml` prints several objects.

`split_items` is the one place that takes a List apart; `load_state_file` reads, parses and validates the MeshNode
and hands the other items back by kind, unparsed (each reader validates its own kind)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aether.api.meshnode import KIND, MeshNode, MeshNodeFileError, parse_meshnode, read_document

LIST_KINDS = ("List", "MeshNodeList")


def split_items(data: Any, source: str, node: str | None = None) -> tuple[Any, dict[str, list[dict[str, Any]]]]:
    """-> (the MeshNode body, {kind: [object, ...]} of the other items). A List must hold exactly one MeshNode, or
    several and `node` names one (`kubectl get mn,mss -o yaml`); an item without a kind is an error (it names it)."""
    if not isinstance(data, dict) or data.get("kind") not in LIST_KINDS:
        return data, {}
    items = data.get("items")
    if not isinstance(items, list):
        raise MeshNodeFileError(f"{source}: items: a {data.get('kind')} needs a list of items")
    nodes: list[Any] = []
    others: dict[str, list[dict[str, Any]]] = {}
    for i, item in enumerate(items):
        kind = item.get("kind") if isinstance(item, dict) else None
        if not isinstance(kind, str) or not kind:
            raise MeshNodeFileError(f"{source}: items[{i}]: not an object with a kind")
        if kind == KIND:
            nodes.append(item)
        else:
            others.setdefault(kind, []).append(item)
    if node is not None and len(nodes) > 1:
        nodes = [n for n in nodes if isinstance(n.get("metadata"), dict) and n["metadata"].get("name") == node]
        if not nodes:
            raise MeshNodeFileError(f"{source}: items: no MeshNode named {node!r}")
    if len(nodes) != 1:
        more = "; --node picks one" if len(nodes) > 1 else ""
        raise MeshNodeFileError(f"{source}: items: a state List holds exactly one MeshNode, found {len(nodes)}{more}")
    return nodes[0], others


def load_state_file(path: str | Path) -> tuple[MeshNode, dict[str, list[dict[str, Any]]]]:
    p = Path(path)
    data = read_document(p)
    if not isinstance(data, dict):
        raise MeshNodeFileError(f"{p}: <root>: expected a MeshNode object or a List, got {type(data).__name__}")
    node, others = split_items(data, str(p))
    return parse_meshnode(node, str(p)), others
