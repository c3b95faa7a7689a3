"""CNI ADD latency over fresh pod network namespaces: the plugin as deployed (the node's shim), the in-process call,
and the development console script.

Run as root from the repository root: `.venv/bin/python -m bench.capture_cni [--pods 50]`.

Each ADD goes into a netns that has never been ADDed before (a Lab pod: eth0, /32, default route). The script is
run the way a CNI runtime runs it (env + config on stdin, a fresh process per call); the in-process figure is
`aether.netns.cni.invoke` on the same kind of input. Also printed: the interpreter's bare start-up (`python -c
pass`) and a `VERSION` call (start-up + the plugin's imports), which together show how much of the script's time
is Python itself. Target: ADD p50 <= 50 ms.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import aether
from aether.netns import cni
from aether.testing.netlab import Lab, Pod

CNI_BIN = str(Path(sys.executable).parent / "aether-cni")
AETHER_PKG = Path(aether.__file__).parent  # the package directory (its netns/ is a link to the repository's)
REPO = Path(__file__).resolve().parents[1]


def deployed_shim(tmp: str) -> list[str]:
    """The plugin as a node runs it: the shim `deploy/image/cni_install.py` writes to /opt/cni/bin, over a bundle laid
    out like the image's (`bin/python3`, the package in `lib/python3.X/site-packages`). Here the bundle's
    interpreter is this venv's base interpreter and its package a link to this checkout's; nothing else is on its
    path (`-I -S`: no site, no .pth files, no editable-install finder)."""
    spec = importlib.util.spec_from_file_location("cni_install", REPO / "deploy" / "image" / "cni_install.py")
    assert spec is not None and spec.loader is not None
    cni_install = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cni_install)
    bundle = Path(tmp) / "bundle"
    (bundle / "bin").mkdir(parents=True)
    (bundle / "bin" / "python3").symlink_to(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    site = Path(cni_install.site_packages(str(bundle)))
    site.mkdir(parents=True)
    (site / "aether").symlink_to(AETHER_PKG)
    shim = Path(tmp) / "aether-cni"
    shim.write_text(cni_install.shim_text(str(bundle)))
    shim.chmod(0o755)
    return [str(shim)]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def describe(name: str, ms: list[float]) -> str:
    return (
        f"{name:<28} n={len(ms):<3} p50={pct(ms, 0.5):6.1f} ms  p95={pct(ms, 0.95):6.1f} ms  "
        f"mean={statistics.fmean(ms):6.1f} ms  min={min(ms):6.1f} ms"
    )


def request(pod: Pod, command: str = "ADD") -> tuple[dict[str, str], bytes]:
    uid = f"bench-{pod.name}"
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": f"ctr-{pod.name}",
        "CNI_NETNS": pod.path,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": f"K8S_POD_NAMESPACE=bench;K8S_POD_NAME={pod.name};K8S_POD_UID={uid}",
    }
    prev = {"cniVersion": "1.0.0", "ips": [{"address": f"{pod.ip}/32"}]}
    conf = {"cniVersion": "1.0.0", "name": "bench", "type": "aether-cni", "prevResult": prev}
    return env, json.dumps(conf).encode()


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def run_script(env: dict[str, str], stdin: bytes, state: str, argv: list[str] | None = None) -> None:
    full = {"PATH": os.environ.get("PATH", ""), "AETHER_STATE_DIR": state, **env}
    proc = subprocess.run(argv or [CNI_BIN], input=stdin, env=full, capture_output=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"aether-cni failed: {proc.stdout.decode()} {proc.stderr.decode()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pods", type=int, default=50, help="fresh netns per path (default 50)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.capture_cni needs root (network namespaces)", file=sys.stderr)
        return 2
    # rmtree of the shim dir unlinks the bundle's symlinks (interpreter, package) without following them
    with (
        Lab() as lab,
        tempfile.TemporaryDirectory(prefix="aether-bench-") as state,
        tempfile.TemporaryDirectory(prefix="aether-shim-") as shim_dir,
    ):
        node = lab.add_node("n")
        print(f"creating {3 * args.pods} pod netns ...", flush=True)
        pods = [lab.add_pod(node, f"p{i}", f"10.201.{i // 250}.{i % 250 + 1}") for i in range(3 * args.pods)]
        script_pods, inproc_pods, lean_pods = pods[0::3], pods[1::3], pods[2::3]
        shim = deployed_shim(shim_dir)

        version_env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": "VERSION"}
        bare: list[float] = []
        bare_isolated: list[float] = []
        version: list[float] = []
        script: list[float] = []
        inproc: list[float] = []
        shims: list[float] = []
        shim_version: list[float] = []
        # interleaved: every figure of one iteration sees the same machine load (these VMs are shared and noisy)
        for sp, ip, lp in zip(script_pods, inproc_pods, lean_pods, strict=True):
            bare.append(timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True)))
            bare_isolated.append(timed(lambda: subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)))
            version.append(
                timed(lambda: subprocess.run([CNI_BIN], input=b"{}", env=version_env, capture_output=True, check=True))
            )
            shim_version.append(
                timed(lambda: subprocess.run(shim, input=b"{}", env=version_env, capture_output=True, check=True))
            )
            env, stdin = request(sp)
            script.append(timed(partial(run_script, env, stdin, state)))
            env, stdin = request(ip)

            def call(env: dict[str, str] = env, stdin: bytes = stdin) -> None:
                code, out = cni.invoke(env, stdin, state)
                if code != 0:
                    raise SystemExit(f"in-process ADD failed: {out}")

            inproc.append(timed(call))
            env, stdin = request(lp)
            shims.append(timed(partial(run_script, env, stdin, state, shim)))
        recorded = len(os.listdir(state))
        dels = []
        for p in pods:
            env, stdin = request(p, "DEL")
            dels.append(timed(partial(run_script, env, stdin, state)))

    print(f"records written: {recorded} (expected {3 * args.pods})")
    print(describe("python -c pass", bare))
    print(describe("python -I -S -c pass", bare_isolated))
    print(describe("shim VERSION", shim_version))
    print(describe("shim ADD (as deployed)", shims))
    print(describe("cni.invoke ADD (in-process)", inproc))
    print(describe("dev console script VERSION", version))
    print(describe("dev console script ADD", script))
    print(describe("dev console script DEL", dels))
    over = [s - b for s, b in zip(shims, bare_isolated, strict=True)]
    print(f"shim ADD minus bare `-I -S` start, per iteration: p50={pct(over, 0.5):.1f} ms (sh + imports + work)")
    print(f"target: shim ADD p50 <= 50 ms: {'met' if pct(shims, 0.5) <= 50 else 'NOT met'} ({pct(shims, 0.5):.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
