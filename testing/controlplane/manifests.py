"""Manifests on the pinned tools instead of copies of them: `kubectl kustomize` renders a kustomization, the server's
own `--dry-run=server` (strict field validation) validates objects, and a SubjectAccessReview asks the server's RBAC
authorizer what a ServiceAccount may do."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Any, NamedTuple

import kubernetes.client
import yaml

from aether.api.client import api_client
from aether.testing.controlplane.binaries import tool
from aether.testing.controlplane.cluster import ControlPlane
from aether.testing.wait import wait_for


class Request(NamedTuple):
    """An API request as the authorizer sees it (`list` vs `watch` by the `watch` query, a status patch as
    `patch` of `meshnodes` with subresource `status`)."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    name: str = ""


def kustomize(root: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize <root>` by the pinned kubectl: the objects in kubectl's order (ControlPlaneMissing unbuilt)."""
    out = subprocess.run([tool("kubectl"), "kustomize", str(root)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {root} failed ({out.returncode}): {out.stderr.strip()}")
    return [o for o in yaml.safe_load_all(out.stdout) if o]


def identity(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    """(apiVersion, kind, namespace, name) of an object."""
    meta = obj.get("metadata") or {}
    return (str(obj.get("apiVersion")), str(obj.get("kind")), str(meta.get("namespace", "")), str(meta.get("name")))


def dry_run(cp: ControlPlane, objects: list[dict[str, Any]]) -> str:
    """The server's verdict on creating or updating `objects` (server-side apply, `--dry-run=server`,
    `--validate=strict`: unknown and duplicate fields are errors): '' when it accepts them all, else kubectl's
    stderr, which names each refused object and field."""
    # YAML documents, each sent to the server as it is (a `kind: List` kubectl validates itself first, against the
    # schema it downloads: then the refusal is the client's)
    body = yaml.safe_dump_all(objects)
    out = cp.kubectl(
        "apply", "--server-side", "--dry-run=server", "--validate=strict", "-f", "-", input=body, check=False
    )
    return "" if out.returncode == 0 else out.stderr.strip()


def service_account(namespace: str, name: str) -> tuple[str, list[str]]:
    """The user name and groups the API server authenticates a ServiceAccount's token as."""
    return f"system:serviceaccount:{namespace}:{name}", [
        "system:serviceaccounts",
        f"system:serviceaccounts:{namespace}",
        "system:authenticated",
    ]


def grant(cp: ControlPlane, namespace: str, account: str, rules: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """A ClusterRole `account` holding `rules`, bound to ServiceAccount <namespace>/<account>: that account's user."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": account}}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": account},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    cp.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all([{**role, "rules": rules}, binding]))
    return service_account(namespace, account)


class Authorizer:
    """SubjectAccessReviews on `cp` as its admin: does `user` (in `groups`) get `request`?"""

    def __init__(self, cp: ControlPlane) -> None:
        self.api = kubernetes.client.AuthorizationV1Api(api_client(str(cp.kubeconfig_path)))

    def allows(self, user: tuple[str, list[str]], request: Request) -> bool:
        attributes = kubernetes.client.V1ResourceAttributes(
            verb=request.verb,
            group=request.group,
            resource=request.resource,
            subresource=request.subresource or None,
            name=request.name or None,
        )
        review = kubernetes.client.V1SubjectAccessReview(
            spec=kubernetes.client.V1SubjectAccessReviewSpec(
                user=user[0], groups=user[1], resource_attributes=attributes
            )
        )
        answer = self.api.create_subject_access_review(review)
        return answer.status is not None and bool(answer.status.allowed)

    def denied(self, user: tuple[str, list[str]], requests: list[Request]) -> list[Request]:
        """The requests `user` is not allowed, sorted, without duplicates."""
        return sorted({r for r in requests if not self.allows(user, r)})

    def settled(
        self, user: tuple[str, list[str]], requests: list[Request], want: list[Request], timeout: float = 20
    ) -> list[Request]:
        """`denied` once the server's RBAC caches hold a new role and binding (informers: an answer can lag the
        write by a moment): polled until it is `want` or `timeout` passed, then returned as it is."""
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: self.denied(user, requests) == want, timeout, what="the RBAC authorizer to see the role")
        return self.denied(user, requests)
