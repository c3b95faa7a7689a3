"""The sidecar's periodic reads intern no strings (issue 28: the soak's sidecar heap steps).

On Python 3.11 `pathlib.Path` interns every part of every path it parses (`sys.intern` in `parse_parts`). The
sidecar read its pod records (`load_records`, every poll) and its certificates (`DirectorySource`, every build)
through `Path`, so each pass interned the record file names and the identities' directory names again once the
previous pass's paths had died. CPython's table of interned strings is a dict: a freed interned string leaves a
dead entry, and once the entries run out the table is rebuilt with a size set by its live count. A process with
some 22,000 live interned strings sits at the edge of two sizes, so a rebuild after the live count crossed it
doubled the table (1,877 KiB instead of 938: memray caught it in the soak, seed 60, docs/performance.md) and the
heap stepped up by most of a MiB at a moment set by nothing the sidecar was doing. Without the churn the table is
rebuilt only when the live count itself outgrows it."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from aether.netns.records import load_records, write_record
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.xds.ads.cache import SnapshotCache
from aether.xds.identity.ca import BuiltinCA
from aether.xds.identity.pemdir import DirectorySource, write_bundle, write_identity
from aether.xds.resources import TranslateOptions
from aether.xds.sidecar.loop import Sidecar
from aether.xds.sidecar.secrets import SecretKeeper

TD = "cluster.local"


class InternCount:
    """`sys.intern`, counted (pathlib looks it up on the `sys` module at every call)."""

    def __init__(self, real: Callable[[str], str]) -> None:
        self.real = real
        self.names: list[str] = []

    def __call__(self, s: str) -> str:
        self.names.append(s)
        return self.real(s)


@pytest.fixture
def interned(monkeypatch: pytest.MonkeyPatch) -> Iterator[InternCount]:
    count = InternCount(sys.intern)
    monkeypatch.setattr(sys, "intern", count)
    yield count


def _pods() -> list[SamplePod]:
    return [SamplePod(f"uid-{i}", f"pod-{i}", f"10.200.0.{i + 1}", f"sa-{i % 3}", f"/run/netns/p{i}") for i in range(6)]


def _certs(root: Path, pods: list[SamplePod]) -> None:
    ca = BuiltinCA(TD, "mesh.aether.internal")
    for p in pods:
        write_identity(root, ca.svid(f"spiffe://{TD}/ns/{p.namespace}/sa/{p.service_account}"))
    write_bundle(root, ca.bundle())


def test_load_records_interns_nothing(tmp_path: Path, interned: InternCount) -> None:
    _node, records = sample_node("node-a", _pods(), [])
    for rec in records.values():
        write_record(rec, tmp_path)
    interned.names.clear()
    for _ in range(3):
        assert set(load_records(str(tmp_path))) == set(records)
    assert interned.names == [], f"load_records interned {len(interned.names)} strings, e.g. {interned.names[:4]}"


def test_directory_source_interns_nothing(tmp_path: Path, interned: InternCount) -> None:
    pods = _pods()
    _certs(tmp_path, pods)
    source = DirectorySource(tmp_path, TD)
    interned.names.clear()
    for p in pods:
        source.svid(f"spiffe://{TD}/ns/{p.namespace}/sa/{p.service_account}")
    source.bundle()
    assert interned.names == [], f"DirectorySource interned {len(interned.names)} strings, e.g. {interned.names[:4]}"


def test_a_sidecar_polling_its_records_and_certificates_interns_nothing(tmp_path: Path, interned: InternCount) -> None:
    """The sidecar's own loop over a steady state: records polled, certificates re-read, the snapshot rebuilt."""
    pods = _pods()
    dests = [SampleDestination("default/web", "web-sa", (8080,), ("10.201.0.1",), vip="10.96.0.10")]
    node, records = sample_node("node-a", pods, dests)
    (tmp_path / "pods").mkdir()
    for rec in records.values():
        write_record(rec, tmp_path / "pods")
    _certs(tmp_path / "certs", pods)
    keeper = SecretKeeper(DirectorySource(tmp_path / "certs", TD))
    sidecar = Sidecar(
        "node-a",
        SnapshotCache(),
        None,
        records_dir=str(tmp_path / "pods"),
        options=TranslateOptions(trust_domain=TD),
        path_exists=lambda _: True,
        secrets=keeper,
    )
    sidecar.poll_records()
    sidecar.on_state(node)
    for _ in range(2):  # warm: whatever a first build interns for good (code, names it keeps)
        sidecar.poll_records()
        sidecar.poll_secrets()
    assert keeper.last_error is None and keeper._last, "no certificate was read: the test would prove nothing"
    interned.names.clear()
    for _ in range(5):
        sidecar.poll_records()
        sidecar.poll_secrets()
    assert interned.names == [], f"a steady sidecar interned {len(interned.names)} strings: {interned.names[:6]}"
