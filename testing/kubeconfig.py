"""The one kubeconfig writer of the test support: one cluster, one user, one context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def write_kubeconfig(
    path: Path, server: str, user: dict[str, Any], name: str, ca: Path | None = None, namespace: str = "default"
) -> Path:
    """`user` is the kubeconfig's user entry (`{"token": ...}`, `{"client-certificate": ..., "client-key": ...}`,
    or `{}`); `ca` the server's CA bundle when it is TLS."""
    cluster: dict[str, Any] = {"server": server}
    if ca is not None:
        cluster["certificate-authority"] = str(ca)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
