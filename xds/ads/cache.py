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
from itertools import compress
from operator import is_not
from typing import Final

from aether.xds.codec.protojson import encode
from aether.xds.resources import KNOWN_TYPES, Resources

# Order in which a changed snapshot is pushed: clusters (and their endpoints) before the listeners that use them.
PUSH_ORDER = KNOWN_TYPES


@dataclass(frozen=True)
class Snapshot:
    version: str
    resources: Resources
    versions: dict[str, dict[str, str]]
    encoded: dict[str, dict[str, bytes]] = field(repr=False)
    # per type: XOR of _mix(name, version) over its resources (None for a hand-built snapshot): lets the next
    # snapshot's version be computed from what changed instead of from every resource
    mixes: dict[str, int] | None = field(default=None, repr=False, compare=False)

    def types(self) -> list[str]:
        known = [t for t in PUSH_ORDER if t in self.versions]
        return known + sorted(t for t in self.versions if t not in PUSH_ORDER)


_MASK: Final = (1 << 128) - 1


def _name_factor(name: str) -> int:
    # not memoized: it is needed for changed and removed resources only (each one encoded too, which costs far more
    # than this 0.5 us hash), and a memo of names kept every pod's resource names after the pod had gone (issue 28)
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=16).digest(), "big") | 1


def _mix(name: str, version: str) -> int:
    """A resource's part of its type's mix: its version (a content hash) times an odd 128-bit hash of its name,
    mod 2**128 (so the same versions under swapped names mix differently)."""
    return (int(version, 16) * _name_factor(name)) & _MASK


def _type_mix(versions: Mapping[str, str]) -> int:
    acc = 0
    for name, ver in versions.items():
        acc ^= _mix(name, ver)
    return acc


def snapshot_version(versions: Mapping[str, Mapping[str, str]], mixes: Mapping[str, int]) -> str:
    """A hash of every (type, name, version): per type its count and the XOR of `_mix` over its resources (names
    are unique within a type, so nothing cancels), hence independent of order and updatable per change."""
    digest = hashlib.blake2b(digest_size=10)
    for type_url in sorted(versions):
        digest.update(f"{type_url}\0{len(versions[type_url])}\0".encode())
        digest.update(mixes[type_url].to_bytes(16, "big"))
    return digest.hexdigest()


def make_snapshot(resources: Resources, previous: Snapshot | None = None) -> Snapshot:
    """Encodes every resource and versions it by a hash of its bytes (deterministic serialization, so a restarted
    server computes the same versions). A resource that does not encode raises CodecError before anything is
    served. A resource dict that is the same object as in `previous` (builders memoize) reuses its bytes and
    version; finding those is a C-level pass, and the work after it is proportional to the changed resources."""
    versions: dict[str, dict[str, str]] = {}
    encoded: dict[str, dict[str, bytes]] = {}
    mixes: dict[str, int] = {}
    for type_url, named in resources.items():
        prev_res = previous.resources.get(type_url, {}) if previous else {}
        prev_ver = previous.versions.get(type_url, {}) if previous else {}
        prev_enc = previous.encoded.get(type_url, {}) if previous else {}
        prev_mix = previous.mixes.get(type_url) if previous and previous.mixes is not None else None
        changed = list(compress(named, map(is_not, named.values(), map(prev_res.get, named))))
        names = list(named)
        if len(prev_ver) == len(named) and list(prev_ver) == names and list(prev_enc) == names:  # copies in C
            tv = dict(prev_ver)
            te = dict(prev_enc)
        else:
            fresh = set(changed)
            tv = {name: "" if name in fresh else prev_ver[name] for name in names}
            te = {name: b"" if name in fresh else prev_enc[name] for name in names}
        new_names = 0
        for name in changed:
            data = encode(type_url, named[name], name)
            version = hashlib.blake2b(data, digest_size=10).hexdigest()
            if prev_mix is not None:
                old = prev_ver.get(name)
                if old is None:
                    new_names += 1
                else:
                    prev_mix ^= _mix(name, old)
                prev_mix ^= _mix(name, version)
            te[name] = data
            tv[name] = version
        if prev_mix is not None and len(prev_ver) + new_names != len(named):  # some were removed
            for name in prev_ver.keys() - named.keys():
                prev_mix ^= _mix(name, prev_ver[name])
        versions[type_url] = tv
        encoded[type_url] = te
        mixes[type_url] = prev_mix if prev_mix is not None else _type_mix(tv)
    return Snapshot(snapshot_version(versions, mixes), resources, versions, encoded, mixes)


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
