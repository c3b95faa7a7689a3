"""API-contract fixtures: the API test bed (or a real cluster when AETHER_KUBECONFIG is set: then no emulator is
started), the real operator in-process, and the client helper (aether.testing.apitestbed.harness)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from aether.testing.apitestbed import TestBed, start
from aether.testing.apitestbed.harness import Cluster, InProcessOperator


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[str, TestBed | None]]:
    external = os.environ.get("AETHER_KUBECONFIG")
    if external:
        yield external, None
        return
    bed = start()
    try:
        yield str(bed.kubeconfig_path), bed
    finally:
        bed.stop()


@pytest.fixture(scope="module")
def bed() -> Iterator[TestBed]:
    """The emulator itself, for tests of the test bed (they need one even when AETHER_KUBECONFIG is set)."""
    b = start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="module")
def operator(api: tuple[str, TestBed | None]) -> Iterator[InProcessOperator]:
    op = InProcessOperator(api[0])
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture(scope="module")
def cluster(api: tuple[str, TestBed | None], operator: InProcessOperator) -> Cluster:
    return Cluster(api[0], api[1])
