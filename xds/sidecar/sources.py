"""Where the desired state comes from (`StateSource`) and where the `Programmed` condition goes (`StatusSink`).

File mode: `FileSource` re-reads a state file when it changes (a MeshNode, or a `kind: List` holding the MeshNode,
its MeshServiceSlices and MeshAuthorizationPolicies: `aether.api.slices`, `aether.api.statefile`); a bad file keeps
the last good state (the sidecar says why in its log and in the condition). `FileStatusSink` writes a MeshNode-shaped
JSON holding the
sidecar's `status.conditions` (merged by type) and its `status.quic` pair fields; a restarted sidecar starts its
pair machine from that file when it holds pairs (`stored_pairs`), else from the state file's. Cluster mode: `aether.xds.sidecar.kube_source` (the operator engineer's) provides
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
from typing import Any, Protocol

from aether.api.authz import KIND as POLICY_KIND
from aether.api.meshnode import (
    API_GROUP,
    API_VERSION,
    KIND,
    Condition,
    MeshNode,
    MeshNodeFileError,
    QuicPair,
)
from aether.api.slices import load_state_file
from aether.atomicfile import write_text_atomic


@dataclass(frozen=True)
class StateUpdate:
    """A new desired state (every arm in effect: api.slices.effective), or why the source could not produce one
    (`node` None, `error` set). `problems`: what of the state is missing or stale (MeshServiceSlices named but
    absent, from another split, refused by the model); the rest is served and the Programmed condition says so.
    `policies`: the MeshAuthorizationPolicy bodies that came with it (a state file's List), None when the source
    carries none (cluster mode reads them apart: `aether.xds.sidecar.kube_policies`)."""

    node: MeshNode | None
    error: str | None = None
    problems: tuple[str, ...] = ()
    policies: tuple[dict[str, Any], ...] | None = None


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
                    policies = tuple(state.others.get(POLICY_KIND, ()))
                    yield StateUpdate(state.effective(), None, tuple(state.problems()), policies)
                except MeshNodeFileError as exc:
                    yield StateUpdate(None, str(exc))
            stop.wait(self.interval)


def default_status_path(state: str | os.PathLike[str]) -> Path:
    return Path(f"{state}.status.json")


class FileStatusSink:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conditions: dict[str, dict[str, object]] = {}
        self._quic: dict[str, Any] = {}  # the status file's `status.quic` pair fields, as JSON
        try:
            status = json.loads(self.path.read_text()).get("status", {})
            self._quic = {k: v for k, v in (status.get("quic") or {}).items()}
        except (OSError, ValueError, AttributeError):
            pass

    def _write(self, node_name: str) -> None:
        status: dict[str, object] = {"conditions": list(self._conditions.values())}
        if self._quic:
            status["quic"] = self._quic
        doc = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "metadata": {"name": node_name}}
        write_text_atomic(self.path, json.dumps({**doc, "status": status}, indent=2))

    def publish(self, node_name: str, conditions: list[Condition]) -> None:
        with self._lock:
            for c in conditions:
                self._conditions[c.type] = c.wire()
            self._write(node_name)

    def publish_pairs(self, node_name: str, pairs: list[QuicPair], dormant: list[QuicPair]) -> None:
        with self._lock:
            self._quic = {
                "pairs": [p.wire() for p in pairs],
                "dormantPairs": [p.wire() for p in dormant],
                "pairCount": len(pairs),
                "dormantPairCount": len(dormant),
            }
            self._write(node_name)

    def stored_pairs(self, node_name: str) -> tuple[list[QuicPair], list[QuicPair]] | None:
        """What an earlier sidecar wrote here (None when nothing: then the state file's pairs)."""
        quic = self._quic
        if not quic.get("pairs") and not quic.get("dormantPairs"):
            return None
        try:
            pairs = [QuicPair.model_validate(p) for p in quic.get("pairs") or []]
            dormant = [QuicPair.model_validate(p) for p in quic.get("dormantPairs") or []]
        except ValueError:
            return None
        return pairs, dormant


def read_status_pairs(path: str | os.PathLike[str]) -> dict[str, object]:
    """The `status.quic` pair fields of a status file (tests, the demo)."""
    quic = json.loads(Path(path).read_text()).get("status", {}).get("quic") or {}
    return dict(quic)


def read_status_file(path: str | os.PathLike[str]) -> list[Condition]:
    doc = json.loads(Path(path).read_text())
    return [Condition.model_validate(c) for c in doc.get("status", {}).get("conditions", [])]
