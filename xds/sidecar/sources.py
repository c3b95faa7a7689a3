"""Where the desired state comes from (`StateSource`) and where the `Programmed` condition goes (`StatusSink`).

File mode: `FileSource` re-reads a state file when it changes (a MeshNode, or a `kind: List` holding the MeshNode
and its MeshServiceSlices); a bad file keeps the last good state (the sidecar says why in its log and in the
condition). `FileStatusSink` writes a MeshNode-shaped JSON holding
`status.conditions`. Cluster mode: `aether.xds.sidecar.kube_source` (the operator engineer's) provides
`source(node) -> StateSource` and `status_sink(node) -> StatusSink` with the same protocols.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aether.api.meshnode import (
    API_GROUP,
    API_VERSION,
    KIND,
    Condition,
    MeshNode,
    MeshNodeFileError,
)
from aether.api.slices import load_state_file
from aether.atomicfile import write_text_atomic


@dataclass(frozen=True)
class StateUpdate:
    """A new desired state (every arm in effect: api.slices.effective), or why the source could not produce one
    (`node` None, `error` set). `problems`: what of the state is missing or stale (MeshServiceSlices named but
    absent, from another split, refused by the model); the rest is served and the Programmed condition says so."""

    node: MeshNode | None
    error: str | None = None
    problems: tuple[str, ...] = ()


class StateSource(Protocol):
    def updates(self, stop: threading.Event) -> Iterator[StateUpdate]:
        """Yield an update at start and whenever the state changes, until `stop` is set."""
        ...


class StatusSink(Protocol):
    def publish(self, node_name: str, conditions: list[Condition]) -> None: ...


class FileSource:
    def __init__(self, path: str | os.PathLike[str], interval: float = 0.2, node: str | None = None) -> None:
        self.path, self.node = Path(path), node  # node: which MeshNode of a List holding several
        self.interval = interval

    def _fingerprint(self) -> str | None:
        try:
            return hashlib.blake2b(self.path.read_bytes(), digest_size=16).hexdigest()
        except OSError:
            return None

    def updates(self, stop: threading.Event) -> Iterator[StateUpdate]:
        last: str | None = "unset"
        while not stop.is_set():
            fp = self._fingerprint()
            if fp != last:
                last = fp
                try:
                    state = load_state_file(self.path, self.node)
                    yield StateUpdate(state.effective(), None, tuple(state.problems()))
                except MeshNodeFileError as exc:
                    yield StateUpdate(None, str(exc))
            stop.wait(self.interval)


def default_status_path(state: str | os.PathLike[str]) -> Path:
    return Path(f"{state}.status.json")


class FileStatusSink:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def publish(self, node_name: str, conditions: list[Condition]) -> None:
        doc = {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": KIND,
            "metadata": {"name": node_name},
            "status": {"conditions": [c.wire() for c in conditions]},
        }
        write_text_atomic(self.path, json.dumps(doc, indent=2))


def read_status_file(path: str | os.PathLike[str]) -> list[Condition]:
    doc = json.loads(Path(path).read_text())
    return [Condition.model_validate(c) for c in doc.get("status", {}).get("conditions", [])]
