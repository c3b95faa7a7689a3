"""Install aether-cni on a node: the plugin bundle into /opt, a shim into /opt/cni/bin, and a chained
entry into the node's primary CNI conflist.

Runs as the node DaemonSet's init container (stdlib only, so it also runs from a bare interpreter).
The pure half (`primary_config`, `to_conflist`, `merge_plugin`, `remove_plugin`, `shim_text`) carries the
tests; `main` is the thin shell over the host paths mounted under /host.

The container runtime executes the plugin on the host, not in this image, so the shim must not depend on
the host having Python: it runs the interpreter from the bundle this installer copies to the host.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PLUGIN_TYPE = "aether-cni"
CONFIG_SUFFIXES = (".conf", ".conflist", ".json")
# The plugin's options (its record directory is AETHER_STATE_DIR, default /run/aether/pods): `inbound`, the node-wide
# inbound mode (strict unless a pod's `mesh.aether.dev/inbound` annotation says otherwise, which the runtime passes
# because the entry declares the pod-annotations capability: containerd does), and `meshSources`, the addresses
# other nodes' proxies deliver plaintext UDP/TCP services from (--mesh-sources: the nodes' address range).
ANNOTATIONS_CAPABILITY = "io.kubernetes.cri.pod-annotations"  # aether.netns.contract.POD_ANNOTATIONS_CAPABILITY
DEFAULT_ENTRY: dict[str, Any] = {
    "type": PLUGIN_TYPE,
    "capabilities": {ANNOTATIONS_CAPABILITY: True},
    "inbound": "strict",
}
# The node-wide inbound modes (aether.netns.contract.InboundMode; a test keeps them equal): --inbound writes one into
# the entry's `inbound`.
INBOUND_MODES = ("strict", "permissive")
# The conflist versions aether-cni speaks (aether.netns.cni_request.SUPPORTED_VERSIONS; a test keeps them equal).
# Chaining into a conflist of another version would fail every pod's ADD on the node, so the installer refuses.
SUPPORTED_CNI_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0")


class InstallError(RuntimeError):
    pass


# -- pure ------------------------------------------------------------------------------------------


def primary_config(names: Iterable[str]) -> str | None:
    """The file the runtime uses: the lexicographically first CNI config (containerd/CRI-O/kubelet rule)."""
    candidates = sorted(n for n in names if n.endswith(CONFIG_SUFFIXES) and not n.startswith("."))
    return candidates[0] if candidates else None


def to_conflist(config: dict[str, Any]) -> dict[str, Any]:
    """A single-plugin `.conf` becomes a conflist with that plugin first; a conflist is returned as is."""
    if "plugins" in config:
        if not isinstance(config["plugins"], list):
            raise InstallError("conflist 'plugins' is not a list")
        return config
    if "type" not in config:
        raise InstallError("CNI config has neither 'plugins' nor 'type'")
    plugin = {k: v for k, v in config.items() if k not in ("cniVersion", "name", "cniVersions", "disableCheck")}
    out: dict[str, Any] = {
        "cniVersion": config.get("cniVersion", "0.4.0"),
        "name": config.get("name", "k8s-pod-network"),
    }
    out["plugins"] = [plugin]
    return out


def merge_plugin(config: dict[str, Any], entry: dict[str, Any] | None = None) -> dict[str, Any]:
    """Chain our plugin at the end of `plugins`, replacing an earlier aether entry in place of it.

    Idempotent: merge_plugin(merge_plugin(c)) == merge_plugin(c). The input is not modified. Our entry goes
    last so that it sees the main plugin's prevResult (the pod IPs).
    """
    ours = dict(entry or DEFAULT_ENTRY)
    if ours.get("type") != PLUGIN_TYPE:
        raise InstallError(f"entry type must be {PLUGIN_TYPE!r}")
    conflist = to_conflist(json.loads(json.dumps(config)))
    version = conflist.get("cniVersion")
    if version not in SUPPORTED_CNI_VERSIONS:
        raise InstallError(
            f"the primary conflist has cniVersion {version!r}; aether-cni speaks {', '.join(SUPPORTED_CNI_VERSIONS)}:"
            " chaining it there would fail every pod's ADD, so nothing was changed"
        )
    others = [p for p in conflist["plugins"] if not (isinstance(p, dict) and p.get("type") == PLUGIN_TYPE)]
    if not others:
        raise InstallError("no primary CNI plugin to chain after")
    conflist["plugins"] = [*others, ours]
    return conflist


def remove_plugin(config: dict[str, Any]) -> dict[str, Any]:
    """The inverse, for uninstall: the conflist without any aether entry."""
    conflist = json.loads(json.dumps(config))
    if "plugins" in conflist:
        conflist["plugins"] = [
            p for p in conflist["plugins"] if not (isinstance(p, dict) and p.get("type") == PLUGIN_TYPE)
        ]
    return dict(conflist)


def site_packages(bundle: str, version: tuple[int, int] = (sys.version_info[0], sys.version_info[1])) -> str:
    """Where the package sits in the bundle (this installer runs with the bundle's own interpreter)."""
    return f"{bundle}/lib/python{version[0]}.{version[1]}/site-packages"


def shim_text(bundle: str) -> str:
    """/opt/cni/bin/aether-cni: runs the plugin with the bundle's own interpreter (the host needs no Python).

    `-I -S` with the bundle's site-packages put on sys.path by hand: the runtime starts the plugin once per pod
    sandbox (ADD, CHECK, DEL), and `site` (.pth files, user site) costs more start-up than the plugin's own work.
    The plugin's import path is standard library only (tests/netns/test_netns_import_budget.py pins it)."""
    if any(c in bundle for c in "\"'$`\\\n"):
        raise ValueError(f"bundle path {bundle!r} cannot be quoted in the shim")
    code = (
        f"import sys; sys.path.append({site_packages(bundle)!r}); from aether.netns.cni import main; sys.exit(main())"
    )
    return (
        "#!/bin/sh\n"
        "# Installed by the aether-node DaemonSet (deploy/image/cni_install.py). Do not edit.\n"
        f'exec "{bundle}/bin/python3" -I -S -c "{code}" "$@"\n'
    )


def render_conflist(conflist: dict[str, Any]) -> str:
    return json.dumps(conflist, indent=2, sort_keys=False) + "\n"


# -- shell -----------------------------------------------------------------------------------------


def _atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def install_bundle(source: Path, host_root: Path, version: str) -> Path:
    """Copy the runtime to <host_root>/<version> (once) and point <host_root>/current at it atomically."""
    target = host_root / version
    if not target.is_dir():
        host_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=host_root, prefix=f".{version}."))
        shutil.copytree(source, staging, symlinks=True, dirs_exist_ok=True)
        os.replace(staging, target)
    link_tmp = host_root / ".current.tmp"
    link_tmp.unlink(missing_ok=True)
    link_tmp.symlink_to(version)
    os.replace(link_tmp, host_root / "current")
    return host_root / "current"


def install_conflist(net_d: Path, entry: dict[str, Any], wait_s: float) -> Path:
    """Merge our entry into the primary conflist, waiting up to `wait_s` for the primary CNI to write one."""
    deadline = time.monotonic() + wait_s
    while True:
        name = primary_config(os.listdir(net_d)) if net_d.is_dir() else None
        if name is not None:
            break
        if time.monotonic() >= deadline:
            raise InstallError(f"no CNI config in {net_d} after {wait_s:.0f}s: install the primary CNI first")
        time.sleep(2)
    path = net_d / name
    try:
        current = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InstallError(f"{path}: cannot read CNI config: {exc}") from exc
    merged = merge_plugin(current, entry)
    out = path if path.suffix != ".conf" else path.with_suffix(".conflist")
    if merged != current or out != path:
        _atomic_write(out, render_conflist(merged))
        if out != path:
            path.unlink()
    return out


def make_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="cni_install", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--bundle-source", type=Path, default=Path("/opt/aether/python"))
    ap.add_argument("--host-bundle-dir", type=Path, default=Path("/host/opt/aether"))
    ap.add_argument("--host-bundle-path", default="/opt/aether/current", help="the bundle's path as the host sees it")
    ap.add_argument("--bundle-version", default=os.environ.get("AETHER_VERSION", "dev"))
    ap.add_argument("--cni-bin-dir", type=Path, default=Path("/host/opt/cni/bin"))
    ap.add_argument("--cni-net-dir", type=Path, default=Path("/host/etc/cni/net.d"))
    ap.add_argument("--entry", default=json.dumps(DEFAULT_ENTRY), help="our conflist entry, JSON")
    ap.add_argument(
        "--inbound",
        type=str.lower,
        choices=INBOUND_MODES,
        help="the node-wide inbound mode, written into the entry as inbound (default: the entry's, strict); "
        "a pod's mesh.aether.dev/inbound annotation still overrides it",
    )
    ap.add_argument(
        "--mesh-sources",
        default=os.environ.get("AETHER_MESH_SOURCES", ""),
        help="comma-separated prefixes the node proxies deliver from across nodes (the nodes' addresses); "
        "added to the entry as meshSources",
    )
    ap.add_argument(
        "--node-guard",
        action="store_true",
        help="also install the node's mesh-source guard for --mesh-sources (`aether node-guard install`, from the "
        "bundle, in this process's netns: the host's for the hostNetwork DaemonSet; needs CAP_NET_ADMIN)",
    )
    ap.add_argument("--wait", type=float, default=300.0, help="seconds to wait for the primary CNI's config")
    ap.add_argument("--uninstall", action="store_true", help="remove our entry and shim (the bundle stays)")
    return ap


def entry_from(args: argparse.Namespace) -> dict[str, Any]:
    """The conflist entry the arguments describe: --entry, with --inbound and --mesh-sources written into it."""
    entry: dict[str, Any] = json.loads(args.entry)
    if args.inbound is not None:
        entry = {**entry, "inbound": args.inbound}
    sources = [x.strip() for x in args.mesh_sources.split(",") if x.strip()]
    if sources:
        entry = {**entry, "meshSources": sources}
    return entry


def install_node_guard(args: argparse.Namespace) -> str:
    """`aether node-guard install` with each of --mesh-sources (no pod may send as one of them: docs/operations.md);
    nothing to guard without any (the pods' gateway, a node address, the kernel already refuses from a pod)."""
    sources = [x.strip() for x in args.mesh_sources.split(",") if x.strip()]
    if not sources:
        return "no --mesh-sources: no node guard"
    cmd = [sys.executable, "-m", "aether.cli", "node-guard", "install", *(f"--mesh-source={x}" for x in sources)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InstallError(f"the node's mesh-source guard: {(done.stderr or done.stdout).strip()}")
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        entry = entry_from(args)
        if args.uninstall:
            name = primary_config(os.listdir(args.cni_net_dir)) if args.cni_net_dir.is_dir() else None
            if name is not None:
                path = args.cni_net_dir / name
                _atomic_write(path, render_conflist(remove_plugin(json.loads(path.read_text()))))
            (args.cni_bin_dir / PLUGIN_TYPE).unlink(missing_ok=True)
            print("aether-cni: uninstalled")
            return 0
        install_bundle(args.bundle_source, args.host_bundle_dir, args.bundle_version)
        args.cni_bin_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(args.cni_bin_dir / PLUGIN_TYPE, shim_text(args.host_bundle_path), mode=0o755)
        out = install_conflist(args.cni_net_dir, entry, args.wait)
        if args.node_guard:
            print(install_node_guard(args))
    except (InstallError, OSError, json.JSONDecodeError) as exc:
        print(f"aether-cni install: {exc}", file=sys.stderr)
        return 1
    print(f"aether-cni: shim in {args.cni_bin_dir}, chained in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
