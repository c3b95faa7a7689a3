"""The DaemonSet's two containers as deployed: the sidecar with the xds container's arguments and real Envoy with
the deployed bootstrap and arguments, over the unix socket. Envoy ACKs (Programmed=True/Accepted) only because
`--service-node=$(NODE_NAME)` replaces the bootstrap's placeholder node id: without it (the negative control) the
sidecar has nothing for that node and Programmed never leaves Pending."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aether.e2e.harness import NODE_ENVOY_DRAIN_TIME_S
from aether.testing.envoy import allocate_base_id, parse_stats
from aether.testing.netlab import Lab, sh
from aether.testing.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "deploy" / "node" / "envoy-bootstrap.json"
NODE = "kind-worker"

pytestmark = [pytest.mark.envoy, pytest.mark.slow]


def _container(daemonset: dict[str, Any], name: str) -> dict[str, Any]:
    c: dict[str, Any] = next(c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == name)
    return c


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    out = []
    for a in args:
        for k, v in env.items():
            a = a.replace(f"$({k})", v)
        out.append(a)
    return out


def _programmed(status: Path) -> tuple[str, str] | None:
    try:
        doc = json.loads(status.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    for c in doc["status"]["conditions"]:
        if c["type"] == "Programmed":
            return c["status"], c["reason"]
    return None


def _connected(admin_file: Path) -> bool:
    """Envoy's own view: is its ADS stream to the sidecar up?"""
    try:
        addr = admin_file.read_text().strip()
        url = f"http://{addr}/stats?format=json&filter=control_plane.connected_state"
        with urllib.request.urlopen(url, timeout=5) as r:
            return parse_stats(r.read().decode()).get("control_plane.connected_state") == 1
    except OSError:
        return False


def _readiness_probe(envoy: dict[str, Any], admin: str) -> subprocess.CompletedProcess[str]:
    """The envoy container's exec probe, with this interpreter and the test Envoy's admin address."""
    cmd = [a.replace("127.0.0.1:19000", admin) for a in envoy["readinessProbe"]["exec"]["command"]]
    assert cmd[0].endswith("/python3")
    return subprocess.run([sys.executable, *cmd[1:]], capture_output=True, text=True, timeout=60)


def _run_pair(
    daemonset: dict[str, Any],
    envoy_bin: Path,
    tmp_path: Path,
    override_node: bool,
    status_body: dict[str, Any] | None = None,
    inspect: Callable[[str], None] | None = None,
) -> tuple[tuple[str, str] | None, bool]:
    """Run both containers' commands; `inspect(admin address)` runs while they are up, once Programmed=True."""
    sock = tmp_path / "ads.sock"
    state = tmp_path / "node.json"
    doc = {"apiVersion": "mesh.aether.dev/v1alpha1", "kind": "MeshNode", "metadata": {"name": NODE}}
    state.write_text(json.dumps({**doc, "status": status_body or {}}))
    status = tmp_path / "status.json"

    xds = _container(daemonset, "xds")
    xds_args = _expand(xds["args"], {"NODE_NAME": NODE})
    xds_args = [f"unix:{sock}" if a == "unix:/run/aether-xds/ads.sock" else a for a in xds_args]
    xds_args = [a for a in xds_args if a not in ("--metrics", "0.0.0.0:19090")]  # no fixed host port in tests
    xds_args = [str(tmp_path / "certs") if a == "/run/aether/certs" else a for a in xds_args]
    assert xds["command"][-1] == "xds"
    xds_cmd = [sys.executable, "-m", "aether.cli", "xds", *xds_args, "--state", str(state), "--status-out", str(status)]

    boot = json.loads(BOOTSTRAP.read_text())
    lb = boot["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    lb["endpoint"]["address"]["pipe"]["path"] = str(sock)
    boot["admin"]["address"]["socket_address"]["port_value"] = 0  # the deployed 19000 may be taken here
    (tmp_path / "bootstrap.json").write_text(json.dumps(boot))
    envoy = _container(daemonset, "envoy")
    envoy_args = _expand(envoy["args"], {"NODE_NAME": NODE})
    i = envoy_args.index("--config-path")
    envoy_args[i + 1] = str(tmp_path / "bootstrap.json")
    if not override_node:
        i = envoy_args.index("--service-node")
        del envoy_args[i : i + 2]
    admin_file = tmp_path / "admin.txt"
    envoy_cmd = [
        str(envoy_bin),
        *envoy_args,
        "--base-id",
        str(allocate_base_id()),
        "--admin-address-path",
        str(admin_file),
    ]

    env = dict(os.environ, AETHER_STATE_DIR=str(tmp_path / "pods"))
    procs = [
        subprocess.Popen(xds_cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "xds.log", "w")),  # noqa: SIM115
        subprocess.Popen(envoy_cmd, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "envoy.log", "w")),  # noqa: SIM115
    ]

    def accepted() -> bool:
        assert all(p.poll() is None for p in procs), (tmp_path / "xds.log").read_text()[-2000:] + (
            tmp_path / "envoy.log"
        ).read_text()[-2000:]
        return _programmed(status) == ("True", "Accepted")

    try:
        # Accepted comes in ~1 s when it comes; the negative control never gets there (its status is read below)
        with contextlib.suppress(TimeoutError):
            wait_for(accepted, timeout=60 if override_node else 8, what="Programmed=True/Accepted", interval=0.3)
        if override_node and status_body is None:
            probe = _readiness_probe(envoy, admin_file.read_text().strip())
            assert probe.returncode == 0, f"the deployed readiness probe fails on a ready Envoy: {probe.stderr}"
        if inspect is not None and _programmed(status) == ("True", "Accepted"):
            inspect(admin_file.read_text().strip())
        return _programmed(status), _connected(admin_file)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def test_deployed_sidecar_and_envoy_agree_over_the_unix_socket(
    daemonset: dict[str, Any], envoy_bin: Path, tmp_path: Path
) -> None:
    """Also what the deployed Envoy makes of its flags (its /server_info): a replaced listener drains for
    NODE_ENVOY_DRAIN_TIME_S, the value the e2e harness and the soak run with, not Envoy's 600 s default (which
    held ~0.25 MiB per listener swap for ten minutes: docs/operations.md#listener-drain)."""
    seen: dict[str, Any] = {}

    def server_info(admin: str) -> None:
        with urllib.request.urlopen(f"http://{admin}/server_info", timeout=5) as r:
            seen.update(json.loads(r.read())["command_line_options"])

    got = _run_pair(daemonset, envoy_bin, tmp_path, override_node=True, inspect=server_info)
    assert got == (("True", "Accepted"), True)
    assert seen["drain_time"] == f"{NODE_ENVOY_DRAIN_TIME_S}s", seen


def test_without_the_node_override_envoy_gets_nothing(
    daemonset: dict[str, Any], envoy_bin: Path, tmp_path: Path
) -> None:
    """Negative control: Envoy announces the bootstrap's placeholder id; the sidecar serves node NODE only."""
    programmed, connected = _run_pair(daemonset, envoy_bin, tmp_path, override_node=False)
    assert connected, "Envoy must reach the sidecar, or this control proves nothing"
    assert programmed == ("Unknown", "Pending")


@pytest.mark.privileged
def test_missing_svids_fail_closed_and_leave_udp_serving(
    daemonset: dict[str, Any], envoy_bin: Path, tmp_path: Path, lab: Lab
) -> None:
    """With the deployed --certs-dir empty (SPIRE has not written this pod's SVID yet), the state is still
    accepted, the pod's UDP capture listener is active, and its inbound mTLS listener fails closed (TCP connects,
    the TLS handshake fails: there is no certificate to present)."""
    node = lab.add_node("n")
    pod = lab.add_pod(node, "client", "10.231.9.2")
    uid = "5e1d0c2a-0000-4000-8000-0000000000c1"
    (tmp_path / "certs").mkdir()
    (tmp_path / "pods").mkdir()
    (tmp_path / "pods" / f"{uid}.json").write_text(
        json.dumps(
            {
                "uid": uid,
                "namespace": "e2e",
                "name": "client",
                "netns": pod.path,
                "ips": [pod.ip],
                "container_id": "c1",
                "ifname": "eth0",
            }
        )
    )
    status = {
        "pods": [{"uid": uid, "namespace": "e2e", "name": "client", "ip": pod.ip, "serviceAccount": "client"}],
        "quic": {"identities": ["spiffe://cluster.local/ns/e2e/sa/client"]},
    }
    seen: dict[str, Any] = {}
    tls_probe = (
        "import socket, ssl\n"
        f"s = socket.create_connection(({pod.ip!r}, 18008), timeout=5)\n"
        "print('connected', flush=True)\n"
        "ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE\n"
        "try:\n"
        "    ctx.wrap_socket(s).close(); print('handshake ok')\n"
        "except (ssl.SSLError, ConnectionError, TimeoutError) as exc:\n"
        "    print('handshake failed', type(exc).__name__)\n"
    )

    def active_listeners(admin: str) -> list[str]:
        with urllib.request.urlopen(f"http://{admin}/config_dump?resource=dynamic_listeners", timeout=10) as r:
            dump = json.loads(r.read())
        active = []
        for item in dump["configs"]:
            listener = (item.get("active_state") or {}).get("listener", {})
            addr = listener.get("address", {}).get("socket_address", {})
            active.append(f"{addr.get('protocol', 'TCP')}:{addr.get('port_value')}")
        return active

    def inspect(admin: str) -> None:
        # Programmed=True is Envoy's ACK of the listeners; a listener may still be warming for a moment after it
        # (seen once under load): wait, bounded, for both to be active before probing.
        def both_active() -> bool:
            seen["active"] = active_listeners(admin)
            return {"UDP:18082", "TCP:18008"} <= set(seen["active"])

        wait_for(both_active, timeout=30, what="UDP:18082 and TCP:18008 active", interval=0.2)
        seen["tls"] = sh(sys.executable, "-c", tls_probe, netns=node.netns)

    result = _run_pair(daemonset, envoy_bin, tmp_path, True, status, inspect)
    assert result == (("True", "Accepted"), True)
    assert "UDP:18082" in seen["active"] and "TCP:18008" in seen["active"], seen
    assert seen["tls"].splitlines()[0] == "connected", seen  # the inbound listener is there...
    assert seen["tls"].splitlines()[1].startswith("handshake failed"), seen  # ...and has no certificate to offer
