"""Callers other than the admin on the test control plane: a kubeconfig carrying a ServiceAccount's token from the
TokenRequest API (`kubectl create token`), optionally bound to a Pod (then the token carries the Pod's node as
`authentication.kubernetes.io/node-name`, as the projected token of a DaemonSet pod does), so a component runs under
exactly the RBAC and admission a cluster gives its ServiceAccount; or a client certificate from the control plane's
own CA (`certificate_kubeconfig`: e.g. a kubelet as `system:node:<name>` in `system:nodes`, e2e/kubelet)."""

from __future__ import annotations

from pathlib import Path

from aether.testing import kubeconfig
from aether.testing.controlplane.cluster import ControlPlane, write_kubeconfig


def token(cp: ControlPlane, namespace: str, account: str, bound_pod: tuple[str, str] | None = None) -> str:
    """A token for ServiceAccount `namespace/account`; `bound_pod` (name, uid) binds it to that Pod."""
    args = ["create", "token", account, "-n", namespace, "--duration", "2h"]
    if bound_pod is not None:
        args += ["--bound-object-kind", "Pod", "--bound-object-name", bound_pod[0], "--bound-object-uid", bound_pod[1]]
    return cp.kubectl(*args).stdout.strip()


def token_kubeconfig(cp: ControlPlane, path: Path, bearer: str, name: str = "aether-sa") -> Path:
    """A kubeconfig for the control plane that authenticates with `bearer` (and trusts the cluster CA)."""
    return kubeconfig.write_kubeconfig(path, cp.url, {"token": bearer}, name, cp.ca_path)


def certificate_kubeconfig(cp: ControlPlane, path: Path, user: str, groups: tuple[str, ...] = ()) -> Path:
    """A kubeconfig for the control plane that authenticates as `user` in `groups` with a client certificate its CA
    signed (files beside `path`)."""
    if cp.authority is None:
        raise RuntimeError("the control plane has not booted: no CA to sign with")
    pair = cp.authority.issue(path.stem, user, groups=groups)
    return write_kubeconfig(path, cp.url, cp.ca_path, pair)
