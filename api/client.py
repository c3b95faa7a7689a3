"""API client helpers shared by the operator and the sidecar: the client for a kubeconfig (or in-cluster), the
API's error type, timestamps as the API spells them, and the user agents that name each component in audit logs."""

from __future__ import annotations

import datetime
from typing import Any

import kubernetes

ApiException = kubernetes.client.exceptions.ApiException


OPERATOR_USER_AGENT = "aether-operator"  # kopf's own requests say "kopf/<version>"


def api_client(
    kubeconfig: str | None, user_agent: str | None = None, pool: int | None = None
) -> kubernetes.client.ApiClient:
    """A client for the kubeconfig file, or the in-cluster service account when None. The user agent names
    the component in the API test bed's audit (what an RBAC test filters on)."""
    cfg = kubernetes.client.Configuration()
    if kubeconfig:
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        kubernetes.config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    if pool is not None:  # connections kept per host (urllib3's pool, made with the client)
        cfg.connection_pool_maxsize = pool
    client = kubernetes.client.ApiClient(cfg)
    if user_agent:
        client.user_agent = user_agent
    return client


def served_version(
    client: kubernetes.client.ApiClient, group: str, plural: str, preferred: tuple[str, ...]
) -> str | None:
    """The first of `preferred` whose discovery document (`/apis/<group>/<version>`) lists `plural`, None when the
    API serves none of them (the CRD is missing, or serves only other versions). Other API errors are raised.
    The discovery documents, not the CRD: they also say what an API server without CRDs (an aggregated API) serves."""
    for version in preferred:
        try:
            found: Any = kubernetes.client.CustomObjectsApi(client).get_api_resources(group, version)
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        if any(r.name == plural for r in getattr(found, "resources", None) or []):
            return version
    return None


def now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
