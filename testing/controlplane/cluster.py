"""A real Kubernetes control plane on loopback for the API-facing tests: etcd, kube-apiserver and
kube-controller-manager at the pinned version (`make k8s`), with certificates made at start.

    cp = start()                       # -> ControlPlane; .kubeconfig_path, .url, .version, .kubectl(...), .stop()

The API server runs RBAC and Node authorization, the default admission chain (ValidatingAdmissionPolicy included)
and a service CIDR per IP family asked for (`start(ip_family="ipv4"|"ipv6"|"dual")`, families.py), so Services get
their ClusterIPs from the real allocator per `ipFamilyPolicy` and `ipFamilies`. The controller manager runs the
EndpointSlice, garbage-collector, namespace, service-account and token controllers. No kubelet, scheduler or
kube-proxy: the harness plays the kubelet (it creates Pods with `spec.nodeName` and writes their status).
Our CRDs, the upstream Gateway API CRDs (crds/gateway-api/, one channel) and the upstream multicluster Services API
CRDs (crds/mcs-api/) are applied as shipped."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from aether.api.crdgen import crds_dir
from aether.testing import kubeconfig
from aether.testing.apitestbed.server import AuditRecord
from aether.testing.controlplane import pki
from aether.testing.controlplane.binaries import tool
from aether.testing.controlplane.families import SERVICE_CIDR_V4, IpFamily, check, kubernetes_vips, service_cidrs
from aether.testing.netlab import die_with_parent

SERVICE_CIDR = SERVICE_CIDR_V4  # the IPv4 control plane's (the default); families.py has the others
CHANNELS = ("standard", "experimental")
# kube-controller-manager --controllers: what a mesh's API objects depend on, nothing that needs a kubelet
CONTROLLERS = (
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
)
START_TIMEOUT = 90.0
# gitVersion of every control plane this process started (the test session's summary prints them)
STARTED: list[str] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def gateway_api_crds(channel: str) -> list[Path]:
    """The vendored upstream Gateway API CRDs of `channel` (crds/gateway-api/VERSION names the release)."""
    if channel not in CHANNELS:
        raise ValueError(f"unknown Gateway API channel {channel!r} (known: {', '.join(CHANNELS)})")
    return sorted((crds_dir() / "gateway-api" / channel).glob("*.yaml"))


def mesh_crds() -> list[Path]:
    names = ("meshnode.yaml", "meshserviceslices.yaml", "meshauthorizationpolicy.yaml", "meshpeer.yaml")
    return [crds_dir() / n for n in names]


def mcs_crds() -> list[Path]:
    """The vendored upstream multicluster Services API CRDs, ServiceExport and ServiceImport (crds/mcs-api/VERSION)."""
    return sorted((crds_dir() / "mcs-api").glob("*.yaml"))


def write_kubeconfig(path: Path, url: str, ca: Path, user: pki.Pair, name: str = "aether-control-plane") -> Path:
    return kubeconfig.write_kubeconfig(
        path, url, {"client-certificate": str(user.cert), "client-key": str(user.key)}, name, ca
    )


@dataclass
class Process:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            # dies with the thread that starts it, however the test process dies (netlab.die_with_parent)
            self.proc = subprocess.Popen(
                die_with_parent(self.argv), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"  {self.name}: {line}" for line in text[-lines:])


@dataclass
class ControlPlane:
    """A running control plane. `stop_apiserver()`/`start_apiserver()` make a real outage (etcd keeps the data)."""

    workdir: Path
    channel: str
    owns_workdir: bool
    apiserver_args: tuple[str, ...] = ()  # extra kube-apiserver flags, e.g. ("--watch-cache=false",)
    ip_family: IpFamily = "ipv4"  # the service CIDRs' families (families.py): ipv4, ipv6 or dual
    url: str = ""
    version: str = ""
    kubeconfig_path: Path = field(default=Path())
    processes: dict[str, Process] = field(default_factory=dict)
    authority: pki.Authority | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def boot(self, crds: bool) -> None:
        pki_dir = self.workdir / "pki"
        pki_dir.mkdir(parents=True, exist_ok=True)
        ca = pki.Authority(pki_dir)
        self._ca = ca.cert
        self.authority = ca  # signs further client identities (aether.testing.controlplane.identities)
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            ips=("127.0.0.1", *kubernetes_vips(self.ip_family)),
            server=True,
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
        )
        admin = ca.issue("admin", "aether-test-admin", groups=("system:masters",))
        kcm = ca.issue("kube-controller-manager", "system:kube-controller-manager")
        sa = pki.service_account_keys(pki_dir)
        port = free_port()
        self.url = f"https://127.0.0.1:{port}"
        self.kubeconfig_path = write_kubeconfig(self.workdir / "kubeconfig", self.url, ca.cert, admin)
        kcm_config = write_kubeconfig(self.workdir / "kcm.kubeconfig", self.url, ca.cert, kcm)
        self._admin = admin
        self._define(port, serving, sa, kcm_config)
        try:
            self.processes["etcd"].start()
            self.start_apiserver()
            self.processes["kube-controller-manager"].start()
            self.version = json.loads(self.get("/version"))["gitVersion"]
            STARTED.append(self.version)
            if crds:
                self.install(mesh_crds() + gateway_api_crds(self.channel) + mcs_crds())
        except BaseException:
            self.stop()
            raise

    def _define(self, port: int, serving: pki.Pair, sa: pki.Pair, kcm_config: Path) -> None:
        client, peer = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{client}"
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        self.processes["etcd"] = Process(
            "etcd",
            [
                tool("etcd"),
                "--name",
                "default",
                "--data-dir",
                str(self.workdir / "etcd"),
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer}",
                "--log-level",
                "warn",
            ],
            logs / "etcd.log",
        )
        self.etcd_url = etcd_url
        self.processes["kube-apiserver"] = Process(
            "kube-apiserver",
            [
                tool("kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'pki'}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={self._ca}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={sa.cert}",
                f"--service-account-signing-key-file={sa.key}",
                f"--service-cluster-ip-range={','.join(service_cidrs(self.ip_family))}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "-v=1",
                f"--audit-policy-file={self._audit_policy()}",
                f"--audit-log-path={self.audit_path}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--audit-log-maxsize=0",
                *self.apiserver_args,
            ],
            logs / "kube-apiserver.log",
        )
        self.processes["kube-controller-manager"] = Process(
            "kube-controller-manager",
            [
                tool("kube-controller-manager"),
                f"--kubeconfig={kcm_config}",
                f"--controllers={','.join(CONTROLLERS)}",
                f"--service-account-private-key-file={sa.key}",
                f"--root-ca-file={self._ca}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                "--secure-port=0",
                "--concurrent-service-endpoint-syncs=5",
                "--endpointslice-updates-batch-period=0s",
                "-v=1",
            ],
            logs / "kube-controller-manager.log",
        )

    @property
    def audit_path(self) -> Path:
        return self.workdir / "logs" / "audit.jsonl"

    def _audit_policy(self) -> Path:
        """Every request at Metadata level, once, when its response is complete (what RBAC sees of it)."""
        path = self.workdir / "audit-policy.yaml"
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived", "ResponseStarted"],
            "rules": [{"level": "Metadata"}],
        }
        path.write_text(yaml.safe_dump(policy))
        return path

    @property
    def audit(self) -> list[AuditRecord]:
        """The API server's audit log so far, oldest first, in the API test bed's record shape."""
        try:
            lines = self.audit_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [audit_record(json.loads(line)) for line in lines if line.strip()]

    def set_down(self, down: bool) -> None:
        """A real outage: the API server process stopped (etcd keeps the data), then started again."""
        if down:
            self.stop_apiserver()
        else:
            self.start_apiserver()

    def start_apiserver(self, timeout: float = START_TIMEOUT) -> None:
        self.processes["kube-apiserver"].start()
        self.wait_ready(timeout)

    def stop_apiserver(self) -> None:
        self.processes["kube-apiserver"].stop()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            for p in self.processes.values():
                if p.proc is not None and not p.alive():
                    raise RuntimeError(f"{p.name} exited ({p.proc.returncode}):\n{p.tail()}")
            try:
                if self.get("/readyz") == "ok":
                    return
            except OSError as exc:
                last = exc
            time.sleep(0.2)
        raise TimeoutError(f"kube-apiserver not ready after {timeout:g}s ({last!r}):\n{self.diagnostics()}")

    def stop(self) -> None:
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            if name in self.processes:
                self.processes[name].stop()
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- use ------------------------------------------------------------------------------------------------------
    @property
    def ca_path(self) -> Path:
        return self._ca

    def admin_ssl_context(self) -> ssl.SSLContext:
        """TLS as the admin (system:masters), trusting this control plane's CA."""
        return self._context()

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self._ca))
        ctx.load_cert_chain(str(self._admin.cert), str(self._admin.key))
        return ctx

    def get(self, path: str, timeout: float = 5.0) -> str:
        """GET `path` as the admin (raw text)."""
        with urllib.request.urlopen(self.url + path, context=self._context(), timeout=timeout) as resp:
            body: bytes = resp.read()
            return body.decode()

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """kubectl as the admin; with `check`, a non-zero exit raises RuntimeError carrying kubectl's stderr."""
        out = subprocess.run(
            [tool("kubectl"), "--kubeconfig", str(self.kubeconfig_path), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args[:3])} ... failed ({out.returncode}): {out.stderr.strip()}")
        return out

    def install(self, paths: list[Path]) -> None:
        """`kubectl apply --server-side` the files as shipped, then wait for every CRD among them to be Established."""
        args = [a for p in paths for a in ("-f", str(p))]
        self.kubectl("apply", "--server-side", "--force-conflicts", *args)
        names = [
            d["metadata"]["name"]
            for p in paths
            for d in yaml.safe_load_all(p.read_text())
            if d and d.get("kind") == "CustomResourceDefinition"
        ]
        if names:
            self.kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in names))

    def diagnostics(self) -> str:
        return "\n".join(p.tail() for p in self.processes.values())

    def etcd(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A call to etcd's v3 JSON gateway (e.g. `/v3/kv/compaction`), for tests that act on storage directly."""
        req = urllib.request.Request(self.etcd_url + path, json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out


def audit_record(event: dict[str, Any]) -> AuditRecord:
    ref = event.get("objectRef") or {}
    return AuditRecord(
        verb=event.get("verb", ""),
        api_group=ref.get("apiGroup") or None,
        resource=ref.get("resource"),
        subresource=ref.get("subresource"),
        namespace=ref.get("namespace"),
        name=ref.get("name"),
        path=event.get("requestURI", ""),
        code=int((event.get("responseStatus") or {}).get("code") or 0),
        user_agent=event.get("userAgent", ""),
    )


def start(
    workdir: Path | None = None,
    crds: bool = True,
    channel: str = "experimental",
    apiserver_args: tuple[str, ...] = (),
    ip_family: IpFamily = "ipv4",
) -> ControlPlane:
    """Boot a control plane in `workdir` (a new temporary directory, removed at stop, when None) whose Services get
    ClusterIPs of `ip_family` (ipv4, ipv6 or dual: families.service_cidrs)."""
    if channel not in CHANNELS:
        raise ValueError(f"unknown Gateway API channel {channel!r} (known: {', '.join(CHANNELS)})")
    owns = workdir is None
    where = Path(tempfile.mkdtemp(prefix="aether-k8s-")) if workdir is None else workdir
    cp = ControlPlane(where, channel, owns, apiserver_args, check(ip_family))
    cp.boot(crds)
    return cp
