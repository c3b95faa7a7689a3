"""Snapshots and the per-node snapshot cache (shaped like go-control-plane's pkg/cache).

A `Snapshot` is one node's complete resource set with a content-hash version per resource (so a restarted
server computes the same versions and re-sends nothing unchanged) and the encoded bytes of each. The cache keeps
the current snapshot per node id plus the one before it (the fallback a NACKed state rolls back to) and tells
watchers (the open streams) when the node's snapshot changes.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aether.xds.codec import encode
from aether.xds.resources import KNOWN_TYPES, Resources

# Order in which a changed snapshot is pushed: clusters (and their endpoints) before the listeners that use them.
PUSH_ORDER = KNOWN_TYPES


@dataclass(frozen=True)
class Snapshot:
    version: str
    resources: Resources
    versions: dict[str, dict[str, str]]
    encoded: dict[str, dict[str, bytes]] = field(repr=False)

    def types(self) -> list[str]:
        known = [t for t in PUSH_ORDER if t in self.versions]
        return known + sorted(t for t in self.versions if t not in PUSH_ORDER)


def make_snapshot(resources: Resources, previous: Snapshot | None = None) -> Snapshot:
    """Encodes every resource and versions it by a hash of its bytes (deterministic serialization, so a restarted
    server computes the same versions). A resource that does not encode raises CodecError before anything is
    served. A resource dict that is the same object as in `previous` (builders memoize) reuses its bytes."""
    versions: dict[str, dict[str, str]] = {}
    encoded: dict[str, dict[str, bytes]] = {}
    for type_url, named in resources.items():
        prev_res = previous.resources.get(type_url, {}) if previous else {}
        prev_ver = previous.versions.get(type_url, {}) if previous else {}
        prev_enc = previous.encoded.get(type_url, {}) if previous else {}
        tv: dict[str, str] = {}
        te: dict[str, bytes] = {}
        for name, res in named.items():
            if prev_res.get(name) is res:
                tv[name] = prev_ver[name]
                te[name] = prev_enc[name]
            else:
                data = encode(type_url, res, name)
                te[name] = data
                tv[name] = hashlib.blake2b(data, digest_size=10).hexdigest()
        versions[type_url] = tv
        encoded[type_url] = te
    # the snapshot's version: over every (type, name, version) in builder order (deterministic for one input)
    digest = hashlib.blake2b(digest_size=10)
    for type_url in sorted(versions):
        digest.update(type_url.encode())
        digest.update("\n".join(map("\0".join, versions[type_url].items())).encode())
    return Snapshot(digest.hexdigest(), resources, versions, encoded)


Watcher = Callable[[], None]


class SnapshotCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: dict[str, Snapshot] = {}
        self._fallback: dict[str, Snapshot] = {}
        self._watchers: dict[str, list[Watcher]] = {}

    def get(self, node: str) -> Snapshot | None:
        with self._lock:
            return self._current.get(node)

    def fallback(self, node: str) -> Snapshot | None:
        with self._lock:
            return self._fallback.get(node)

    def set_snapshot(self, node: str, snapshot: Snapshot) -> bool:
        """Install a snapshot; returns False (and notifies nobody) when its content equals the current one."""
        with self._lock:
            cur = self._current.get(node)
            if cur is not None and cur.version == snapshot.version:
                return False
            if cur is not None:
                self._fallback[node] = cur
            self._current[node] = snapshot
            watchers = list(self._watchers.get(node, ()))
        for w in watchers:
            w()
        return True

    def rollback(self, node: str, bad_version: str) -> Snapshot | None:
        """If the current snapshot is `bad_version`, restore the one before it; returns the restored one."""
        with self._lock:
            cur = self._current.get(node)
            prev = self._fallback.get(node)
            if cur is None or cur.version != bad_version or prev is None:
                return None
            self._current[node] = prev
            del self._fallback[node]
            watchers = list(self._watchers.get(node, ()))
        for w in watchers:
            w()
        return prev

    def watch(self, node: str, watcher: Watcher) -> Callable[[], None]:
        with self._lock:
            self._watchers.setdefault(node, []).append(watcher)

        def cancel() -> None:
            with self._lock:
                lst = self._watchers.get(node, [])
                if watcher in lst:
                    lst.remove(watcher)

        return cancel

    def nodes(self) -> list[str]:
        with self._lock:
            return sorted(self._current)


def versions_of(snapshot: Snapshot | None, type_url: str) -> Mapping[str, str]:
    return snapshot.versions.get(type_url, {}) if snapshot else {}
