"""A one-node test bed on the netns Lab: real Envoy in the node netns, the sidecar as a process, client pods
with the capture installed, UDP echo backends in their own pods. Used by tests/xds and bench/xds_udp_path.py.

ADS and Envoy's admin use unix sockets (paths cross netns), so the sidecar runs in the test's netns while
Envoy runs in the node netns; Envoy binds each client pod's capture listener into that pod's netns.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from aether.api.meshnode import Endpoint, MeshNode, MeshPod, ServiceArm
from aether.netns.contract import L4_OUTBOUND_PORT, CaptureMode
from aether.netns.install import install_capture
from aether.netns.records import PodRecord, write_record
from aether.testing.envoy import Envoy, start_envoy
from aether.testing.netlab import Lab, Node, Pod, sh
from aether.testing.probe import pod_socket
from aether.testing.promtext import Samples, scrape
from aether.testing.wait import wait_for
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
    node_name: str = "node-a"
    envoy_args: list[str] = field(default_factory=list)
    areas: str = "udp,tcp-floor"  # "" = every area (east-west too: the sidecar then serves its SDS secrets)
    sidecar_args: list[str] = field(default_factory=list)
    node: Node = field(init=False)
    clients: dict[str, Pod] = field(default_factory=dict)
    services: dict[str, Service] = field(default_factory=dict)
    envoy: Envoy | None = None
    sidecar: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    ipv6: bool = False  # pods get an IPv6 address beside IPv4 (fd00:201::/64), backends answer on both families

    def __post_init__(self) -> None:
        self.node = self.lab.add_node("node")
        self.records_dir = self.workdir / "pods"
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.state_file = self.workdir / "meshnode.yaml"
        self.status_file = self.workdir / "meshnode.yaml.status.json"
        self.ads_sock = str(self.workdir / "ads.sock")
        self.admin_sock = str(self.workdir / "admin.sock")
        self._ips = iter(f"10.201.{i // 250}.{i % 250 + 2}" for i in range(10_000))
        self._ips6 = iter(f"fd00:201::{i + 2:x}" for i in range(10_000))
        if self.ipv6:  # the node's own IPv6 address, which its proxy sends to the pods from (a node has one)
            sh("ip", "-6", "addr", "add", "fd00:201::1/128", "dev", "lo", netns=self.node.netns)

    # -- pods ----------------------------------------------------------------------------------------
    def add_client(self, name: str, mode: CaptureMode = CaptureMode.TPROXY) -> Pod:
        pod = self.lab.add_pod(self.node, name, next(self._ips), ip6=next(self._ips6) if self.ipv6 else None)
        install_capture(pod.path, mode)
        write_record(
            PodRecord(uid=f"uid-{name}", namespace="default", name=name, netns=pod.path, ips=[pod.ip]), self.records_dir
        )
        self.clients[name] = pod
        return pod

    def add_service(self, svc: str, vip: str, port: int = 5353) -> Service:
        pod = self.lab.add_pod(self.node, f"be-{svc}", next(self._ips), ip6=next(self._ips6) if self.ipv6 else None)
        argv = [sys.executable, "-m", "aether.testing.udp_echo", svc, str(port), *(["--dual-stack"] * self.ipv6)]
        self.lab.spawn(pod.netns, argv, stdout=subprocess.DEVNULL)
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
        wait_for(self.sidecar_metrics, timeout=30, what="sidecar metrics", ignore=(OSError,))

    def stop_sidecar(self) -> None:
        if self.sidecar is not None:
            self.lab.stop(self.sidecar)
            self.sidecar = None

    def sidecar_metrics(self) -> Samples:
        return scrape(f"http://127.0.0.1:{self.metrics_port}/metrics")

    def start_envoy(self) -> None:
        """Envoy in the node netns, ADS from the sidecar's socket; its log is workdir/envoy.log."""
        boot = ads_bootstrap(self.node_name, f"unix:{self.ads_sock}", f"unix:{self.admin_sock}")
        self.envoy = start_envoy(boot, self.workdir, lab=self.lab, netns=self.node.netns, args=self.envoy_args)

    def stop_envoy(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
            self.envoy = None

    def running_envoy(self) -> Envoy:
        if self.envoy is None:
            raise RuntimeError("Envoy is not running: start_envoy() first")
        return self.envoy

    def admin(self, path: str) -> str:
        return self.running_envoy().admin(path)

    def stats(self, pattern: str = "") -> dict[str, int]:
        return self.running_envoy().stats(pattern)

    def wait_programmed(self, timeout: float = 30.0) -> dict[str, object]:
        """Wait until the status file says Programmed=True for the current state; return the condition."""

        def programmed() -> dict[str, object] | None:
            cond = self.condition()
            return cond if cond["status"] == "True" else None

        return wait_for(programmed, timeout=timeout, what="Programmed=True", ignore=(OSError, ValueError, LookupError))

    def condition(self, kind: str = "Programmed") -> dict[str, object]:
        """The status file's condition of type `kind` (the sidecar writes others beside it, e.g. PairsPersisted)."""
        conditions: list[dict[str, object]] = json.loads(self.status_file.read_text())["status"]["conditions"]
        return next(c for c in conditions if c.get("type") == kind)

    def wait_listeners(self, n: int, timeout: float = 30.0) -> None:
        wait_for(
            lambda: self.running_envoy().stat("listener_manager.total_listeners_active") == n,
            timeout=timeout,
            what=f"{n} active listeners",
        )


def wait_reply(sock: socket.socket, vip: str, expect: bytes, timeout: float = 20.0) -> None:
    """Retry until a datagram to vip gets a reply starting with `expect` (config still propagating)."""

    def answered() -> bool:
        got = ask(sock, vip)
        return got is not None and got[0].startswith(expect)

    wait_for(answered, timeout=timeout, what=f"a reply {expect!r} from {vip}", interval=0.05)
