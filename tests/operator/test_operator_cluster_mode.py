"""`aether xds --node N` in cluster mode against the test bed and the in-process operator: the sidecar reads the
MeshNode the operator wrote and publishes its Programmed condition back beside the operator's conditions."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.commands import command
from aether.testing.wait import wait_for

pytestmark = pytest.mark.slow  # subprocesses: a few seconds each


def test_sidecar_cluster_mode_reads_the_operators_meshnode_and_reports_programmed(
    cluster: Cluster, operator: InProcessOperator, tmp_path: Path
) -> None:
    k = cluster
    ns, node = unique("cm"), unique("cm-node")
    k.apply(o.namespace(ns))
    k.apply(o.node(node))
    k.apply(o.pod(ns, "c", node, "client"), status=o.pod_status("10.60.0.2"))
    k.apply(o.service(ns, "dns", "10.96.60.1", [("dns", 53, "UDP")]))
    k.apply(o.endpoint_slice(ns, "dns", [("dns", 5353, "UDP")], [("10.60.1.1", True, None)]))
    wait_for(lambda: k.arm(node, f"{ns}/dns"), what="the operator's arm", ignore=READ_ERRORS)
    cmd = command()
    env = {**os.environ, "AETHER_KUBECONFIG": k.kubeconfig, "AETHER_STATE_DIR": str(tmp_path / "pods")}
    proc = subprocess.Popen(
        [*cmd, "xds", "--node", node, "--listen", f"unix:{tmp_path / 'xds.sock'}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def conditions() -> dict[str, str] | None:
            status = (k.meshnode(node) or {}).get("status") or {}
            types = {c["type"]: c["status"] for c in status.get("conditions") or []}
            return types if {"Ready", "Degraded", "Programmed"} <= set(types) else None

        types = wait_for(
            conditions,
            what="Programmed from the sidecar beside the operator's conditions",
            timeout=60,
            ignore=READ_ERRORS,
        )
        assert types["Ready"] == "True" and types["Programmed"] in ("Unknown", "True", "False")
        assert proc.poll() is None, proc.communicate()[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate(timeout=30)
    assert "Traceback" not in out, out
