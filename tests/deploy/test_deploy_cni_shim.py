"""The installed node side, end to end on the real kernel: the conflist entry the installer chained, run through
the shim it wrote (the way the container runtime would: per-plugin config with prevResult on stdin), installs the
capture in a real pod netns and records the pod; CHECK passes; DEL removes both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import aether
from aether.testing.netlab import Lab, sh

pytestmark = pytest.mark.privileged

POD_UID = "3f1c2b9a-0000-4000-8000-00000000d3b1"


def _install(cni_install: ModuleType, tmp_path: Path, *more: str) -> tuple[Path, dict[str, Any]]:
    bundle = tmp_path / "image" / "python" / "bin"
    bundle.mkdir(parents=True)
    (bundle / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bundle / "python3").chmod(0o755)
    # The package, as a non-editable install puts it into the bundle (the shim runs `-I -S`: no .pth, no finder).
    site = Path(cni_install.site_packages(str(bundle.parent)))
    site.mkdir(parents=True)
    (site / "aether").symlink_to(Path(aether.__file__).parent)
    host = tmp_path / "host"
    net_d = host / "etc" / "cni" / "net.d"
    net_d.mkdir(parents=True)
    primary = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "plugins": [{"type": "ptp"}]}
    (net_d / "10-ptp.conflist").write_text(json.dumps(primary))
    code = cni_install.main(
        [
            f"--bundle-source={bundle.parent}",
            f"--host-bundle-dir={host / 'opt' / 'aether'}",
            f"--host-bundle-path={host / 'opt' / 'aether' / 'current'}",
            f"--cni-bin-dir={host / 'opt' / 'cni' / 'bin'}",
            f"--cni-net-dir={net_d}",
            "--wait=0",
            *more,
        ]
    )
    assert code == 0
    conflist = json.loads((net_d / "10-ptp.conflist").read_text())
    return host / "opt" / "cni" / "bin" / "aether-cni", conflist


def _runtime_call(
    shim: Path, conflist: dict[str, Any], command: str, netns: str, state: Path, prev: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """What libcni does for the last plugin of a list: its entry plus the list's name and cniVersion, and the
    previous plugin's result; CNI_* in a minimal environment."""
    entry = conflist["plugins"][-1]
    config = {**entry, "cniVersion": conflist["cniVersion"], "name": conflist["name"], "prevResult": prev}
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "c0ffee",
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(shim.parent),
        "CNI_ARGS": f"K8S_POD_NAMESPACE=e2e;K8S_POD_NAME=client-0;K8S_POD_UID={POD_UID}",
        "AETHER_STATE_DIR": str(state),
    }
    return subprocess.run([str(shim)], input=json.dumps(config), env=env, capture_output=True, text=True, timeout=120)


def test_runtime_add_check_del_through_the_installed_shim(cni_install: ModuleType, lab: Lab, tmp_path: Path) -> None:
    node = lab.add_node("n")
    pod = lab.add_pod(node, "p", "10.231.7.2")
    shim, conflist = _install(cni_install, tmp_path)
    assert conflist["plugins"][-1] == cni_install.DEFAULT_ENTRY
    state = tmp_path / "pods"
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}], "ips": [{"address": "10.231.7.2/32"}]}

    add = _runtime_call(shim, conflist, "ADD", pod.path, state, prev)
    assert add.returncode == 0, add.stdout + add.stderr
    assert json.loads(add.stdout)["ips"] == prev["ips"], "a chained plugin passes prevResult on"
    record = json.loads((state / f"{POD_UID}.json").read_text())
    assert record["netns"] == pod.path and record["ips"] == ["10.231.7.2"]
    ruleset = sh("nft", "list", "table", "inet", "aether", netns=pod.netns)
    assert "0x0000ae71" in ruleset or "0xae71" in ruleset
    assert "chain inbound_in" in ruleset and "tcp dport 18008 accept" in ruleset  # STRICT, the entry's default

    check = _runtime_call(shim, conflist, "CHECK", pod.path, state, prev)
    assert check.returncode == 0, check.stdout + check.stderr

    delete = _runtime_call(shim, conflist, "DEL", pod.path, state, prev)
    assert delete.returncode == 0, delete.stdout + delete.stderr
    assert not (state / f"{POD_UID}.json").exists()
    gone = subprocess.run(
        ["ip", "netns", "exec", pod.netns, "nft", "list", "table", "inet", "aether"], capture_output=True, text=True
    )
    assert gone.returncode != 0
    assert os.listdir(state) == []


def test_mesh_sources_reach_the_entry_and_the_strict_ruleset(cni_install: ModuleType, lab: Lab, tmp_path: Path) -> None:
    """--mesh-sources (AETHER_MESH_SOURCES in the DaemonSet) becomes the entry's meshSources; with prevResult's
    gateway they are the sources a STRICT pod accepts new flows from."""
    node = lab.add_node("n")
    pod = lab.add_pod(node, "p", "10.231.7.3")
    shim, conflist = _install(cni_install, tmp_path, "--mesh-sources=10.250.0.0/16, 192.0.2.0/24")
    assert conflist["plugins"][-1]["meshSources"] == ["10.250.0.0/16", "192.0.2.0/24"]
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.231.7.3/32", "gateway": "169.254.1.1"}]}
    add = _runtime_call(shim, conflist, "ADD", pod.path, tmp_path / "pods", prev)
    assert add.returncode == 0, add.stdout + add.stderr
    ruleset = sh("nft", "list", "table", "inet", "aether", netns=pod.netns)
    for source in ("10.250.0.0/16", "192.0.2.0/24", "169.254.1.1"):
        assert f"ip saddr {source} counter" in ruleset, ruleset
