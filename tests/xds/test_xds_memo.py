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
from aether.xds.resources import Shared
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
    part = Shared({"a": 1})
    fastfill._shared.put(part, "x", b"")
    assert split.split_cluster.cache_info().currsize and eastwest._FIELDS and udp.LISTENERS.entries("n")
    clear_memo()
    for fn in (split.split_cluster, udp.blackhole_cluster):
        assert fn.cache_info().currsize == 0, fn
    assert core._walked == {} and fastfill._shared.get(part, "x") is None and udp.MEMO._last == {}
    assert eastwest._FIELDS == {} and udp.LISTENERS.entries("n") == 0


def test_a_part_no_translation_holds_is_freed_with_what_was_cached_on_it() -> None:
    """The codec's and the gates' caches of a `Shared` part live on the part: once no translation holds it, nothing
    does (the id-keyed tables they replace kept every matcher a translation made, up to 200,000: issue 28's soak),
    and a part still held is served from its cache."""
    import gc
    import weakref

    from aether.xds.codec.protojson import encode
    from aether.xds.resources import LISTENER

    def listener(port: int) -> dict[str, Any]:
        address = Shared({"socket_address": {"address": "127.0.0.1", "port_value": port}})
        return {"name": f"l{port}", "address": address}

    kept = listener(1)
    encode(LISTENER, kept, "l1")
    refs = []
    for port in range(2, 50):
        made = listener(port)
        encode(LISTENER, made, f"l{port}")
        core.clusters_of({"x": {"name": "x", "filter_chains": [{"filters": [made["address"]]}]}})
        refs.append(weakref.ref(made["address"]))
        del made
    gc.collect()  # the gates keep the last translation's listeners (the last part) for the next one
    assert all(r() is None for r in refs[:-1]), "a cache keeps parts no translation holds"
    assert fastfill._shared.get(kept["address"], "envoy.config.core.v3.Address") is not None
