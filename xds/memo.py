"""The one registry of aether.xds's memos: every cache of derived content registers here, `clear_all` empties them.

A memo keeps what a pure function made from its inputs (a resource dict, a walk of one, its encoded bytes) so the
next translation reuses the same object. Each memo belongs to the module that fills it and registers itself where
it is made: `lru` for a memoized function, `register` for a dict or any object with a `clear()`. Nothing else
reaches into another module's cache, so a module that was never imported has nothing to clear, and `clear_all`
(what the benchmarks and the warm-vs-cold tests call through `aether.xds.translate.compose.clear_memo`) forgets
every memo that exists, in registration order.

Not memos: per-descriptor lookups that depend on the protobuf schema alone (the codec's field tables and message
classes) are the same for the life of the process and stay outside.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


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


def clear_all() -> None:
    """Forget every registered memo."""
    for clear in _clearers:
        clear()


def registered() -> tuple[Callable[[], None], ...]:
    """The registered memos' `clear` methods (a test checks every memoized function in aether.xds is here)."""
    return tuple(_clearers)
