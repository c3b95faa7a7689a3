"""The memo registry (aether.xds.memo): every memoized function in aether.xds is registered, and `clear_memo`
empties every memo a translation fills, the weighted-split and east-west ones included."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from pathlib import Path
from typing import Any

import aether
from aether.xds import memo
from aether.xds.codec import fastfill
from aether.xds.gates import core
from aether.xds.translate.compose import clear_memo
from aether.xds.translate.eastwest import build as eastwest
from aether.xds.translate.l4 import split, udp
from aether.xds.translate.l4.common import ClusterShape

XDS = Path(aether.__file__).parent / "xds"


def _xds_modules() -> list[Any]:
    names = [m.name for m in pkgutil.walk_packages([str(XDS)], "aether.xds.") if not m.name.endswith("__main__")]
    return [importlib.import_module(name) for name in names]


def test_every_memoized_function_in_xds_is_registered() -> None:
    modules = _xds_modules()
    registered = memo.registered()
    found = [
        (module.__name__, name, value)
        for module in modules
        for name, value in vars(module).items()
        if isinstance(value, functools._lru_cache_wrapper) and value.__module__ == module.__name__
    ]
    assert len(found) >= 4, found  # not vacuous: the L4 and split memos
    assert [(m, n) for m, n, fn in found if fn.cache_clear not in registered] == []


def test_clear_memo_empties_what_a_translation_filled() -> None:
    split.split_cluster("udp:ns/a", ClusterShape(1.0))
    split.split_assignment("udp:ns/a", ((split.DROP_LOCALITY, 1, False, (split.DROP_ENDPOINT,)),))
    eastwest.camel({"stat_prefix": "x"})
    udp.LISTENERS.keep("n", None, {("k",): {}})
    core.clusters_named_by({"name": "l"})
    fastfill._shared[(0, "x")] = (None, b"")
    assert split.split_cluster.cache_info().currsize and eastwest._FIELDS and udp.LISTENERS.entries("n")
    clear_memo()
    for fn in (split.split_cluster, udp.blackhole_cluster):
        assert fn.cache_info().currsize == 0, fn
    assert core._walked == {} and fastfill._shared == {} and udp.MEMO._last == {}
    assert eastwest._FIELDS == {} and udp.LISTENERS.entries("n") == 0
