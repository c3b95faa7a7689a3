"""`aether xds` command line: clear errors and non-zero exits on bad input; bootstrap output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aether.cli", "xds", *args], capture_output=True, text=True, timeout=60
    )


def test_bootstrap_points_delta_ads_at_the_sidecar() -> None:
    out = _run("bootstrap", "--node", "node-a", "--xds", "unix:/run/aether/xds.sock")
    assert out.returncode == 0, out.stderr
    boot = json.loads(out.stdout)
    assert boot["node"]["id"] == "node-a"
    assert boot["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"
    ep = boot["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert ep["endpoint"]["address"] == {"pipe": {"path": "/run/aether/xds.sock"}}


def test_bad_inputs_fail_clearly(tmp_path: Path) -> None:
    cases = [
        (("bootstrap", "--node", "n", "--xds", "nowhere"), "expected host:port or unix:PATH"),
        (("bootstrap",), "--node"),
        (("--node", "n", "--listen", "1.2.3.4"), "expected host:port or unix:PATH"),
        (("--node", "n", "--state", str(tmp_path / "x.yaml"), "--areas", "udp,bogus"), "unknown ['bogus']"),
        (("render", "--state", str(tmp_path / "absent.yaml")), "cannot read"),
    ]
    for args, message in cases:
        out = _run(*args)
        assert out.returncode != 0, args
        assert message in out.stderr, (args, out.stderr)
