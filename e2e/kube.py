"""The harness's hands on the API: what a user applies, and the parts of a cluster no controller plays here (the
scheduler and the kubelet; the EndpointSlices of selector-less Services), through the official client.

Every call goes through the kubeconfig, so the same code drives a real cluster."""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Sequence
from typing import Any

import kubernetes

from aether.api import authz
from aether.api.client import api_client
from aether.api.meshnode import API_GROUP, API_VERSION, PLURAL, parse_meshnode
from aether.api.slices import SLICE_PLURAL, NodeState, parse_slice
from aether.operator.reconcile.views import GATEWAY_GROUP
from aether.testing.apitestbed import objects as o
from aether.testing.wait import wait_for

MERGE = "application/merge-patch+json"
ApiException = kubernetes.client.exceptions.ApiException
PORT_NAMES = {"UDP": "udp", "TCP": "http"}


class Kube:
    """Thin, sync; raw dicts in, plain values out."""

    def __init__(self, kubeconfig: str) -> None:
        self.client = api_client(kubeconfig)
        # Any: the generated signatures ask for model classes; raw dicts in API shape are what we pass
        self.core: Any = kubernetes.client.CoreV1Api(self.client)
        self.discovery: Any = kubernetes.client.DiscoveryV1Api(self.client)
        self.custom: Any = kubernetes.client.CustomObjectsApi(self.client)
        self._v6_slices: set[tuple[str, str]] = set()  # (namespace, name) of the IPv6 EndpointSlices written

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]

    # -- what a user applies ---------------------------------------------------------------------
    def namespace(self, name: str) -> None:
        self.core.create_namespace(o.namespace(name, meshed=True))

    def node(self, name: str) -> None:
        self.core.create_node(o.node(name))

    def service(self, ns: str, name: str, vip: str, port: int, protocol: str = "UDP", vip6: str | None = None) -> None:
        """A Service whose ClusterIP the harness assigned (the emulator allocates none); one port. With `vip6`, a
        dual-stack one (RequireDualStack, clusterIPs [vip, vip6]); an IPv6 `vip` alone is a single-stack IPv6 one."""
        ipaddress.ip_address(vip)
        body = o.service(ns, name, vip, [(PORT_NAMES[protocol], port, protocol)])
        vips = [vip] if vip6 is None else [vip, str(ipaddress.IPv6Address(vip6))]
        body["spec"]["clusterIPs"] = vips
        body["spec"]["ipFamilies"] = ["IPv6" if ":" in v else "IPv4" for v in vips]
        body["spec"]["ipFamilyPolicy"] = "RequireDualStack" if vip6 else "SingleStack"
        self.core.create_namespaced_service(ns, body)

    def annotate_service(self, ns: str, name: str, annotations: dict[str, str | None]) -> None:
        """Set (or, with None, remove) annotations on a Service, as `kubectl annotate` does."""
        self.core.patch_namespaced_service(name, ns, {"metadata": {"annotations": annotations}})

    def udproute(self, ns: str, name: str, parent: str, backend: str, port: int) -> None:
        body = o.udproute(ns, name, parent, [o.backend(backend, port)])
        self.custom.create_namespaced_custom_object(GATEWAY_GROUP, "v1alpha2", ns, "udproutes", body)

    def weighted_udproute(
        self, ns: str, name: str, parent: str, weights: dict[str, int], port: int, version: str = "v1alpha2"
    ) -> None:
        """Create UDPRoute `name` (through `version`) with these weighted backendRefs, or replace its rules."""
        refs = [o.backend(b, port, weight=w) for b, w in weights.items()]
        try:
            body = o.udproute(ns, name, parent, refs, version=version)
            self.custom.create_namespaced_custom_object(GATEWAY_GROUP, version, ns, "udproutes", body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            patch = {"spec": {"rules": [{"backendRefs": refs}]}}
            self.custom.patch_namespaced_custom_object(
                GATEWAY_GROUP, version, ns, "udproutes", name, patch, _content_type=MERGE
            )

    def udproute_as(self, ns: str, name: str, version: str) -> dict[str, Any]:
        """The whole route read through API `version`."""
        obj: Any = self.custom.get_namespaced_custom_object(GATEWAY_GROUP, version, ns, "udproutes", name)
        return dict(obj)

    def repoint_udproute(self, ns: str, name: str, backend: str, port: int) -> None:
        patch = {"spec": {"rules": [{"backendRefs": [o.backend(backend, port)]}]}}
        self.custom.patch_namespaced_custom_object(
            GATEWAY_GROUP, "v1alpha2", ns, "udproutes", name, patch, _content_type=MERGE
        )

    def udproute_status(self, ns: str, name: str) -> dict[str, Any]:
        obj: Any = self.custom.get_namespaced_custom_object(GATEWAY_GROUP, "v1alpha2", ns, "udproutes", name)
        status: dict[str, Any] = dict(obj).get("status") or {}
        return status

    def authorization_policy(self, ns: str, name: str, service: str, sources: list[str]) -> None:
        """A MeshAuthorizationPolicy: only `sources` (SPIFFE IDs) may call Service `service` (create or replace)."""
        body = o.authorization_policy(ns, name, [service], [{"from": sources}])
        try:
            self.custom.create_namespaced_custom_object(API_GROUP, API_VERSION, ns, authz.PLURAL, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.custom.patch_namespaced_custom_object(
                API_GROUP, API_VERSION, ns, authz.PLURAL, name, {"spec": body["spec"]}, _content_type=MERGE
            )

    def policy_condition(self, ns: str, name: str, kind: str = "Accepted", timeout: float = 30.0) -> str | None:
        """`<status>/<reason>` of condition `kind` the operator wrote on MeshAuthorizationPolicy `name` (waits)."""

        def cond() -> str | None:
            obj: Any = self.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, ns, authz.PLURAL, name)
            found = [c for c in (dict(obj).get("status") or {}).get("conditions") or [] if c.get("type") == kind]
            return f"{found[0]['status']}/{found[0]['reason']}" if found else None

        with contextlib.suppress(TimeoutError):
            return wait_for(cond, timeout, f"MeshAuthorizationPolicy {ns}/{name} condition {kind}")
        return None

    # -- what the scheduler, kubelet and controllers would do ---------------------------------------
    def pod(self, ns: str, name: str, node: str, sa: str = "default") -> str:
        """Create a pod already bound to `node` (the scheduler's part), and its ServiceAccount first when missing (as
        a workload's manifests ship it: ServiceAccount admission refuses a Pod without one); returns its uid."""
        try:
            self.core.create_namespaced_service_account(ns, {"metadata": {"name": sa, "namespace": ns}})
        except ApiException as exc:
            if exc.status != 409:
                raise
        created = self.core.create_namespaced_pod(ns, o.pod(ns, name, node, sa))
        uid: str = created.metadata.uid
        return uid

    def pod_deleting(self, ns: str, name: str) -> None:
        """A user's `kubectl delete pod`: a graceful delete, which only marks the object (deletionTimestamp) until
        the kubelet has stopped the pod."""
        self.core.delete_namespaced_pod(name, ns)

    def pod_gone(self, ns: str, name: str, uid: str) -> None:
        """The kubelet's last word on a pod it stopped and tore down: a delete with grace period 0, for this uid only
        (a pod made since under the same name is not touched), which removes the object; returns once it is gone.
        Without it a deleted pod stays Terminating in the API for good, and everything that lists pods holds it."""
        with contextlib.suppress(ApiException):  # 404: already gone; 409: the uid is another pod's
            self.core.delete_namespaced_pod(name, ns, body={"gracePeriodSeconds": 0, "preconditions": {"uid": uid}})

        def gone() -> bool:
            try:
                return bool(self.core.read_namespaced_pod(name, ns).metadata.uid != uid)
            except ApiException as exc:
                if exc.status == 404:
                    return True
                raise

        wait_for(gone, 30.0, f"pod {ns}/{name} gone from the API")

    def pod_running(self, ns: str, name: str, ips: Sequence[str]) -> None:
        """The kubelet's part after CNI ADD: podIPs (one per family, podIP the first) and phase Running (through
        the status subresource)."""
        self.core.patch_namespaced_pod_status(name, ns, o.pod_status(ips[0], also=ips[1:]), _content_type=MERGE)

    def endpoint_slice(
        self,
        ns: str,
        svc: str,
        port: int,
        ready: list[tuple[str, str]],
        protocol: str = "UDP",
        terminating: Sequence[tuple[str, str]] = (),
    ) -> None:
        """The EndpointSlice controller's part: one slice per Service, ready (ip, pod name) endpoints, and
        `terminating` ones (pods being deleted, still serving: ready false, serving and terminating true)."""
        ports: list[o.Port] = [(PORT_NAMES[protocol], port, protocol)]
        states: list[tuple[str, o.EndpointState, str | None]] = [(ip, True, pod) for ip, pod in ready]
        states += [(ip, o.SERVING_TERMINATING, pod) for ip, pod in terminating]
        # one slice per address type, as the controller writes them: <svc>-1 (IPv4, always) and <svc>-ipv6
        for family, name in (("IPv4", f"{svc}-1"), ("IPv6", f"{svc}-ipv6")):
            mine = [st for st in states if ("IPv6" if ":" in st[0] else "IPv4") == family]
            if family == "IPv6" and not mine:
                if (ns, name) in self._v6_slices:  # the Service's pods lost their IPv6 addresses
                    self._v6_slices.discard((ns, name))
                    self.delete_endpoint_slice(ns, name)
                continue
            if family == "IPv6":
                self._v6_slices.add((ns, name))
            body = o.endpoint_slice(ns, svc, ports, mine, name=name)
            body["addressType"] = family
            self._put_slice(ns, name, body)

    def _put_slice(self, ns: str, name: str, body: dict[str, Any]) -> None:
        try:
            self.discovery.replace_namespaced_endpoint_slice(name, ns, body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.discovery.create_namespaced_endpoint_slice(ns, body)

    def delete_endpoint_slice(self, ns: str, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.discovery.delete_namespaced_endpoint_slice(name, ns)

    # -- what the operator wrote ---------------------------------------------------------------------
    def meshnode(self, name: str) -> dict[str, Any] | None:
        """MeshNode `name` with every arm in effect inline: its MeshServiceSlices read as the sidecar reads them
        (api.slices.effective). `stored_meshnode` is the object as stored."""
        obj = self.stored_meshnode(name)
        if obj is None:
            return None
        held = {n: parse_slice(s, n) for n, s in self.slices().items()}
        whole: dict[str, Any] = NodeState(parse_meshnode(obj, f"MeshNode/{name}"), held).effective().wire()
        whole["metadata"] = obj.get("metadata") or {}
        return whole

    def slices(self) -> dict[str, dict[str, Any]]:
        listed: Any = self.custom.list_cluster_custom_object(API_GROUP, API_VERSION, SLICE_PLURAL)
        return {i["metadata"]["name"]: i for i in dict(listed).get("items") or []}

    def delete_slice(self, name: str) -> None:
        self.custom.delete_cluster_custom_object(API_GROUP, API_VERSION, SLICE_PLURAL, name)

    def stored_meshnode(self, name: str) -> dict[str, Any] | None:
        try:
            obj: Any = self.custom.get_cluster_custom_object(API_GROUP, API_VERSION, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(obj)

    def wait_meshnode(
        self, name: str, pred: Any, timeout: float = 60.0, what: str = "MeshNode status"
    ) -> dict[str, Any]:
        """Poll MeshNode `name` until pred(obj) holds; returns it."""

        def matching() -> dict[str, Any] | None:
            obj = self.meshnode(name)
            return obj if obj is not None and pred(obj) else None

        return wait_for(
            matching, timeout, f"{what} on MeshNode {name}", diagnose=lambda: f"last: {self.meshnode(name)}"
        )


def udp_arms(meshnode: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """VIP -> the arm, from a MeshNode body."""
    arms = ((meshnode.get("status") or {}).get("udp") or {}).get("services") or []
    return {a["vip"]: a for a in arms}


def pod_uids(meshnode: dict[str, Any]) -> set[str]:
    return {p["uid"] for p in (meshnode.get("status") or {}).get("pods") or []}
