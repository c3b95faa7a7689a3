"""The stop-gap for a sidecar without cluster mode: copy MeshNode N from the API into the file the sidecar's
`--state FILE` mode watches. Used only while `aether.xds.kube_source` does not exist (see `cluster_mode()`)."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import threading
from pathlib import Path

from aether.e2e.kube import Kube

log = logging.getLogger("aether.e2e.bridge")


def cluster_mode() -> bool:
    """True when `aether xds --node N` (no --state) can watch the MeshNode itself."""
    return importlib.util.find_spec("aether.xds.kube_source") is not None


class MeshNodeFileBridge:
    def __init__(self, kubeconfig: str, node: str, path: Path, interval: float = 0.1) -> None:
        self.kube = Kube(kubeconfig)
        self.node = node
        self.path = path
        self.interval = interval
        self._stop = threading.Event()
        self._last: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"bridge-{node}", daemon=True)

    def start(self) -> None:
        self.copy_once()
        self._thread.start()

    def copy_once(self) -> bool:
        obj = self.kube.meshnode(self.node)
        if obj is None:
            return False
        doc = {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "metadata": {"name": self.node},
            "status": obj.get("status") or {},
        }
        text = json.dumps(doc, indent=1, sort_keys=True)
        if text == self._last:
            return False
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)
        self._last = text
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.copy_once()
            except Exception as exc:  # the API going away at shutdown is normal
                log.debug("bridge %s: %s", self.node, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.kube.close()
