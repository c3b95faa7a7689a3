"""API-contract fixtures: a real control plane per module (kube-apiserver, etcd, kube-controller-manager at the
pinned version; `AETHER_CONTROL_PLANE=emulated` runs them on the API test bed instead, and AETHER_KUBECONFIG points
them at a cluster of your own), the real operator in-process, and the client helper
(aether.testing.apitestbed.harness)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from aether.testing.apiserver import Kind, api_server
from aether.testing.apitestbed import TestBed, start
from aether.testing.apitestbed.faults import Faults
from aether.testing.apitestbed.harness import Cluster, InProcessOperator


@pytest.fixture(scope="module")
def api(api_kind: Kind) -> Iterator[tuple[str, Faults | None]]:
    """(kubeconfig, faults): on the real control plane the kubeconfig goes through the fault proxy, so a test injects
    faults as on the emulator; None for a cluster of your own (AETHER_KUBECONFIG)."""
    external = os.environ.get("AETHER_KUBECONFIG")
    if external:
        yield external, None
        return
    with api_server(api_kind, faults=True) as server:
        yield server.kubeconfig, server.faults


@pytest.fixture(scope="module")
def bed() -> Iterator[TestBed]:
    """The emulator itself, for tests of the test bed (they need one even when AETHER_KUBECONFIG is set)."""
    b = start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="module")
def operator(api: tuple[str, Faults | None]) -> Iterator[InProcessOperator]:
    op = InProcessOperator(api[0])
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture(scope="module")
def cluster(api: tuple[str, Faults | None], operator: InProcessOperator) -> Cluster:
    return Cluster(api[0], api[1])
