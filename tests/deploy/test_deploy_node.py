"""The node DaemonSet and the operator Deployment: the Envoy bootstrap (real Envoy validates it; it is what
`aether xds bootstrap` prints for the address the sidecar listens on), least privilege, the mounts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aether.testing.envoy import validate

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "deploy" / "node" / "envoy-bootstrap.json"
PLACEHOLDER_NODE_ID = "aether-node"  # Envoy runs with --service-node=$(NODE_NAME), which overrides it


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in [*pod.get("initContainers", []), *pod["containers"]]}


def _arg(container: dict[str, Any], flag: str) -> str:
    args: list[str] = [*container.get("command", []), *container.get("args", [])]
    for i, a in enumerate(args):
        if a == flag:
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    raise AssertionError(f"{container['name']} has no {flag}")


def test_bootstrap_is_what_aether_xds_bootstrap_prints(daemonset: dict[str, Any]) -> None:
    c = _containers(daemonset["spec"]["template"]["spec"])
    listen = _arg(c["xds"], "--listen")
    out = subprocess.run(
        [sys.executable, "-m", "aether.cli", "xds", "bootstrap", "--node", PLACEHOLDER_NODE_ID, "--xds", listen],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(BOOTSTRAP.read_text()) == json.loads(out.stdout), (
        f"regenerate: aether xds bootstrap --node {PLACEHOLDER_NODE_ID} --xds {listen} > {BOOTSTRAP}"
    )
    assert BOOTSTRAP.read_text() == out.stdout


@pytest.mark.envoy
def test_bootstrap_passes_envoy_validate() -> None:
    proc = validate(BOOTSTRAP)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "OK" in proc.stdout + proc.stderr


@pytest.mark.envoy
def test_envoy_validate_rejects_a_broken_bootstrap() -> None:
    """Negative control for the gate above: a misspelled field fails `--mode validate`."""
    bad = json.loads(BOOTSTRAP.read_text())
    bad["dynamic_resources"]["ads_config"]["api_typ"] = "DELTA_GRPC"
    proc = validate(bad)
    assert proc.returncode != 0


def test_envoy_is_wired_to_the_sidecar_and_the_node(daemonset: dict[str, Any]) -> None:
    pod = daemonset["spec"]["template"]["spec"]
    c = _containers(pod)
    envoy, xds = c["envoy"], c["xds"]
    assert _arg(envoy, "--config-path") == "/etc/aether/envoy/bootstrap.json"
    assert _arg(envoy, "--service-node") == "$(NODE_NAME)"
    assert "--disable-hot-restart" in envoy["args"]
    assert _arg(xds, "--node") == "$(NODE_NAME)"
    for container in (envoy, xds):
        env = {e["name"]: e for e in container["env"]}
        assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    sock = _arg(xds, "--listen").removeprefix("unix:")
    boot = json.loads(BOOTSTRAP.read_text())
    pipe = boot["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert pipe["endpoint"]["address"]["pipe"]["path"] == sock
    sock_dir = str(Path(sock).parent)
    for container in (envoy, xds):
        assert {"name": "xds-socket", "mountPath": sock_dir} in container["volumeMounts"]
    admin = boot["admin"]["address"]["socket_address"]
    assert admin["address"] == "127.0.0.1", "the admin port must stay on loopback (hostNetwork)"
    assert f"127.0.0.1:{admin['port_value']}/ready" in " ".join(envoy["readinessProbe"]["exec"]["command"])


def test_least_privilege(daemonset: dict[str, Any], operator_deployment: dict[str, Any]) -> None:
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert not pod.get("hostPID") and not pod.get("hostIPC")
    added = {}
    for name, c in _containers(pod).items():
        sc = c["securityContext"]
        assert not sc.get("privileged"), name
        assert sc["allowPrivilegeEscalation"] is False, name
        assert sc["readOnlyRootFilesystem"] is True, name
        assert sc["capabilities"]["drop"] == ["ALL"], name
        added[name] = sorted(sc["capabilities"].get("add", []))
    assert added == {"install-cni": ["NET_ADMIN"], "xds": [], "envoy": ["NET_ADMIN", "SYS_ADMIN"]}
    op = operator_deployment["spec"]["template"]["spec"]
    assert op["securityContext"]["runAsNonRoot"] is True
    (opc,) = op["containers"]
    assert opc["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert opc["command"][-1] == "operator" and "aether" in opc["command"][0]


def test_node_mounts(daemonset: dict[str, Any]) -> None:
    pod = daemonset["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    c = _containers(pod)
    # envoy binds into each pod's netns; xds serves a pod's listeners only once that netns file exists (its
    # netns-exists gate): without the mounts in xds, a kubelet-run node refused every pod's listeners (e2e/kubelet)
    for name in ("envoy", "xds"):
        mounts = {m["mountPath"]: m for m in c[name]["volumeMounts"]}
        for path in ("/run/netns", "/var/run/netns"):
            assert path in mounts, f"{name} does not see the pod netns files under {path}"
            m = mounts[path]
            assert vols[m["name"]]["hostPath"]["path"] == path
            assert m["mountPropagation"] == "HostToContainer", "netns files made after start must be visible"
            assert m["readOnly"] is True
    for name in ("envoy", "xds"):
        m = {m["mountPath"]: m for m in c[name]["volumeMounts"]}["/run/aether"]
        assert vols[m["name"]]["hostPath"]["path"] == "/run/aether" and m["readOnly"] is True
    assert _arg(c["xds"], "--certs-dir") == "/run/aether/certs", "SVIDs come from the host, under the /run/aether mount"
    xds_env = {e["name"]: e.get("value") for e in c["xds"]["env"]}
    assert xds_env["AETHER_STATE_DIR"] == "/run/aether/pods"
    init = {m["mountPath"]: vols[m["name"]]["hostPath"]["path"] for m in c["install-cni"]["volumeMounts"]}
    assert init == {
        "/host/opt/cni/bin": "/opt/cni/bin",
        "/host/etc/cni/net.d": "/etc/cni/net.d",
        "/host/opt/aether": "/opt/aether",
    }
