"""The operator's writes to the API (thin, sync, through the official client): MeshNodes, MeshNode status,
MeshServiceSlices, UDPRoute status, Events. MeshNode status is a server-side apply under the operator's own field
manager (it shares the status with the node's sidecar, each owning its fields); a UDPRoute's status.parents (an
atomic list shared with other controllers) and a slice's JSON patch carry a resourceVersion precondition."""

from __future__ import annotations

from typing import Any

import kubernetes

from aether.api.client import ApiException, now
from aether.api.meshnode import API_GROUP, API_VERSION, KIND, PLURAL
from aether.api.multicluster import MCS_GROUP, MCS_VERSION
from aether.api.slices import MANAGED_BY, MANAGED_BY_LABEL, NAMESPACE_LABEL, SLICE_KIND, SLICE_PLURAL

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
FIELD_MANAGER = "aether-operator"  # server-side apply: the operator's fields of a MeshNode status
GATEWAY_GROUP, UDPROUTES = "gateway.networking.k8s.io", "udproutes"
# the UDPRoute versions the operator can serve, most preferred first (Gateway API v1.6: v1 is GA and the storage
# version, the standard channel serves only v1, the experimental channel v1 and the deprecated v1alpha2)
UDPROUTE_VERSIONS = ("v1", "v1alpha2")


class KubeWriter:
    def __init__(self, client: kubernetes.client.ApiClient, route_version: str = UDPROUTE_VERSIONS[0]) -> None:
        self.route_version = route_version  # the UDPRoute version watched: reads and status writes go through it
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.core = kubernetes.client.CoreV1Api(client)

    # ---- our cluster-scoped kinds ------------------------------------------------------------
    def _get(self, plural: str, name: str) -> dict[str, Any] | None:
        try:
            obj: Any = self.custom.get_cluster_custom_object(API_GROUP, API_VERSION, plural, name)
            return dict(obj)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _delete(self, plural: str, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(API_GROUP, API_VERSION, plural, name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    # ---- MeshNodes ---------------------------------------------------------------------------
    def get_meshnode(self, name: str) -> dict[str, Any] | None:
        return self._get(PLURAL, name)

    def create_meshnode(self, name: str, node_uid: str) -> dict[str, Any]:
        body = {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": KIND,
            "metadata": {
                "name": name,
                "labels": {MANAGED_BY_LABEL: MANAGED_BY},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid, "blockOwnerDeletion": False}
                ],
            },
            "spec": {},
        }
        try:
            obj: Any = self.custom.create_cluster_custom_object(API_GROUP, API_VERSION, PLURAL, body)
            return dict(obj)
        except ApiException as exc:
            if exc.status == 409:
                existing = self.get_meshnode(name)
                if existing is not None:
                    return existing
            raise

    def apply_meshnode_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of the operator's fields (forced: the operator is their one owner)."""
        body = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "metadata": {"name": name}, "status": status}
        obj: Any = self.custom.patch_cluster_custom_object_status(
            API_GROUP, API_VERSION, PLURAL, name, body, field_manager=FIELD_MANAGER, force=True, _content_type=APPLY
        )
        return dict(obj)

    def delete_meshnode(self, name: str) -> None:
        self._delete(PLURAL, name)

    # ---- MeshServiceSlices ---------------------------------------------------------------------
    def get_slice(self, name: str) -> dict[str, Any] | None:
        return self._get(SLICE_PLURAL, name)

    def create_slice(self, name: str, spec: dict[str, Any], namespace_uid: str | None) -> dict[str, Any]:
        """A slice owned by its Namespace (garbage-collected with it), labelled with the namespace."""
        meta: dict[str, Any] = {"name": name, "labels": slice_labels(spec)}
        if namespace_uid:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "name": spec["namespace"],
                    "uid": namespace_uid,
                    "blockOwnerDeletion": False,
                }
            ]
        body = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": SLICE_KIND, "metadata": meta, "spec": spec}
        obj: Any = self.custom.create_cluster_custom_object(API_GROUP, API_VERSION, SLICE_PLURAL, body)
        return dict(obj)

    def patch_slice(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        obj: Any = self.custom.patch_cluster_custom_object(
            API_GROUP, API_VERSION, SLICE_PLURAL, name, ops, _content_type=JSON_PATCH
        )
        return dict(obj)

    def delete_slice(self, name: str) -> None:
        self._delete(SLICE_PLURAL, name)

    # ---- UDPRoutes ---------------------------------------------------------------------------
    def get_route(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: Any = self.custom.get_namespaced_custom_object(
                GATEWAY_GROUP, self.route_version, namespace, UDPROUTES, name
            )
            return dict(obj)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_route_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            GATEWAY_GROUP, self.route_version, namespace, UDPROUTES, name, patch, _content_type=MERGE
        )

    def post_cluster_event(self, type_: str, reason: str, message: str) -> None:
        """An Event about the UDPRoute CRD (cluster-scoped, so in `default`, as kube-apiserver files such Events)."""
        self._event(
            "default",
            f"{GATEWAY_GROUP}.",
            type_,
            reason,
            message,
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "name": f"{UDPROUTES}.{GATEWAY_GROUP}",
            },
        )

    def post_event(self, route: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self._event_about(
            route, f"{GATEWAY_GROUP}/{self.route_version}", "UDPRoute", "udproute", type_, reason, message
        )

    def post_policy_event(self, policy: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self._event_about(
            policy, f"{API_GROUP}/{API_VERSION}", "MeshAuthorizationPolicy", "policy", type_, reason, message
        )

    def post_mcs_event(self, kind: str, meta: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event about a ServiceExport or ServiceImport (`meta`: its namespace, name, uid)."""
        self._event_about({"metadata": meta}, f"{MCS_GROUP}/{MCS_VERSION}", kind, kind.lower(), type_, reason, message)

    def _event_about(
        self, obj: dict[str, Any], api_version: str, kind: str, fallback: str, type_: str, reason: str, message: str
    ) -> None:
        """An Event about namespaced object `obj` (of `api_version`, `kind`), in its namespace, named after it."""
        meta = obj.get("metadata") or {}
        involved = {
            "apiVersion": api_version,
            "kind": kind,
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        }
        self._event(str(meta.get("namespace")), f"{meta.get('name', fallback)}.", type_, reason, message, involved)

    def _event(
        self, namespace: str, prefix: str, type_: str, reason: str, message: str, involved: dict[str, Any]
    ) -> None:
        stamp = now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": prefix, "namespace": namespace},
            "involvedObject": involved,
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "aether-operator"},
            "reportingComponent": "aether-operator",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self.core.create_namespaced_event(namespace, body)  # type: ignore[arg-type]  # the stubs want a V1Event; it sends dicts as they are


def slice_labels(spec: dict[str, Any]) -> dict[str, str]:
    return {MANAGED_BY_LABEL: MANAGED_BY, NAMESPACE_LABEL: str(spec["namespace"])}
