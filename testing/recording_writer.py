"""A recording stand-in for the operator's KubeWriter: its MeshNode and MeshServiceSlice methods on dicts, no API
client (a method not overridden here fails loudly). For tests of the reconcile loop on its own; the API side is
covered by the contract tests against a real kube-apiserver."""

from __future__ import annotations

from typing import Any

from aether.api.client import ApiException
from aether.operator.kubeapi import KubeWriter
from aether.testing.apitestbed.patches import json_patch

SLICE_LABELS = {"app.kubernetes.io/managed-by": "aether-operator"}


class RecordingWriter(KubeWriter):
    """Writes land in `meshnodes` and `slices`; `patches` names each MeshNode status written and `slice_writes`
    each slice created or patched, when `record` (off: only `status_writes` counts, so nothing grows with writes).
    The first `fail_first` status writes raise a 500."""

    def __init__(self, fail_first: int = 0, record: bool = True) -> None:  # no super().__init__: no API client
        self.meshnodes: dict[str, dict[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.patches: list[str] = []
        self.slice_writes: list[str] = []
        self.fail_first, self.record, self.status_writes = fail_first, record, 0

    def get_meshnode(self, name: str) -> dict[str, Any] | None:
        return self.meshnodes.get(name)

    def create_meshnode(self, name: str, node_uid: str) -> dict[str, Any]:
        self.meshnodes[name] = {"metadata": {"name": name, "resourceVersion": "1"}, "status": {}}
        return self.meshnodes[name]

    def apply_meshnode_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        if self.fail_first:
            self.fail_first -= 1
            raise ApiException(status=500, reason="boom")
        self.status_writes += 1
        if self.record:
            self.patches.append(name)
        self.meshnodes[name]["status"] = status
        return self.meshnodes[name]

    def delete_meshnode(self, name: str) -> None:
        self.meshnodes.pop(name, None)

    def get_route(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def get_slice(self, name: str) -> dict[str, Any] | None:
        return self.slices.get(name)

    def create_slice(self, name: str, spec: dict[str, Any], namespace_uid: str | None) -> dict[str, Any]:
        labels = {**SLICE_LABELS, "mesh.aether.dev/namespace": spec["namespace"]}
        self.slices[name] = {"metadata": {"name": name, "resourceVersion": "1", "labels": labels}, "spec": spec}
        self._wrote(name)
        return self.slices[name]

    def patch_slice(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        self.slices[name] = json_patch(self.slices[name], ops)
        self._wrote(name)
        return self.slices[name]

    def delete_slice(self, name: str) -> None:
        self.slices.pop(name, None)

    def _wrote(self, name: str) -> None:
        if self.record:
            self.slice_writes.append(name)
