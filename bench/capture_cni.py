"""CNI ADD latency over fresh pod network namespaces: the real `aether-cni` script and the in-process call.

Run as root from the repository root: `.venv/bin/python -m bench.capture_cni [--pods 50]`.

Each ADD goes into a netns that has never been ADDed before (a Lab pod: eth0, /32, default route). The script is
run the way a CNI runtime runs it (env + config on stdin, a fresh process per call); the in-process figure is
`aether.netns.cni.invoke` on the same kind of input. Also printed: the interpreter's bare start-up (`python -c
pass`) and a `VERSION` call (start-up + the plugin's imports), which together show how much of the script's time
is Python itself. Target: ADD p50 <= 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from aether.e2e.netlab import Lab, Pod
from aether.netns import cni

CNI_BIN = str(Path(sys.executable).parent / "aether-cni")


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


def run_script(env: dict[str, str], stdin: bytes, state: str) -> None:
    full = {"PATH": os.environ.get("PATH", ""), "AETHER_STATE_DIR": state, **env}
    proc = subprocess.run([CNI_BIN], input=stdin, env=full, capture_output=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"aether-cni failed: {proc.stdout.decode()} {proc.stderr.decode()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pods", type=int, default=50, help="fresh netns per path (default 50)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.capture_cni needs root (network namespaces)", file=sys.stderr)
        return 2
    with Lab() as lab, tempfile.TemporaryDirectory(prefix="aether-bench-") as state:
        node = lab.add_node("n")
        print(f"creating {2 * args.pods} pod netns ...", flush=True)
        pods = [lab.add_pod(node, f"p{i}", f"10.201.{i // 250}.{i % 250 + 1}") for i in range(2 * args.pods)]
        script_pods, inproc_pods = pods[0::2], pods[1::2]

        bare = [timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True)) for _ in range(20)]
        version_env = {"PATH": os.environ.get("PATH", ""), "CNI_COMMAND": "VERSION"}
        version = [
            timed(lambda: subprocess.run([CNI_BIN], input=b"{}", env=version_env, capture_output=True, check=True))
            for _ in range(20)
        ]
        script: list[float] = []
        inproc: list[float] = []
        for sp, ip in zip(script_pods, inproc_pods, strict=True):  # interleaved: both see the same machine load
            env, stdin = request(sp)
            script.append(timed(lambda env=env, stdin=stdin: run_script(env, stdin, state)))  # type: ignore[misc]
            env, stdin = request(ip)

            def call(env: dict[str, str] = env, stdin: bytes = stdin) -> None:
                code, out = cni.invoke(env, stdin, state)
                if code != 0:
                    raise SystemExit(f"in-process ADD failed: {out}")

            inproc.append(timed(call))
        recorded = len(os.listdir(state))
        dels = []
        for p in pods:
            env, stdin = request(p, "DEL")
            dels.append(timed(lambda env=env, stdin=stdin: run_script(env, stdin, state)))  # type: ignore[misc]

    print(f"records written: {recorded} (expected {2 * args.pods})")
    print(describe("python -c pass", bare))
    print(describe("aether-cni VERSION", version))
    print(describe("aether-cni ADD (script)", script))
    print(describe("cni.invoke ADD (in-process)", inproc))
    print(describe("aether-cni DEL (script)", dels))
    print(f"script ADD p50 minus VERSION p50 (the plugin's own work): {pct(script, 0.5) - pct(version, 0.5):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
