"""A one-node test bed on the netns Lab: real Envoy in the node netns, the sidecar as a process, client pods
with the capture installed, UDP echo backends in their own pods. Used by tests/xds and bench/xds_udp_path.py.

ADS and Envoy's admin use unix sockets (paths cross netns), so the sidecar runs in the test's netns while
Envoy runs in the node netns; Envoy binds each client pod's capture listener into that pod's netns.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from aether.api.meshnode import Endpoint, MeshNode, MeshPod, ServiceArm
from aether.netns.contract import L4_OUTBOUND_PORT, CaptureMode
from aether.netns.install import install_capture
from aether.netns.records import PodRecord, write_record
from aether.testing.envoy_admin import admin_get
from aether.testing.envoybin import envoy_path
from aether.testing.netlab import Lab, Node, Pod, wait_for
from aether.testing.probe import pod_socket
from aether.xds.sidecar.bootstrap import ads_bootstrap


def udp_socket_in(netns_path: str, timeout: float = 1.0) -> socket.socket:
    """A UDP socket created inside the netns at `netns_path` (it stays there whoever uses it)."""
    return pod_socket(netns_path, timeout)


def ask(
    sock: socket.socket, vip: str, payload: bytes = b"ping", port: int = L4_OUTBOUND_PORT
) -> tuple[bytes, tuple[str, int]] | None:
    """Send one datagram to vip:port, return (reply, source) or None on timeout."""
    sock.sendto(payload, (vip, port))
    try:
        data, src = sock.recvfrom(65535)
    except TimeoutError:
        return None
    return data, src


def parse_prometheus(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


@dataclass
class Service:
    name: str  # <ns>/<svc>
    vip: str
    backend: Pod
    port: int

    def arm(self) -> ServiceArm:
        ns, svc = self.name.split("/")
        return ServiceArm(
            service=self.name,
            vip=self.vip,
            cluster=f"udp:{ns}/{svc}",
            backend=self.name,
            endpoints=[Endpoint(ip=self.backend.ip, port=self.port)],
        )


@dataclass
class NodeBed:
    lab: Lab
    workdir: Path
    base_id: int
    node_name: str = "node-a"
    envoy_args: list[str] = field(default_factory=list)
    areas: str = "udp,tcp-floor"  # "" = every area (east-west too: the sidecar then serves its SDS secrets)
    sidecar_args: list[str] = field(default_factory=list)
    node: Node = field(init=False)
    clients: dict[str, Pod] = field(default_factory=dict)
    services: dict[str, Service] = field(default_factory=dict)
    envoy: subprocess.Popen[bytes] | None = None
    sidecar: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0

    def __post_init__(self) -> None:
        self.node = self.lab.add_node("node")
        self.records_dir = self.workdir / "pods"
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.state_file = self.workdir / "meshnode.yaml"
        self.status_file = self.workdir / "meshnode.yaml.status.json"
        self.ads_sock = str(self.workdir / "ads.sock")
        self.admin_sock = str(self.workdir / "admin.sock")
        self._ips = iter(f"10.201.{i // 250}.{i % 250 + 2}" for i in range(10_000))

    # -- pods ----------------------------------------------------------------------------------------
    def add_client(self, name: str, mode: CaptureMode = CaptureMode.TPROXY) -> Pod:
        pod = self.lab.add_pod(self.node, name, next(self._ips))
        install_capture(pod.path, mode)
        write_record(
            PodRecord(uid=f"uid-{name}", namespace="default", name=name, netns=pod.path, ips=[pod.ip]), self.records_dir
        )
        self.clients[name] = pod
        return pod

    def add_service(self, svc: str, vip: str, port: int = 5353) -> Service:
        pod = self.lab.add_pod(self.node, f"be-{svc}", next(self._ips))
        self.lab.spawn(
            pod.netns, [sys.executable, "-m", "aether.testing.udp_echo", svc, str(port)], stdout=subprocess.DEVNULL
        )
        service = Service(f"default/{svc}", vip, pod, port)
        self.services[svc] = service
        return service

    # -- state ---------------------------------------------------------------------------------------
    def meshnode(self, services: list[str] | None = None, extra_arms: list[ServiceArm] | None = None) -> MeshNode:
        node = MeshNode.model_validate({"metadata": {"name": self.node_name}})
        node.status.pods = [
            MeshPod(uid=f"uid-{n}", namespace="default", name=n, ip=p.ip) for n, p in sorted(self.clients.items())
        ]
        names = sorted(self.services) if services is None else services
        node.status.udp.services = [self.services[n].arm() for n in names] + list(extra_arms or [])
        return node

    def write_state(self, node: MeshNode) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(node.wire()))
        os.replace(tmp, self.state_file)

    # -- processes -----------------------------------------------------------------------------------
    def start_sidecar(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.metrics_port = s.getsockname()[1]
        log = open(self.workdir / "sidecar.log", "ab")  # noqa: SIM115 (the process owns it)
        self.sidecar = self.lab.spawn(
            None,
            [
                sys.executable,
                "-m",
                "aether.cli",
                "xds",
                "--node",
                self.node_name,
                "--state",
                str(self.state_file),
                "--listen",
                f"unix:{self.ads_sock}",
                "--records",
                str(self.records_dir),
                "--metrics",
                f"127.0.0.1:{self.metrics_port}",
                "--areas",
                self.areas,
                *self.sidecar_args,
            ],
            stdout=log,
            stderr=log,
        )
        wait_for(lambda: self._metrics_up(), timeout=30, what="sidecar metrics")

    def stop_sidecar(self) -> None:
        if self.sidecar is not None:
            self.lab.stop(self.sidecar)
            self.sidecar = None

    def _metrics_up(self) -> bool:
        try:
            self.sidecar_metrics()
        except OSError:
            return False
        return True

    def sidecar_metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return parse_prometheus(resp.read().decode())

    def start_envoy(self) -> None:
        boot = ads_bootstrap(self.node_name, f"unix:{self.ads_sock}", f"unix:{self.admin_sock}")
        path = self.workdir / "envoy.json"
        path.write_text(json.dumps(boot))
        log = open(self.workdir / "envoy.log", "ab")  # noqa: SIM115 (the child process owns it)
        self.envoy = self.lab.spawn(
            self.node.netns,
            [
                str(envoy_path()),
                "-c",
                str(path),
                "--disable-hot-restart",
                "--base-id",
                str(self.base_id),
                "-l",
                "warning",
                *self.envoy_args,
            ],
            stdout=log,
            stderr=log,
        )
        wait_for(lambda: self.admin_ready(), timeout=30, what="envoy admin")

    def stop_envoy(self) -> None:
        if self.envoy is not None:
            self.lab.stop(self.envoy, timeout=15)
            self.envoy = None

    def admin(self, path: str) -> str:
        return admin_get(self.admin_sock, path)

    def admin_ready(self) -> bool:
        try:
            self.admin("/ready")
        except OSError:
            return False
        return True

    def stats(self, pattern: str = "") -> dict[str, int]:
        text = self.admin(f"/stats?filter={pattern}" if pattern else "/stats")
        out: dict[str, int] = {}
        for line in text.splitlines():
            key, sep, value = line.partition(": ")
            if sep and re.fullmatch(r"-?\d+", value.strip()):
                out[key] = int(value)
        return out

    def wait_programmed(self, timeout: float = 30.0) -> dict[str, object]:
        """Wait until the status file says Programmed=True for the current state; return the condition."""

        def ok() -> bool:
            try:
                cond = json.loads(self.status_file.read_text())["status"]["conditions"][0]
            except (OSError, ValueError, KeyError, IndexError):
                return False
            return bool(cond["status"] == "True")

        wait_for(ok, timeout=timeout, what="Programmed=True")
        cond: dict[str, object] = json.loads(self.status_file.read_text())["status"]["conditions"][0]
        return cond

    def condition(self) -> dict[str, object]:
        cond: dict[str, object] = json.loads(self.status_file.read_text())["status"]["conditions"][0]
        return cond

    def wait_listeners(self, n: int, timeout: float = 30.0) -> None:
        wait_for(
            lambda: (
                self.stats("listener_manager.total_listeners_active").get("listener_manager.total_listeners_active")
                == n
            ),
            timeout=timeout,
            what=f"{n} active listeners",
        )


def wait_reply(sock: socket.socket, vip: str, expect: bytes, timeout: float = 20.0) -> None:
    """Retry until a datagram to vip gets a reply starting with `expect` (config still propagating)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = ask(sock, vip)
        if got is not None and got[0].startswith(expect):
            return
        time.sleep(0.05)
    raise TimeoutError(f"no reply {expect!r} from {vip} within {timeout}s")
