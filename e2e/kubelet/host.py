"""The node side of e2e/kubelet: containerd and the kubelet as processes of this run, their configuration, the one
Service rule that plays kube-proxy, and the cleanup of everything they leave on the host.

Every path lives under one root (`Node.root`); containerd listens on a socket there (never the packaged service's
/run/containerd/containerd.sock) and keeps its images, snapshots and state there. What lands outside it is removed
by `Node.cleanup` by name: the pods' netns files (their paths from the pod records aether-cni writes, and from the
CRI), the `kubepods` cgroups, the bridge, the nftables table, /run/aether and the shims' /run/containerd."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from aether.testing.controlplane.cluster import Process

BRIDGE = "aekub0"
POD_SUBNET = "10.244.7.0/24"
NFT_TABLE = "aether_kubelet_e2e"
KUBELET_FIXED_DIRS = (Path("/var/lib/kubelet"), Path("/var/log/containers"))
GUARD_TABLE = ("inet", "aether_guard")  # aether node-guard's table (netns/node_guard.py)
KUBELET_PORT = 10350
CGROUP_ROOT = Path("/sys/fs/cgroup")


def containerd_config(root: Path) -> str:
    """containerd 1.6's CRI, as this host allows it: runc through cgroupfs (no systemd), overlayfs on the root's
    ext4, the local pause image as the sandbox, and `restrict_oom_score_adj` (this sandbox lacks CAP_SYS_RESOURCE:
    runc's write of oom_score_adj -998 for a pod sandbox fails with EACCES, seen as "can't get final child's PID
    from pipe: EOF")."""
    return f"""version = 2
root = "{root}/containerd/root"
state = "{root}/containerd/state"
[grpc]
  address = "{root}/containerd/containerd.sock"
[ttrpc]
  address = "{root}/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{root}/containerd/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    restrict_oom_score_adj = true
    sandbox_image = "localhost/aether-kubelet-pause:0.1"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{root}/opt/cni/bin"
      conf_dir = "{root}/etc/cni/net.d"
"""


def primary_conflist(root: Path) -> str:
    """The node's primary CNI (the standard bridge + host-local + portmap plugins), which the DaemonSet chains into."""
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "kubelet-e2e",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "isDefaultGateway": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "dataDir": f"{root}/cni-ipam",
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        },
        indent=2,
    )


def kubelet_config(root: Path, ca: Path) -> str:
    """cgroup v1 (this host's hybrid layout: kubelet 1.35 refuses it unless failCgroupV1 is false), cgroupfs, no
    swap check, x509 clients of the cluster CA only, and every directory it writes under `root`."""
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{root}/containerd/containerd.sock
address: 127.0.0.1
port: {KUBELET_PORT}
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
podLogsDir: {root}/pod-logs
volumePluginDir: {root}/kubelet-plugins
resolvConf: /etc/resolv.conf
evictionHard: {{memory.available: 100Mi}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
"""


def service_dnat(api_port: int) -> str:
    """kube-proxy's part for the one Service in-cluster clients need: `kubernetes` (10.96.0.1:443) to the API
    server on loopback, from the host (hostNetwork pods) and from the pod bridge (with route_localnet on it)."""
    rule = f"ip daddr 10.96.0.1 tcp dport 443 counter dnat to 127.0.0.1:{api_port}"
    return (
        f"table ip {NFT_TABLE} {{\n"
        f"  chain out {{ type nat hook output priority -100; policy accept; {rule}; }}\n"
        f'  chain pre {{ type nat hook prerouting priority -100; policy accept; iifname "{BRIDGE}" {rule}; }}\n'
        "}\n"
    )


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=120)


@dataclass
class Node:
    root: Path
    name: str
    bin_dir: Path
    processes: dict[str, Process] = field(default_factory=dict)
    made_run_aether: bool = False
    made_run_containerd: bool = False
    made_guard: bool = False
    made_dirs: list[Path] = field(default_factory=list)

    @property
    def address(self) -> str:
        return str(self.root / "containerd" / "containerd.sock")

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run("ctr", "--address", self.address, "-n", "k8s.io", *args, check=check)

    def prepare(self) -> None:
        for d in ("opt/cni/bin", "etc/cni/net.d", "opt/aether", "pod-logs", "logs", "containerd"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        for plugin in Path("/usr/lib/cni").iterdir():
            shutil.copy2(plugin, self.root / "opt/cni/bin" / plugin.name)
        (self.root / "etc/cni/net.d/10-kubelet-e2e.conflist").write_text(primary_conflist(self.root))
        (self.root / "containerd/config.toml").write_text(containerd_config(self.root))
        self.made_run_aether = not Path("/run/aether").exists()
        self.made_run_containerd = not Path("/run/containerd").exists()
        # what the kubelet makes at fixed paths whatever its --root-dir: its device-plugin socket directory and the
        # /var/log/containers links to each container's log
        self.made_dirs = [p for p in KUBELET_FIXED_DIRS if not p.exists()]
        # the DaemonSet's install-cni may install the node's mesh-source guard in this (the host's) netns
        self.made_guard = run("nft", "list", "table", *GUARD_TABLE, check=False).returncode != 0

    def start_containerd(self) -> None:
        p = Process("containerd", ["containerd", "--config", str(self.root / "containerd/config.toml")], self.log("c"))
        self.processes["containerd"] = p
        p.start()

    def log(self, what: str) -> Path:
        return self.root / "logs" / {"c": "containerd.log", "k": "kubelet.log"}[what]

    def import_image(self, podman: str, image: str, *tags: str) -> None:
        tar = self.root / "image.tar"
        run(podman, "save", "-o", str(tar), image)
        self.ctr("images", "import", str(tar))
        tar.unlink()
        for tag in tags:
            self.ctr("images", "tag", "--force", image, tag)

    def start_kubelet(self, kubeconfig: Path, ca: Path, node_ip: str) -> None:
        config = self.root / "kubelet-config.yaml"
        config.write_text(kubelet_config(self.root, ca))
        argv = [
            str(self.bin_dir / "kubelet"),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.root / 'kubelet'}",
            f"--cert-dir={self.root / 'kubelet' / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={node_ip}",
            "-v=1",
        ]
        self.processes["kubelet"] = p = Process("kubelet", argv, self.log("k"))
        p.start()

    def play_kube_proxy(self, api_port: int) -> None:
        subprocess.run(["nft", "-f", "-"], input=service_dnat(api_port), text=True, check=True, timeout=30)

    def bridge_route_localnet(self) -> None:
        Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/route_localnet").write_text("1\n")

    def pod_log(self, namespace: str, pod: str) -> str:
        """The kubelet's CRI log files of a pod, every container and restart (no `kubectl logs`: the API server
        cannot resolve the node's name to reach the kubelet's port)."""
        return "".join(f.read_text() for f in sorted(self.root.glob(f"pod-logs/{namespace}_{pod}_*/*/*.log")))

    # -- cleanup ---------------------------------------------------------------------------------------------------
    def cleanup(self) -> list[str]:
        """Stop containerd and the kubelet and remove what they left outside `root` (returned); `root` itself is the
        caller's to remove once the control plane under it has stopped."""
        done: list[str] = []
        if "kubelet" in self.processes:
            self.processes.pop("kubelet").stop()
        netns = self._netns_paths()
        if "containerd" in self.processes and self.processes["containerd"].alive():
            self._remove_sandboxes()
            self.processes.pop("containerd").stop()
        for pid in self._shims():
            os.kill(pid, signal.SIGKILL)
            done.append(f"shim {pid}")
        for path in netns:
            if Path(path).exists():
                run("umount", path, check=False)
                Path(path).unlink(missing_ok=True)
                done.append(path)
        for mount in self._mounts_under_root():
            run("umount", "-l", mount, check=False)
        done += self._remove_cgroups()
        if run("ip", "link", "show", BRIDGE, check=False).returncode == 0:
            run("ip", "link", "del", BRIDGE, check=False)
            done.append(f"link {BRIDGE}")
        if run("nft", "list", "table", "ip", NFT_TABLE, check=False).returncode == 0:
            run("nft", "delete", "table", "ip", NFT_TABLE, check=False)
            done.append(f"nft table ip {NFT_TABLE}")
        if self.made_guard and run("nft", "list", "table", *GUARD_TABLE, check=False).returncode == 0:
            run("nft", "delete", "table", *GUARD_TABLE, check=False)
            done.append("nft table " + " ".join(GUARD_TABLE))
        for made_dir in self.made_dirs:
            if made_dir.exists():
                shutil.rmtree(made_dir, ignore_errors=True)
                done.append(str(made_dir))
        for made, path in ((self.made_run_aether, "/run/aether"), (self.made_run_containerd, "/run/containerd")):
            if made and Path(path).exists():
                shutil.rmtree(path, ignore_errors=True)
                done.append(path)
        return done

    def _netns_paths(self) -> set[str]:
        paths: set[str] = set()
        for record in Path("/run/aether/pods").glob("*.json"):
            try:
                paths.add(str(json.loads(record.read_text())["netns"]))
            except (OSError, ValueError, KeyError):
                continue
        out = self.ctr("containers", "ls", "-q", check=False).stdout.split() if self._containerd_up() else []
        for cid in out:
            info = self.ctr("containers", "info", cid, check=False).stdout
            try:
                spec = json.loads(info).get("Spec") or {}
            except ValueError:
                continue
            for ns in (spec.get("linux") or {}).get("namespaces") or []:
                if ns.get("type") == "network" and str(ns.get("path", "")).startswith("/var/run/netns/cni-"):
                    paths.add(ns["path"])
        return paths

    def _containerd_up(self) -> bool:
        return "containerd" in self.processes and self.processes["containerd"].alive()

    def _remove_sandboxes(self) -> None:
        for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
            self.ctr("tasks", "delete", "-f", task, check=False)
        for cid in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            self.ctr("containers", "delete", cid, check=False)

    def _shims(self) -> list[int]:
        """containerd-shim-runc-v2 processes of this run's containerd (their -address is our socket)."""
        pids: list[int] = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and self.address.encode() in argv:
                pids.append(int(proc.name))
        return pids

    def _mounts_under_root(self) -> list[str]:
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        return sorted((m for m in mounts if m.startswith(str(self.root) + "/")), key=len, reverse=True)

    def _remove_cgroups(self) -> list[str]:
        done: list[str] = []
        for hierarchy in CGROUP_ROOT.iterdir():
            top = hierarchy / "kubepods"
            if not top.is_dir():
                continue
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                d.rmdir()  # cgroup v1: a directory with only control files in it goes
            top.rmdir()
            done.append(str(top))
        return done
