"""The node Envoy's bootstrap turns on tcmalloc's release of free pages, and the real Envoy 1.40 acts on it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from aether.testing.envoy import Envoy, start_envoy
from aether.testing.wait import wait_for
from aether.xds.sidecar.bootstrap import RELEASE_BYTES_PER_S, ads_bootstrap

pytestmark = pytest.mark.envoy

RELEASE_THREAD = "TcmallocProcess"  # tcmalloc's background thread (TcmallocProcessBackgroundActions, cut to 15 chars)


def _threads(envoy: Envoy) -> set[str]:
    task = f"/proc/{envoy.proc.pid}/task"
    names: set[str] = set()
    for tid in os.listdir(task):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            names.add(Path(task, tid, "comm").read_text().strip())
    return names


@pytest.mark.parametrize("release", [True, False], ids=["ads-bootstrap", "negative-control-without-it"])
def test_the_node_envoy_hands_free_heap_pages_back(tmp_path: Path, release: bool) -> None:
    """Without a release rate Envoy's RSS only rises to the largest heap it has held (the soak: 60-400 KiB a minute
    while its heap in use stayed flat). The ADS bootstrap sets one; Envoy then runs tcmalloc's background thread and
    says so. Negative control: the same bootstrap without `memory_allocator_manager` runs neither."""
    boot = ads_bootstrap("node-m", f"unix:{tmp_path / 'ads.sock'}", f"unix:{tmp_path / 'admin.sock'}")
    assert boot["memory_allocator_manager"] == {"bytes_to_release": RELEASE_BYTES_PER_S}
    if not release:
        del boot["memory_allocator_manager"]
    envoy = start_envoy(boot, tmp_path, log_level="info")
    try:
        said = f"Configured tcmalloc with background release rate: {RELEASE_BYTES_PER_S} bytes per second"
        if release:
            wait_for(lambda: RELEASE_THREAD in _threads(envoy) and said in envoy.log_path.read_text(), 30, said)
        else:  # the admin answers once the server is up, after the allocator manager would have started
            assert RELEASE_THREAD not in _threads(envoy)
            assert "background release rate" not in envoy.log_path.read_text()
    finally:
        envoy.stop()
