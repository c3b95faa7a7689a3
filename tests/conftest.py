"""Shared test plumbing: privileged gating, the netns lab, the Envoy binary.

A test marked `privileged` needs root (network namespaces, nftables, policy routing). Outside root it is
skipped with a reason; with AETHER_REQUIRE_PRIVILEGED=1 (set by .ci/run) any skip of a privileged test is
turned into a failure, so CI can never go green by skipping the kernel half.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from aether.testing.envoy import EnvoyNotFound, envoy_path
from aether.testing.netlab import CREATED_TAGS, Lab, is_root, leftover_netns

REQUIRE_PRIVILEGED = os.environ.get("AETHER_REQUIRE_PRIVILEGED") == "1"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("privileged") and not is_root():
        if REQUIRE_PRIVILEGED:
            pytest.fail("privileged test cannot run: not root, and AETHER_REQUIRE_PRIVILEGED=1")
        pytest.skip("needs root for network namespaces and nftables")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if REQUIRE_PRIVILEGED and report.skipped and item.get_closest_marker("privileged"):
        report.outcome = "failed"
        report.longrepr = f"privileged test skipped under AETHER_REQUIRE_PRIVILEGED=1: {report.longrepr}"


@pytest.fixture
def lab() -> Iterator[Lab]:
    lb = Lab()
    try:
        yield lb
    finally:
        lb.close()


@pytest.fixture(scope="session")
def envoy_bin() -> Path:
    try:
        return envoy_path()
    except EnvoyNotFound as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session", autouse=True)
def no_lab_leaks_a_netns() -> Iterator[None]:
    """At the end of the session, every netns any Lab of this process made is gone (tests must not leak)."""
    yield
    leaked = sorted(ns for tag in CREATED_TAGS for ns in leftover_netns(tag + "-"))
    if leaked:
        pytest.fail(f"network namespaces left behind by this test session: {leaked}")
