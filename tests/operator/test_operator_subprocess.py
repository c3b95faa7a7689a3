"""`aether operator --kubeconfig F` and `aether dev-api` as real subprocesses."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.faults import Faults
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, operator_subprocess, unique
from aether.testing.commands import command
from aether.testing.wait import wait_for

pytestmark = pytest.mark.slow  # subprocesses: a few seconds each


@pytest.fixture
def operator_process(api: tuple[str, Faults | None]) -> Iterator[subprocess.Popen[str]]:
    with operator_subprocess(api[0]) as proc:
        yield proc


def test_operator_subprocess_converges_and_stops_cleanly(
    api: tuple[str, Faults | None], operator_process: subprocess.Popen[str]
) -> None:
    k = Cluster(api[0], api[1])
    ns, node = unique("sp"), unique("sp-node")
    k.apply(o.namespace(ns))
    k.apply(o.node(node))
    k.apply(o.pod(ns, "c", node, "client"), status=o.pod_status("10.9.0.2"))
    k.apply(o.service(ns, "dns", "10.96.9.1", [("dns", 53, "UDP")]))
    k.apply(o.endpoint_slice(ns, "dns", [("dns", 5353, "UDP")], [("10.9.1.1", True, None)]))
    arm = wait_for(
        lambda: k.arm(node, f"{ns}/dns"), what="arm from the subprocess operator", timeout=60, ignore=READ_ERRORS
    )
    assert arm["cluster"] == f"udp:{ns}/dns"
    operator_process.send_signal(signal.SIGTERM)
    out, _ = operator_process.communicate(timeout=60)
    assert operator_process.returncode == 0, out
    assert "Traceback" not in out, out
    assert "Signal SIGTERM is received. Operator is stopping." in out, out  # kopf's reactor logs why it stops
    assert "aether operator stopped" in out, out


def test_the_cli_leaves_signals_to_kopf(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf handles SIGTERM/SIGINT itself; a stop flag of ours would never be set and kopf would wait 5 s for the
    task waiting on it before exiting (seen: 5.3 s from SIGTERM to exit; 0.3 s without the flag)."""
    import asyncio

    import kopf

    from aether.operator import cli
    from aether.operator.handlers import OperatorConfig

    seen: dict[str, object] = {}

    async def fake_operator(**kwargs: object) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(kopf, "operator", fake_operator)  # cli calls kopf.operator at run time
    asyncio.run(cli.run(OperatorConfig(kubeconfig=None)))
    assert "stop_flag" in seen and seen["stop_flag"] is None


def test_operator_cli_rejects_bad_input(tmp_path: Path) -> None:
    r = subprocess.run(
        [*command(), "operator", "--kubeconfig", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_dev_api_serves_and_writes_a_kubeconfig(tmp_path: Path) -> None:
    """On the emulator: `--audit` is the API test bed's own request log (the real control plane's `dev-api` is
    tests/operator/test_control_plane.py)."""
    kubeconfig, audit = tmp_path / "kc", tmp_path / "audit.jsonl"
    proc = subprocess.Popen(
        [*command(), "dev-api", "--control-plane", "emulated", "--kubeconfig", str(kubeconfig), "--audit", str(audit)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(kubeconfig.exists, timeout=60, what=f"dev-api to write {kubeconfig}")
        k = Cluster(str(kubeconfig), None)
        crds = k.res("apiextensions.k8s.io/v1", "CustomResourceDefinition").get().to_dict()["items"]
        assert {c["metadata"]["name"] for c in crds} >= {
            "meshnodes.mesh.aether.dev",
            "udproutes.gateway.networking.k8s.io",
            "referencegrants.gateway.networking.k8s.io",
        }
        records = [json.loads(line) for line in audit.read_text().splitlines()]
        assert {
            "verb": "list",
            "api_group": "apiextensions.k8s.io",
            "resource": "customresourcedefinitions",
        }.items() <= records[-1].items()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0
