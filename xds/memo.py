"""The one registry of aether.xds's memos: every cache of derived content registers here, `clear_all` empties them.

A memo keeps what a pure function made from its inputs (a resource dict, a walk of one, its encoded bytes) so the
next translation reuses the same object. Each memo belongs to the module that fills it and registers itself where
it is made: `lru` for a memoized function, `register` for a dict or any object with a `clear()` (a `LiveMemo`
among them). Nothing else
reaches into another module's cache, so a module that was never imported has nothing to clear, and `clear_all`
(what the benchmarks and the warm-vs-cold tests call through `aether.xds.translate.compose.clear_memo`) forgets
every memo that exists, in registration order.

An `lru` suits inputs that come from a small set (a field name, a Service's cluster name). Inputs that churn (a
pod's listener, a set of endpoints) go through a `LiveMemo`: what one build of a scope (a node's translation of
one area) used, kept for its next build only, so it holds what is live and nothing that churn made before
(an LRU of a fixed size kept one entry per pod roll or endpoint set until it was full: issue 28's soak).

Not memos: per-descriptor lookups that depend on the protobuf schema alone (the codec's field tables and message
classes) are the same for the life of the process and stay outside.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


class Clearable(Protocol):
    def clear(self) -> None: ...


C = TypeVar("C", bound=Clearable)

_clearers: list[Callable[[], None]] = []


def register(cache: C) -> C:
    """Register `cache` (a dict, or anything with `clear()`) and return it: `_seen: dict[K, V] = register({})`."""
    _clearers.append(cache.clear)
    return cache


def lru(maxsize: int) -> Callable[[Callable[..., T]], functools._lru_cache_wrapper[T]]:
    """`functools.lru_cache(maxsize)`, registered."""

    def decorate(fn: Callable[..., T]) -> functools._lru_cache_wrapper[T]:
        wrapped = functools.lru_cache(maxsize=maxsize)(fn)
        _clearers.append(wrapped.cache_clear)
        return wrapped

    return decorate


class LiveMemo(Generic[K, T]):
    """Values per scope that the scope's last build used. A build (`with memo.build(scope, tag) as built`) finds a
    value among those and what it made itself (`built.get(key, make, *args)`), and what it used replaces the
    scope's entries when it ends without an error. Bounded by what one build of each scope uses (at most
    `max_scopes` scopes), however many inputs came before. `tag`: the last entries count only when the last build
    had this same object as its tag (a part of every value, compared by identity instead of hashed per key)."""

    def __init__(self, max_scopes: int = 64) -> None:
        self._last: dict[Hashable, tuple[object, dict[K, T]]] = {}
        self._max_scopes = max_scopes

    def build(self, scope: Hashable, tag: object = None) -> LiveBuild[K, T]:
        last = self._last.get(scope)
        return LiveBuild(self, scope, tag, last[1] if last is not None and last[0] is tag else {})

    def keep(self, scope: Hashable, tag: object, used: dict[K, T]) -> None:
        if len(self._last) >= self._max_scopes and scope not in self._last:
            self._last.clear()
        self._last[scope] = (tag, used)

    def entries(self, scope: Hashable) -> int:
        """How many values the scope's last build kept (what tests check the bound with)."""
        last = self._last.get(scope)
        return 0 if last is None else len(last[1])

    def clear(self) -> None:
        self._last.clear()


class LiveBuild(Generic[K, T]):
    """One build of one scope of a `LiveMemo`."""

    __slots__ = ("_last", "_memo", "_scope", "_tag", "used")

    def __init__(self, memo: LiveMemo[K, T], scope: Hashable, tag: object, last: dict[K, T]) -> None:
        self._memo, self._scope, self._tag, self._last = memo, scope, tag, last
        self.used: dict[K, T] = {}

    def get(self, key: K, make: Callable[..., T], *args: Any) -> T:
        """The value for `key`: this build's, else the last build's, else `make(*args)`."""
        hit = self._last.get(key)
        if hit is None:
            hit = self.used.get(key)
            if hit is None:
                hit = make(*args)
        self.used[key] = hit
        return hit

    def __enter__(self) -> LiveBuild[K, T]:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self._memo.keep(self._scope, self._tag, self.used)


class ObjectMemo(Generic[K, T]):
    """Values cached on the object they were made from (a `Shared` part: `aether.xds.resources`), so each lives and
    dies with its object. A table keyed by `id()` has to hold the object to trust the id, so it kept every part a
    translation ever made until its size bound (200,000 entries in the codec's: issue 28's soak saw the sidecar's
    heap in use grow with route edits). `clear()` forgets every object's values at once, by generation; a copy of
    the object (`copy.deepcopy` copies its attributes) starts with none, as its id differs."""

    def __init__(self, name: str) -> None:
        self._attr = f"_aether_memo_{name}"
        self._generation = 0

    def get(self, obj: Any, key: K) -> T | None:
        held = obj.__dict__.get(self._attr)
        if held is None or held[0] != (self._generation, id(obj)):  # a copy carries its original's: not its own
            return None
        got: T | None = held[1].get(key)
        return got

    def put(self, obj: Any, key: K, value: T) -> T:
        held = obj.__dict__.get(self._attr)
        if held is None or held[0] != (self._generation, id(obj)):
            held = obj.__dict__[self._attr] = ((self._generation, id(obj)), {})
        held[1][key] = value
        return value

    def clear(self) -> None:
        self._generation += 1


def clear_all() -> None:
    """Forget every registered memo."""
    for clear in _clearers:
        clear()


def registered() -> tuple[Callable[[], None], ...]:
    """The registered memos' `clear` methods (a test checks every memoized function in aether.xds is here)."""
    return tuple(_clearers)
