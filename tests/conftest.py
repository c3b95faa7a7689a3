"""Shared test plumbing: privileged gating, the netns lab, the Envoy binary.

A test marked `privileged` needs root (network namespaces, nftables, policy routing). Outside root it is
skipped with a reason; with AETHER_REQUIRE_PRIVILEGED=1 (set by .ci/run) any skip of a privileged test is
turned into a failure, so CI can never go green by skipping the kernel half.

The suite runs in parallel under pytest-xdist (`make unit`: `-n 3 --dist loadfile --no-loadscope-reorder`,
docs/testing.md): those two hooks run in each worker and their reports travel to the controller as they are; the
control planes each worker started reach the controller's summary through xdist's `workeroutput`
(pytest_sessionfinish in the worker, pytest_testnodedown in the controller).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from aether.testing import controlplane
from aether.testing.apiserver import Kind, default_kind
from aether.testing.controlplane import binaries
from aether.testing.controlplane.cluster import STARTED
from aether.testing.envoy import EnvoyNotFound, envoy_path
from aether.testing.netlab import CREATED_TAGS, Lab, is_root, leftover_netns

# No hypothesis deadline anywhere: a test's time is not a property it checks (speed lives in bench/), and on two
# cores shared by three workers a 1-ms example took 210 ms once (test_backoff failed CI on its 200-ms default)
settings.register_profile("aether", deadline=None)
settings.load_profile("aether")

REQUIRE_PRIVILEGED = os.environ.get("AETHER_REQUIRE_PRIVILEGED") == "1"
# every `aether xds` a test starts without --certs-dir may use the development CA (a production sidecar refuses to
# start without certificates: tests/xds/test_xds_cli.py runs one without this)
os.environ.setdefault("AETHER_XDS_DEV_BUILTIN_CA", "1")


def _module_weight(items: list[pytest.Item]) -> tuple[int, int]:
    """A module's expected length, coarsely: tests with a timeout over the default's 300 s (the soak), then tests
    marked slow."""
    long = sum(1 for i in items if (m := i.get_closest_marker("timeout")) and m.args and m.args[0] > 300)
    return long, sum(1 for i in items if i.get_closest_marker("slow"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, the longest modules first (each runs whole on one worker, --dist loadfile, handed out in
    collection order with --no-loadscope-reorder): a long module handed out last is the run's tail. Every worker
    sorts the same way (xdist checks that their collections agree); a serial run keeps the file order."""
    if not hasattr(config, "workerinput"):
        return
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    weights = {path: _module_weight(group) for path, group in modules.items()}
    order = sorted(modules, key=lambda path: (-weights[path][0], -weights[path][1]))  # stable: file order within
    items[:] = [item for path in order for item in modules[path]]


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


@pytest.fixture(scope="session")
def api_kind() -> Kind:
    """The API server the API-facing tests run against (aether.testing.apiserver). The real control plane unbuilt is
    a skip that names `make k8s`, and a failure under AETHER_REQUIRE_PRIVILEGED=1: never a silent emulator."""
    kind = default_kind()
    if kind == "real":
        with binaries.or_skip("the API-facing tests must run on it"):
            controlplane.bin_dir()
    return kind


# the control planes xdist workers started, as each worker reported them when it finished (controller side)
WORKERS_STARTED: list[str] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)  # set in an xdist worker only
    if workeroutput is not None:
        workeroutput["aether_control_planes"] = list(STARTED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    WORKERS_STARTED.extend(getattr(node, "workeroutput", {}).get("aether_control_planes", []))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    started = STARTED + WORKERS_STARTED
    if started:
        versions = ", ".join(sorted(set(started)))
        terminalreporter.write_line(
            f"API-facing tests ran against kube-apiserver {versions} ({len(started)} control planes started)"
        )
    else:
        terminalreporter.write_line("API-facing tests ran against no real control plane in this session")


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
