"""Key material: the sidecar's delta-ADS stream carries SDS (every local workload's SVID private key), so it listens
on a unix socket created 0600 by default and refuses a TCP address while it serves secrets, unless
`--allow-sds-over-tcp` says so (then it logs an error). Before this, the default was 127.0.0.1:18000: every process
in the node's network namespace (every hostNetwork pod) could ask for the keys.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from aether.testing.wait import wait_for
from aether.xds.ads.cache import SnapshotCache
from aether.xds.ads.server import UNIX_SOCKET_MODE, DeltaAdsServer, serve
from aether.xds.sidecar.bootstrap import DEFAULT_XDS_ADDR, ads_bootstrap
from aether.xds.sidecar.cli import SDS_OVER_TCP_REFUSED

XDS = [sys.executable, "-m", "aether.cli", "xds"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_the_default_is_the_deployments_unix_socket() -> None:
    assert DEFAULT_XDS_ADDR == "unix:/run/aether-xds/ads.sock"
    ep = ads_bootstrap("n")["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert ep["endpoint"]["address"] == {"pipe": {"path": "/run/aether-xds/ads.sock"}}
    daemonset = (Path(__file__).parents[2] / "deploy/node/daemonset.yaml").read_text()
    assert "--listen, unix:/run/aether-xds/ads.sock" in daemonset


def test_sds_over_tcp_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    state = tmp_path / "node.yaml"
    out = subprocess.run(
        [*XDS, "--node", "n", "--state", str(state), "--listen", "127.0.0.1:18000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == SDS_OVER_TCP_REFUSED.format(listen="127.0.0.1:18000")
    assert "refusing to serve SDS secrets (every local workload's private key) on TCP 127.0.0.1:18000" in out.stderr
    assert "--allow-sds-over-tcp" in out.stderr


def _until_listening(argv: list[str]) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines: list[str] = []
    for line in proc.stderr:
        lines.append(line)
        if "delta ADS on" in line:
            return proc, lines
    proc.wait(10)
    raise AssertionError(f"exited {proc.returncode} without listening: {''.join(lines)}")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize(
    ("extra", "loud"),
    [(["--allow-sds-over-tcp"], True), (["--areas", "udp,tcp-floor"], False)],
    ids=["allowed-explicitly", "no-secrets-served"],
)
def test_tcp_when_told_or_when_no_secrets_are_served(tmp_path: Path, extra: list[str], loud: bool) -> None:
    port = _free_port()
    argv = [*XDS, "--node", "n", "--state", str(tmp_path / "node.yaml"), "--listen", f"127.0.0.1:{port}", *extra]
    proc, lines = _until_listening(argv)
    try:
        warned = [ln for ln in lines if "--allow-sds-over-tcp" in ln]
        if loud:
            assert len(warned) == 1 and " ERROR " in warned[0] and "ANY process" in warned[0], lines
        else:
            assert not warned, lines
    finally:
        _stop(proc)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory anyone may enter (tmp_path's parents are root-only), so only the socket's own mode decides."""
    d = Path(tempfile.mkdtemp(prefix="aether-sds-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _connect_as(uid: int, path: Path) -> str:
    code = (
        "import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
        "try:\n s.connect(sys.argv[1]); print('connected')\nexcept OSError as e:\n print(type(e).__name__)"
    )
    argv = [sys.executable, "-I", "-c", code, str(path)]
    if uid != os.getuid():
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.strip()


@pytest.mark.privileged
def test_the_unix_socket_is_0600_and_refuses_another_user(open_dir: Path) -> None:
    path = open_dir / "sub" / "ads.sock"  # the directory is created too (0700)
    server, _ = serve(DeltaAdsServer(SnapshotCache()), f"unix:{path}")
    try:
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == UNIX_SOCKET_MODE == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        os.chmod(path.parent, 0o755)  # only the socket's mode stands between another user and the keys now
        assert _connect_as(os.getuid(), path) == "connected"
        if os.getuid() == 0:
            assert _connect_as(65534, path) == "PermissionError"  # nobody
    finally:
        server.stop(0)


def test_the_sidecar_creates_its_default_style_socket_0600(open_dir: Path) -> None:
    path = open_dir / "ads.sock"
    argv = [*XDS, "--node", "n", "--state", str(open_dir / "node.yaml"), "--listen", f"unix:{path}"]
    proc, _ = _until_listening(argv)
    try:
        wait_for(path.exists, 10, "the socket")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        _stop(proc)
