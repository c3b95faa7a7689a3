"""deploy/ run by a real kubelet (issue 24, item 4; e2e/kubelet/README.md): kubelet 1.35.4 (k8s/go.mod's pin) with
Debian's containerd and the standard CNI plugins, the operator Deployment and the node DaemonSet from their images
(`make images`), `aether-cni` chained by the DaemonSet's installer, and a workload pod from a locally built image
reaching a UDP Service through the capture: its datagrams to VIP:18082 are answered from VIP:18082, while the same
VIP on the Service's own port (which only kube-proxy would serve; there is none) stays silent.

    sudo .venv/bin/python -m aether.e2e.kubelet.run          # prints each step and the evidence; exit 0 when it held
    sudo .venv/bin/python -m aether.e2e.kubelet.run --chart  # the same with deploy/helm/aether's default render

Everything it starts (a control plane with kube-scheduler and the controllers pods need, containerd on a socket of
its own, the kubelet) is stopped, and what they leave on the host removed, however the run ends."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from aether.e2e.kubelet import manifests
from aether.e2e.kubelet.host import BRIDGE, Node, run
from aether.testing import images
from aether.testing.controlplane import cluster, identities
from aether.testing.controlplane.binaries import tool
from aether.testing.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
NODE = "kubelet-node"
NODE_IP = "192.0.2.2"
EXTRA_CONTROLLERS = "daemonset-controller,deployment-controller,replicaset-controller,node-lifecycle-controller"
ENVOY_ADMIN = "http://127.0.0.1:19000"


def step(text: str) -> None:
    print(f"== {time.strftime('%H:%M:%S')} {text}", flush=True)


def kubectl(cp: cluster.ControlPlane, *args: str, input: str | None = None) -> str:
    return cp.kubectl(*args, input=input).stdout


def get(cp: cluster.ControlPlane, *args: str) -> Any:
    return json.loads(kubectl(cp, "get", *args, "-o", "json"))


def condition(obj: dict[str, Any], kind: str) -> str | None:
    for c in obj.get("status", {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return None


def extra_processes(cp: cluster.ControlPlane, node_bin: Path, work: Path) -> list[cluster.Process]:
    """What the fixture leaves out because the harness plays the kubelet: kube-scheduler, and the controllers that
    make pods (DaemonSet, Deployment, ReplicaSet) and untaint a Ready node (node lifecycle)."""
    sched = identities.certificate_kubeconfig(cp, work / "scheduler.kubeconfig", "system:kube-scheduler")
    kcm = identities.certificate_kubeconfig(cp, work / "kcm-pods.kubeconfig", "system:kube-controller-manager")
    common = ["--leader-elect=false", "--secure-port=0", "-v=1"]
    scheduler = [str(node_bin / "kube-scheduler"), f"--kubeconfig={sched}", f"--authentication-kubeconfig={sched}"]
    scheduler += [f"--authorization-kubeconfig={sched}", *common]
    controllers = [tool("kube-controller-manager"), f"--kubeconfig={kcm}", f"--controllers={EXTRA_CONTROLLERS}"]
    controllers += ["--use-service-account-credentials=true", f"--root-ca-file={cp.ca_path}"]
    controllers += [f"--service-account-private-key-file={work / 'pki' / 'sa.key'}", *common]
    return [
        cluster.Process("kube-scheduler", scheduler, work / "logs" / "kube-scheduler.log"),
        cluster.Process("kcm-pods", controllers, work / "logs" / "kcm-pods.log"),
    ]


def private_root_mount() -> bool:
    """True when `/` is not a shared mount (no systemd), as on this sandbox."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return not any(f.startswith("shared:") for f in fields[6 : fields.index("-")])
    return True


def render(chart: bool, root: Path) -> str:
    """deploy/ as `kubectl kustomize` renders it, or the Helm chart with its default values (`helm template`, with
    helm's directories under the run's root)."""
    if not chart:
        argv = [tool("kubectl"), "kustomize", str(REPO / "deploy")]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env |= {var: str(root / "helm" / var.lower()) for var in ("HELM_CONFIG_HOME", "HELM_CACHE_HOME", "HELM_DATA_HOME")}
    argv = [tool("helm"), "template", "aether", str(REPO / "deploy/helm/aether"), "--namespace", "aether-system"]
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout


def deploy(cp: cluster.ControlPlane, node: Node, chart: bool) -> None:
    docs = [d for d in yaml.safe_load_all(render(chart, node.root)) if d]
    moved = manifests.for_this_host(docs, str(node.root), private_root_mount())
    kubectl(cp, "apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(moved))


def ready_workloads(cp: cluster.ControlPlane) -> bool:
    ds = get(cp, "-n", "aether-system", "daemonset", "aether-node")
    dep = get(cp, "-n", "aether-system", "deployment", "aether-operator")
    return bool(ds["status"].get("numberReady") == 1 and dep["status"].get("availableReplicas") == 1)


def envoy_stats(prefixes: tuple[str, ...]) -> dict[str, int]:
    with urllib.request.urlopen(ENVOY_ADMIN + "/stats", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    out: dict[str, int] = {}
    for line in lines:
        name, _, value = line.partition(": ")
        if name.startswith(prefixes) and value.isdigit():
            out[name] = int(value)
    return out


def replies(node: Node, pod: str) -> list[str]:
    return [line for line in node.pod_log(manifests.NAMESPACE, pod).splitlines() if "reply" in line]


def diagnostics(node: Node) -> str:
    """The last lines of the client, the sidecar and the operator (the kubelet's log files)."""
    parts = [("kubelet-e2e", "udp-client"), ("aether-system", "aether-node"), ("aether-system", "aether-operator")]
    return "\n".join(
        f"--- {ns}/{pod}:\n" + "\n".join(node.pod_log(ns, pod + "*").splitlines()[-8:]) for ns, pod in parts
    )


def scenario(cp: cluster.ControlPlane, node: Node) -> dict[str, Any]:
    """The workload through the capture; returns the evidence."""
    step("workload: echo pod and its UDP Service in a meshed namespace")
    kubectl(cp, "apply", "-f", "-", input=yaml.safe_dump_all(manifests.workload_service()))
    svc = get(cp, "-n", manifests.NAMESPACE, "service", "udp-echo")
    vip = str(svc["spec"]["clusterIP"])
    kubectl(cp, "apply", "-f", "-", input=yaml.safe_dump_all(manifests.workload_clients(vip)))
    kubectl(cp, "-n", manifests.NAMESPACE, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=120s")
    step(f"waiting for udp-client's replies from {vip}:18082")
    got = wait_for(
        lambda: (
            answered if len(answered := [r for r in replies(node, "udp-client") if 'reply "echo:' in r]) >= 5 else None
        ),
        90,
        "five replies through the capture",
        interval=0.5,
        diagnose=lambda: diagnostics(node),
    )
    control = node.pod_log(manifests.NAMESPACE, "udp-control").splitlines()
    client = node.pod_log(manifests.NAMESPACE, "udp-client").splitlines()
    stats = envoy_stats(("udp.udp_capture_kubelet-e2e_udp-client.", f"cluster.udp_{manifests.NAMESPACE}/udp-echo.udp."))
    echo = node.pod_log(manifests.NAMESPACE, "udp-echo").splitlines()
    meshnode = get(cp, "meshnode", NODE)
    records = sorted(_record_name(p) for p in Path("/run/aether/pods").glob("*.json"))
    conflist = json.loads(next((node.root / "etc/cni/net.d").glob("*.conflist")).read_text())
    return {
        "vip": vip,
        "client_queries": len(client),
        "client_replies": [_text(r) for r in got],
        "client_unanswered": [_text(r) for r in client if "no reply" in r],
        "control_lines": [_text(c) for c in control],
        "control_replied": any('reply "echo:' in c for c in control),
        "echo_saw": [_text(e) for e in echo[-2:]],
        "envoy": {k: v for k, v in stats.items() if v},
        "meshnode_conditions": {c["type"]: c["status"] for c in meshnode["status"].get("conditions", [])},
        "pod_records": records,
        "conflist_plugins": [p["type"] for p in conflist["plugins"]],
    }


def _record_name(path: Path) -> str:
    record = json.loads(path.read_text())
    return f"{record.get('namespace')}/{record.get('name')}"


def _text(line: str) -> str:
    """A CRI log line's message (after its timestamp, stream and tag)."""
    return line.split(" ", 3)[-1]


def boot(node: Node, work: Path) -> tuple[cluster.ControlPlane, list[cluster.Process]]:
    step("containerd (its own socket and state under the run's root)")
    node.prepare()
    run("ip", "link", "add", BRIDGE, "type", "bridge")  # made here so route_localnet is on before any pod
    node.bridge_route_localnet()
    node.start_containerd()
    wait_for(lambda: node.ctr("version", check=False).returncode == 0 or None, 30, "containerd", interval=0.2)
    step("images into containerd's k8s.io namespace (podman save | ctr images import)")
    names = images.names()
    for image in (names["operator"], names["node"], "localhost/aether-kubelet-pause:0.1", manifests.UDP_IMAGE):
        node.import_image(images.podman(), image)
    step("control plane (the fixture) + kube-scheduler + pod controllers")
    cp = cluster.start(workdir=work)
    extra = extra_processes(cp, node.bin_dir, work)
    for p in extra:
        p.start()
    node.play_kube_proxy(int(cp.url.rsplit(":", 1)[1]))
    kubeconfig = identities.certificate_kubeconfig(
        cp, work / "node.kubeconfig", f"system:node:{NODE}", groups=("system:nodes",)
    )
    step("kubelet")
    node.start_kubelet(kubeconfig, cp.ca_path, NODE_IP)
    wait_for(
        lambda: _node_ready(cp),
        90,
        "Node Ready",
        interval=0.5,
        ignore=(RuntimeError,),
        diagnose=lambda: node.log("k").read_text()[-3000:],
    )
    return cp, extra


def _node_ready(cp: cluster.ControlPlane) -> dict[str, Any] | None:
    n = get(cp, "node", NODE)
    return n if condition(n, "Ready") == "True" and not n["spec"].get("taints") else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--chart", action="store_true", help="install deploy/helm/aether (helm template) instead of deploy/"
    )
    args = ap.parse_args(argv)
    out = subprocess.run([str(REPO / "e2e/kubelet/build.sh")], capture_output=True, text=True, check=True)
    root = Path(tempfile.mkdtemp(prefix="aether-kubelet-"))
    node = Node(root, NODE, Path(out.stdout.strip().splitlines()[-1]))
    cp: cluster.ControlPlane | None = None
    extra: list[cluster.Process] = []
    started = time.monotonic()
    try:
        cp, extra = boot(node, root / "cp")
        n = get(cp, "node", NODE)["status"]["nodeInfo"]
        print(f"   node {NODE} Ready: kubelet {n['kubeletVersion']}, {n['containerRuntimeVersion']}", flush=True)
        what = "the Helm chart (helm template)" if args.chart else "deploy/ (kubectl kustomize)"
        step(f"{what}, host paths moved under the run's root, server-side apply")
        deploy(cp, node, args.chart)
        wait_for(
            lambda: ready_workloads(cp) or None,
            180,
            "DaemonSet and Deployment ready",
            interval=1,
            ignore=(RuntimeError, KeyError),
            diagnose=lambda: kubectl(cp, "get", "pods", "-A", "-o", "wide") + diagnostics(node),
        )
        print(kubectl(cp, "get", "pods", "-A", "-o", "wide"), flush=True)
        evidence = scenario(cp, node)
        print(json.dumps(evidence, indent=2), flush=True)
        ok = len(evidence["client_replies"]) >= 5 and len(evidence["control_lines"]) >= 2
        ok = ok and not evidence["control_replied"]
        print(f"== {'PASS' if ok else 'FAIL'} in {time.monotonic() - started:.0f} s", flush=True)
        return 0 if ok else 1
    finally:
        step("cleanup")
        if cp is not None and node.processes.get("kubelet") is not None:
            for ns in (manifests.NAMESPACE, "aether-system"):
                cp.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=90s", check=False)
        removed = node.cleanup()
        for p in extra:
            p.stop()
        if cp is not None:
            cp.stop()
        shutil.rmtree(root, ignore_errors=True)
        print("   removed: " + ", ".join(removed), flush=True)


if __name__ == "__main__":
    sys.exit(main())
