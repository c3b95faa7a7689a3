"""deploy/image/cni_install.py: the chained conflist merge (pure) and the install shell on a fake host root."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import aether
from aether.netns import node_guard
from aether.testing.netlab import Lab

CALICO: dict[str, Any] = {
    "name": "k8s-pod-network",
    "cniVersion": "1.0.0",
    "plugins": [
        {"type": "calico", "ipam": {"type": "calico-ipam"}},
        {"type": "portmap", "snat": True, "capabilities": {"portMappings": True}},
    ],
}
SOURCES = ("10.250.0.0/16", "169.254.1.1")  # mesh sources for the node guard
BRIDGE_CONF: dict[str, Any] = {
    "cniVersion": "0.4.0",
    "name": "kindnet",
    "type": "ptp",
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]},
}


def test_merge_appends_our_entry_last(cni_install: ModuleType) -> None:
    merged = cni_install.merge_plugin(CALICO)
    assert [p["type"] for p in merged["plugins"]] == ["calico", "portmap", "aether-cni"]
    assert merged["plugins"][-1] == cni_install.DEFAULT_ENTRY
    assert merged["name"] == "k8s-pod-network" and merged["cniVersion"] == "1.0.0"
    assert [p["type"] for p in CALICO["plugins"]] == ["calico", "portmap"], "input modified"


def test_merge_is_idempotent(cni_install: ModuleType) -> None:
    once = cni_install.merge_plugin(CALICO)
    assert cni_install.merge_plugin(once) == once
    assert cni_install.merge_plugin(cni_install.merge_plugin(BRIDGE_CONF)) == cni_install.merge_plugin(BRIDGE_CONF)


def test_merge_replaces_an_older_entry_and_moves_it_last(cni_install: ModuleType) -> None:
    old = dict(CALICO, plugins=[{"type": "aether-cni", "old": True}, *CALICO["plugins"]])
    merged = cni_install.merge_plugin(old)
    assert [p["type"] for p in merged["plugins"]] == ["calico", "portmap", "aether-cni"]
    assert merged["plugins"][-1] == cni_install.DEFAULT_ENTRY
    assert cni_install.DEFAULT_ENTRY == {
        "type": "aether-cni",
        "capabilities": {"io.kubernetes.cri.pod-annotations": True},
        "inbound": "strict",
    }


def test_single_plugin_conf_becomes_a_conflist(cni_install: ModuleType) -> None:
    merged = cni_install.merge_plugin(BRIDGE_CONF)
    assert merged["cniVersion"] == "0.4.0" and merged["name"] == "kindnet"
    assert merged["plugins"][0] == {k: v for k, v in BRIDGE_CONF.items() if k not in ("cniVersion", "name")}
    assert merged["plugins"][1]["type"] == "aether-cni"


def test_merge_refuses_a_cni_version_the_plugin_does_not_speak(cni_install: ModuleType) -> None:
    """Chaining into a conflist version the plugin refuses would fail every ADD on the node."""
    with pytest.raises(cni_install.InstallError, match=r"0\.2\.0"):
        cni_install.merge_plugin(dict(CALICO, cniVersion="0.2.0"))


def test_merge_chains_into_kindnet_and_calico_0_3_1(cni_install: ModuleType) -> None:
    """kindnet and stock Calico conflists say cniVersion 0.3.1."""
    merged = cni_install.merge_plugin(dict(CALICO, cniVersion="0.3.1"))
    assert merged["cniVersion"] == "0.3.1" and merged["plugins"][-1]["type"] == "aether-cni"


def test_installer_versions_are_the_plugins(cni_install: ModuleType) -> None:
    from aether.netns.cni_request import SUPPORTED_VERSIONS

    assert tuple(cni_install.SUPPORTED_CNI_VERSIONS) == tuple(SUPPORTED_VERSIONS)


def test_remove_is_the_inverse(cni_install: ModuleType) -> None:
    assert cni_install.remove_plugin(cni_install.merge_plugin(CALICO)) == CALICO


@pytest.mark.parametrize(
    "bad",
    [{"plugins": "x"}, {"name": "n"}, {"plugins": [{"type": "aether-cni"}]}],
    ids=["not-list", "no-type", "alone"],
)
def test_merge_refuses_configs_it_cannot_chain_into(cni_install: ModuleType, bad: dict[str, Any]) -> None:
    with pytest.raises(cni_install.InstallError):
        cni_install.merge_plugin(bad)


def test_primary_config_is_the_first_by_name(cni_install: ModuleType) -> None:
    names = ["99-loopback.conf", "10-calico.conflist", ".10-calico.conflist.tmp", "README", "05-x.json"]
    assert cni_install.primary_config(names) == "05-x.json"
    assert cni_install.primary_config(["README"]) is None


def _host(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    bundle = tmp_path / "image" / "python"
    (bundle / "bin").mkdir(parents=True)
    # The bundle's interpreter: here, this venv's (a wrapper, since a copied venv binary loses its venv).
    py = bundle / "bin" / "python3"
    py.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    site = bundle / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site.mkdir(parents=True)
    (site / "aether").symlink_to(Path(aether.__file__).parent)  # as a non-editable install puts it there
    host = tmp_path / "host"
    net_d = host / "etc" / "cni" / "net.d"
    net_d.mkdir(parents=True)
    return bundle, host, net_d, host / "opt" / "cni" / "bin"


def _run(cni_install: ModuleType, bundle: Path, host: Path, *extra: str) -> int:
    code: int = cni_install.main(
        [
            f"--bundle-source={bundle}",
            f"--host-bundle-dir={host / 'opt' / 'aether'}",
            f"--host-bundle-path={host / 'opt' / 'aether' / 'current'}",
            f"--cni-bin-dir={host / 'opt' / 'cni' / 'bin'}",
            f"--cni-net-dir={host / 'etc' / 'cni' / 'net.d'}",
            "--bundle-version=0.1.0",
            "--wait=0",
            *extra,
        ]
    )
    return code


def test_install_on_a_host_twice_then_uninstall(cni_install: ModuleType, tmp_path: Path) -> None:
    bundle, host, net_d, cni_bin = _host(tmp_path)
    (net_d / "10-kindnet.conf").write_text(json.dumps(BRIDGE_CONF))
    assert _run(cni_install, bundle, host) == 0
    assert sorted(os.listdir(net_d)) == ["10-kindnet.conflist"]
    first = (net_d / "10-kindnet.conflist").read_text()
    assert [p["type"] for p in json.loads(first)["plugins"]] == ["ptp", "aether-cni"]
    shim = cni_bin / "aether-cni"
    assert shim.stat().st_mode & stat.S_IXUSR
    assert (host / "opt" / "aether" / "current").resolve() == (host / "opt" / "aether" / "0.1.0").resolve()

    assert _run(cni_install, bundle, host) == 0, "a second run (pod restart) must succeed"
    assert (net_d / "10-kindnet.conflist").read_text() == first
    assert sorted(p.name for p in (host / "opt" / "aether").iterdir()) == ["0.1.0", "current"]

    assert _run(cni_install, bundle, host, "--uninstall") == 0
    assert [p["type"] for p in json.loads((net_d / "10-kindnet.conflist").read_text())["plugins"]] == ["ptp"]
    assert not shim.exists()


def test_install_fails_clearly_without_a_primary_cni(
    cni_install: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, host, _, _ = _host(tmp_path)
    assert _run(cni_install, bundle, host) == 1
    assert "install the primary CNI first" in capsys.readouterr().err


def test_the_shim_runs_the_plugin_from_the_bundle(cni_install: ModuleType, tmp_path: Path) -> None:
    """The shim the runtime executes reaches aether.netns.cni through the bundle's interpreter (CNI VERSION)."""
    pytest.importorskip("aether.netns.cni", reason="the CNI plugin (netns/cni.py) has not landed yet")
    bundle, host, net_d, cni_bin = _host(tmp_path)
    (net_d / "10-calico.conflist").write_text(json.dumps(CALICO))
    assert _run(cni_install, bundle, host) == 0
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": "VERSION"}
    proc = subprocess.run(
        [str(cni_bin / "aether-cni")],
        input='{"cniVersion": "1.0.0"}',
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "supportedVersions" in json.loads(proc.stdout)


def test_installer_inbound_modes_are_the_plugins(cni_install: ModuleType) -> None:
    from aether.netns.contract import InboundMode

    assert set(cni_install.INBOUND_MODES) == {m.value for m in InboundMode}


def _our_entry(net_d: Path) -> dict[str, Any]:
    (name,) = os.listdir(net_d)
    entry: dict[str, Any] = json.loads((net_d / name).read_text())["plugins"][-1]
    assert entry["type"] == "aether-cni"
    return entry


def test_inbound_sets_the_node_wide_mode_the_plugin_reads(cni_install: ModuleType, tmp_path: Path) -> None:
    """--inbound writes the entry's `inbound` (case as the Helm value spells it, or lower); the plugin's own parse of
    that entry gives the mode; a later run with another mode replaces it (a node pod restarted after an upgrade)."""
    from aether.netns.cni_request import CniRequest, Command
    from aether.netns.contract import InboundMode

    bundle, host, net_d, _ = _host(tmp_path)
    (net_d / "10-calico.conflist").write_text(json.dumps(CALICO))
    for flag, mode in (("--inbound=PERMISSIVE", InboundMode.PERMISSIVE), ("--inbound=strict", InboundMode.STRICT)):
        assert _run(cni_install, bundle, host, flag, "--mesh-sources=10.0.0.0/16") == 0
        entry = _our_entry(net_d)
        assert entry == {**cni_install.DEFAULT_ENTRY, "inbound": mode.value, "meshSources": ["10.0.0.0/16"]}
        request = CniRequest(command=Command.ADD, cni_version="1.0.0", config={**entry, "cniVersion": "1.0.0"})
        policy = request.inbound_policy()
        assert policy.mode == mode and "10.0.0.0/16" in policy.mesh_sources
    assert _run(cni_install, bundle, host) == 0  # without --inbound: the default entry's, strict
    assert _our_entry(net_d)["inbound"] == "strict"


def test_inbound_refuses_a_mode_it_does_not_know(cni_install: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cni_install.main(["--inbound=permisive"])
    assert exited.value.code == 2 and "invalid choice: 'permisive'" in capsys.readouterr().err


@pytest.mark.privileged
def test_node_guard_installs_the_mesh_source_guard_where_it_runs(cni_install: ModuleType, tmp_path: Path) -> None:
    """--node-guard (the DaemonSet passes it): the installer also installs the node's mesh-source guard (`aether
    node-guard install`, table inet aether_guard) for --mesh-sources in its own netns, the host's for the hostNetwork
    DaemonSet (here a lab node's netns); without mesh sources it says there is nothing to guard and succeeds."""
    bundle, host, net_d, _ = _host(tmp_path)
    (net_d / "10-calico.conflist").write_text(json.dumps(CALICO))
    assert cni_install.__file__ is not None
    script = Path(cni_install.__file__)
    with Lab() as lab:
        node = lab.add_node("n1")
        argv = ["ip", "netns", "exec", node.netns, sys.executable, str(script), f"--bundle-source={bundle}"]
        argv += [
            f"--host-bundle-dir={host / 'opt' / 'aether'}",
            f"--host-bundle-path={host / 'opt' / 'aether' / 'current'}",
        ]
        argv += [f"--cni-bin-dir={host / 'opt' / 'cni' / 'bin'}", f"--cni-net-dir={net_d}", "--wait=0", "--node-guard"]
        env = {**os.environ, "AETHER_MESH_SOURCES": ""}
        bare = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        assert bare.returncode == 0 and "no --mesh-sources: no node guard" in bare.stdout, bare
        assert node_guard.check(SOURCES, node.path) == [f"missing nft table inet {node_guard.GUARD_TABLE}"]
        done = subprocess.run(
            [*argv, f"--mesh-sources={','.join(SOURCES)}"], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done
        assert "mesh-source guard installed" in done.stdout, done.stdout
        assert node_guard.check(SOURCES, node.path) == []
