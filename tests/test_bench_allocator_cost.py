"""bench/allocator_cost.py measures each allocator setting in a child that runs under exactly that setting: the
variables it names reach the child, and one the caller's environment already sets does not leak into the default
(else every row would measure the caller's allocator)."""

from __future__ import annotations

import pytest

from aether.testing.benchload import load_bench

bench = load_bench("allocator_cost")  # bench/ by its path (aether.testing.benchload says why)

PROBE = [
    "-c",
    "import os, sys; sys.exit(0 if (os.environ.get('PYTHONMALLOC'), sys.getallocatedblocks() == 0)"
    " == (os.environ['WANT'] or None, os.environ['WANT'] == 'malloc') else 3)",
]


@pytest.mark.parametrize("want", ["", "malloc"])
def test_each_setting_is_the_childs_whole_allocator_environment(want: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONMALLOC", "malloc" if not want else "pymalloc")  # the caller's, to be dropped
    monkeypatch.setenv("WANT", want)
    sample = bench.run_once(PROBE, {"PYTHONMALLOC": want} if want else {})
    assert sample.cpu_s > 0 and sample.maxrss_kib > 0


def test_a_failing_child_is_an_error_not_a_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANT", "malloc")
    with pytest.raises(RuntimeError, match="exited 3"):
        bench.run_once(PROBE, {})
