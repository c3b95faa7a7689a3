"""The multi-node e2e harness: a whole mesh in network namespaces on one machine, driven through the API.
Long because: it is the one class tests and the demo drive a mesh through (nodes, pods, Services, routes, waits);
its addresses, API writes, CNI calls and node proxies already live in addresses.py, kube.py, cni_runtime.py and
node_proxy.py.

    with Mesh(workdir) as mesh:             # an API server (the real control plane by default) + `aether operator`
        a, b = mesh.add_node("node-a"), mesh.add_node("node-b")   # netns + Node object, nodes linked
        mesh.start_node_proxies()           # per node: `aether xds --node N` and a real Envoy in its netns
        client = mesh.add_pod(a, "client")  # netns + Pod object + the real aether-cni ADD + Running
        mesh.add_backend(b, "echo-a")       # a pod answering `<its name>|<payload>`
        vip = mesh.add_service("svc-a", ["echo-a"])    # Service with a VIP + its EndpointSlice
        mesh.wait_arms(a, {vip: "udp:e2e/svc-a"}) ...

The API server is the real control plane unless `control_plane="emulated"` (AETHER_CONTROL_PLANE sets the default);
the harness plays scheduler and kubelet and writes its selector-less Services' EndpointSlices. All it makes goes on
`close()` (also on failure). Each sidecar runs in the harness's netns (to reach the API on 127.0.0.1) and talks to
its Envoy, which runs in the node netns and binds each pod's listeners into the pod's netns, over a unix socket.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aether.api.naming import spiffe_id
from aether.e2e import cni_runtime
from aether.e2e.addresses import (
    check_family,
    echo_flags,
    give_node_address6,
    node_link6,
    pod_addresses,
    pod_ips,
    service_vips,
)
from aether.e2e.kube import Kube, pod_uids, udp_arms
from aether.e2e.node_proxy import MeshNodeProxy, connected
from aether.netns.contract import INBOUND_ANNOTATION, L4_OUTBOUND_PORT, CaptureMode
from aether.netns.install import install_capture
from aether.testing.apiserver import Kind, api_server, default_kind
from aether.testing.apitestbed import TestBed
from aether.testing.controlplane import ControlPlane, available
from aether.testing.controlplane.binaries import tool
from aether.testing.controlplane.families import IpFamily
from aether.testing.envoy import start_envoy
from aether.testing.netlab import Lab, Pod
from aether.testing.wait import wait_for
from aether.xds.identity.ca import BuiltinCA
from aether.xds.identity.pemdir import write_bundle, write_identity

BACKEND_PORT = 5353
HTTP_APP_PORT = 8080  # the east-west builders' default application port
Progress = Callable[[str], None]
App = Callable[[str, int], list[str]]  # (pod ip, port) -> the argv of a pod's app
XDS_CLI = (sys.executable, "-m", "aether.cli", "xds")
UDP_DATAPLANE_ENV = "AETHER_E2E_UDP_DATAPLANE"

# The node Envoy's flags beyond its bootstrap: the DaemonSet's --drain-time-s (tests/deploy/test_deploy_node_pair.py
# holds the two equal), one worker (the two proxies share this machine's cores with everything else)
NODE_ENVOY_DRAIN_TIME_S = 45
NODE_ENVOY_ARGS = ("--concurrency", "1", "--drain-time-s", str(NODE_ENVOY_DRAIN_TIME_S))


def _quiet(_: str) -> None: ...


@dataclass
class MeshPod:
    name: str
    namespace: str
    uid: str
    net: Pod
    node: MeshNodeProxy

    @property
    def netns_path(self) -> str:
        return self.net.path

    @property
    def ip(self) -> str:
        return self.net.ip


@dataclass
class Mesh:
    workdir: Path | None = None
    namespace: str = "e2e"
    progress: Progress = _quiet
    tag: str | None = None
    areas: str = "udp,tcp-floor"  # the east-west area needs certificates this harness does not issue
    operator_args: tuple[str, ...] = ()  # extra `aether operator` flags, e.g. ("--debounce", "0.01")
    sidecar_args: tuple[str, ...] = ()  # extra `aether xds` flags for every node, e.g. ("--udp-preserve-source",)
    # every sidecar's `--udp-dataplane`: "envoy" or "kernel" (nft rules in each meshed pod's netns); None: the
    # sidecar's default (envoy), or $AETHER_E2E_UDP_DATAPLANE when set (the whole UDP suite on either path)
    udp_dataplane: str | None = field(default_factory=lambda: os.environ.get(UDP_DATAPLANE_ENV) or None)
    envoy_args: tuple[str, ...] = ()  # extra Envoy flags for every node proxy started after it is set
    envoy_runtime: dict[str, Any] = field(default_factory=dict)  # a static runtime layer for those proxies
    # One CA for the whole mesh: the harness issues each pod's SVID into a PEM directory every sidecar reads
    # (--certs-dir), as a cert-manager/spiffe-helper would. Without it each sidecar uses its own built-in CA,
    # which is enough on one node but not across nodes.
    shared_ca: bool = False
    # with shared_ca, the mesh's CA: given, another Mesh's (two clusters, one trust domain); else made at start
    ca: BuiltinCA | None = None
    # Every pod's `mesh.aether.dev/inbound` annotation (None: none, the CNI entry's STRICT). Source-preserving UDP
    # (--udp-preserve-source) reaches backends from the client pod's own address, which STRICT cannot tell from a
    # direct datagram (docs/limits.md#security), so such a mesh runs PERMISSIVE; so does a test that compares the
    # mesh with the direct path.
    inbound: str | None = None
    # the UDPRoute CRD's Gateway API channel: "standard" or "experimental" (None: experimental, or on the emulator
    # its v1alpha2-only copy)
    channel: str | None = None
    control_plane: Kind = field(default_factory=default_kind)
    # dual: both service CIDRs, pods with an IPv6 ULA too, dual-stack UDP Services; ipv6: the IPv6 CIDR alone,
    # IPv6-only pods and Services (e2e/addresses.py)
    ip_family: IpFamily = "ipv4"
    lab: Lab = field(init=False)
    api: TestBed | ControlPlane | None = None
    kube: Kube = field(init=False)
    operator: subprocess.Popen[bytes] | None = None
    nodes: dict[str, MeshNodeProxy] = field(default_factory=dict)
    pods: dict[str, MeshPod] = field(default_factory=dict)
    services: dict[str, str] = field(default_factory=dict)  # name -> VIP
    services6: dict[str, str] = field(default_factory=dict)  # name -> IPv6 VIP (a dual-stack mesh's UDP Services)
    apps: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)  # pod name -> its app processes
    _own_workdir: bool = False
    _closed: bool = False

    def __post_init__(self) -> None:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="aether-mesh-"))
            self._own_workdir = True
        self.lab = Lab(tag=self.tag) if self.tag else Lab()
        self.tag = self.lab.tag
        self._vips = (service_vips(self.ip_family, i) for i in itertools.count(10))
        self._node_links = itertools.count(1)
        self._pod_ips: dict[str, itertools.count[int]] = {}
        self._ca: BuiltinCA | None = None
        self._server = contextlib.ExitStack()
        try:
            self._start_control_plane()
        except BaseException:
            self.close()
            raise

    @property
    def dir(self) -> Path:
        assert self.workdir is not None
        return self.workdir

    @property
    def kubeconfig(self) -> str:
        return str(self.dir / "kubeconfig")

    @property
    def certs_dir(self) -> Path:
        return self.dir / "certs"

    def _issue_svid(self, sa: str) -> None:
        assert self._ca is not None
        write_identity(self.certs_dir, self._ca.svid(spiffe_id(self.namespace, sa)))

    # -- control plane ----------------------------------------------------------------------------
    def _start_control_plane(self) -> None:
        family = check_family(self.ip_family)
        started = api_server(
            self.control_plane, kubeconfig=Path(self.kubeconfig), channel=self.channel, ip_family=family
        )
        server = self._server.enter_context(started)
        self.api, self.kube = server.control_plane or server.bed, Kube(self.kubeconfig)
        self.progress(f"API server: {server.version}; kubeconfig {self.kubeconfig}")
        self.kube.namespace(self.namespace)
        if self.shared_ca:
            self._ca = self.ca = self.ca or BuiltinCA()
            write_bundle(self.certs_dir, self._ca.bundle())
        self.start_operator()

    def start_operator(self) -> None:
        """`aether operator` on this mesh's API (again after a stop: what a restart of the operator's pod does)."""
        self.progress("starting the operator: aether operator --kubeconfig ...")
        log = open(self.dir / "operator.log", "ab")  # noqa: SIM115 (the process owns it)
        argv = [sys.executable, "-m", "aether.cli", "operator", "--kubeconfig", self.kubeconfig, *self.operator_args]
        self.operator = self.lab.spawn(None, argv, stdout=log, stderr=log)

    # -- nodes --------------------------------------------------------------------------------------
    def add_node(self, name: str) -> MeshNodeProxy:
        net = self.lab.add_node(name)
        give_node_address6(self.ip_family, net.netns, len(self.nodes) + 1)
        node = MeshNodeProxy(name, net, self.dir / name)
        node.records.mkdir(parents=True)
        for other in self.nodes.values():
            n = next(self._node_links)
            a6, b6 = node_link6(self.ip_family, n)
            self.lab.link_nodes(other.net, net, f"10.250.{n}.1", f"10.250.{n}.2", a_ip6=a6, b_ip6=b6)
        cni_runtime.guard_node(net.path)
        self.nodes[name] = node
        self._pod_ips[name] = itertools.count(2)
        self.kube.node(name)
        self.progress(f"node {name}: netns {net.netns}, Node object created")
        return node

    def start_node_proxies(self, timeout: float = 60.0) -> None:
        """Per node: wait for the operator's MeshNode, start the sidecar and Envoy; wait for Envoy's ADS stream."""
        for node in self.nodes.values():
            self.kube.wait_meshnode(node.name, lambda _: True, timeout, what="the operator to create it")
            self._start_sidecar(node)
            self._start_envoy(node)
        for node in self.nodes.values():
            wait_for(connected(node), timeout, what=f"{node.name} ADS stream", diagnose=node.log_tail)

    def _start_sidecar(self, node: MeshNodeProxy) -> None:
        argv = [*XDS_CLI, "--node", node.name, "--listen", f"unix:{node.ads_sock}"]
        argv += ["--kubeconfig", self.kubeconfig, "--records", str(node.records), "--areas", self.areas]
        argv += ["--certs-dir", str(self.certs_dir)] if self.shared_ca else ["--dev-builtin-ca"]
        argv += ["--udp-dataplane", self.udp_dataplane] if self.udp_dataplane else []
        argv += self.sidecar_args
        log = open(node.workdir / "sidecar.log", "ab")  # noqa: SIM115 (the child process owns it)
        node.sidecar = self.lab.spawn(None, argv, stdout=log, stderr=log)
        self.progress(f"node {node.name}: xds sidecar started (aether xds --node {node.name}: MeshNode + slices)")

    def restart_envoy(self, node: MeshNodeProxy) -> None:
        """The node's Envoy again, after it was stopped or died (what a restart of the node pod's Envoy container
        does): a new process on the same bootstrap, served by the same sidecar."""
        self._start_envoy(node)
        wait_for(connected(node), 60, what=f"{node.name} ADS stream", diagnose=node.log_tail)

    def _start_envoy(self, node: MeshNodeProxy) -> None:
        argv = [*XDS_CLI, "bootstrap", "--node", node.name, "--xds", f"unix:{node.ads_sock}"]
        argv += ["--admin", f"unix:{node.admin_sock}"]
        boot = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
        config = json.loads(boot)
        config["static_resources"].setdefault("listeners", []).extend(node.static_listeners)
        if self.envoy_runtime:
            config["layered_runtime"] = {"layers": [{"name": "static", "static_layer": dict(self.envoy_runtime)}]}
        envoy = start_envoy(
            config, node.workdir, lab=self.lab, netns=node.net.netns, args=[*NODE_ENVOY_ARGS, *self.envoy_args]
        )
        node.envoy = envoy
        self.progress(
            f"node {node.name}: Envoy (base-id {envoy.base_id}) running in {node.net.netns}, ADS over {node.ads_sock}"
        )

    @property
    def _direct_udp_sources(self) -> bool:
        """Whether UDP reaches backends from the client pod's own address (source-preserving UDP, the kernel path):
        what STRICT cannot tell from a direct datagram, so such a mesh runs PERMISSIVE (docs/limits.md#security)."""
        return "--udp-preserve-source" in self.sidecar_args or self.udp_dataplane == "kernel"

    # -- pods ---------------------------------------------------------------------------------------
    def add_pod(
        self, node: MeshNodeProxy, name: str, sa: str = "default", capture: CaptureMode = CaptureMode.TPROXY
    ) -> MeshPod:
        """Scheduled on `node`, sandbox made (netns + veth), the real aether-cni ADD, then Running.
        `capture=REDIRECT` replaces the plugin's capture afterwards (the negative control's bad mode)."""
        ip, ip6 = pod_addresses(self.ip_family, list(self.nodes).index(node.name) + 1, next(self._pod_ips[node.name]))
        if self.shared_ca:
            self._issue_svid(sa)
        uid = self.kube.pod(self.namespace, name, node.name, sa)
        net = self.lab.add_pod(node.net, name, ip, ip6=ip6)
        inbound = "permissive" if self._direct_udp_sources else self.inbound
        annotations = ((INBOUND_ANNOTATION, inbound),) if inbound else ()
        sandbox = cni_runtime.PodSandbox(
            self.namespace, name, uid, net.path, ip, f"ctr-{self.tag}-{name}", annotations, ip6
        )
        cni_runtime.add(sandbox, node.records)
        if capture is not CaptureMode.TPROXY:
            install_capture(net.path, capture)
        pod = MeshPod(name, self.namespace, uid, net, node)
        self.kube.pod_running(self.namespace, name, pod_ips(net))
        self.pods[name] = pod
        self.progress(f"pod {name} on {node.name}: {ip}, aether-cni ADD done ({capture.value} capture)")
        return pod

    def add_backend(self, node: MeshNodeProxy, name: str, app: App | None = None) -> MeshPod:
        """A pod running its app on BACKEND_PORT: by default a UDP echo server that answers `<its name>|<payload>`;
        `app(pod ip, port)` gives any other program's argv (dnsmasq, socat, iperf3...)."""
        pod = self.add_pod(node, name)
        argv = (
            app(pod.ip, BACKEND_PORT)
            if app
            else [sys.executable, "-m", "aether.testing.udp_echo", name, str(BACKEND_PORT), *echo_flags(pod.net)]
        )
        self.run_app(pod, argv)
        return pod

    def run_app(self, pod: MeshPod, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start `argv` as (another) app of the pod, in its netns; output to `<node workdir>/<pod>.log`."""
        log = open(pod.node.workdir / f"{pod.name}.log", "ab")  # noqa: SIM115 (the child process owns it)
        proc = self.lab.spawn(pod.net.netns, argv, stdout=log, stderr=log)
        self.apps.setdefault(pod.name, []).append(proc)
        return proc

    def crash_apps(self, pod: MeshPod) -> None:
        """SIGKILL the pod's apps (a crash: no goodbye, the port answers ICMP unreachable)."""
        for proc in self.apps.pop(pod.name, []):
            proc.kill()
            proc.wait()

    def add_http_backend(self, node: MeshNodeProxy, name: str, sa: str) -> MeshPod:
        """A pod running an HTTP app on HTTP_APP_PORT that answers with its name and the XFCC it received."""
        pod = self.add_pod(node, name, sa=sa)
        log = open(node.workdir / f"{name}.log", "ab")  # noqa: SIM115 (the child process owns it)
        argv = [sys.executable, "-m", "aether.testing.http_echo", name, str(HTTP_APP_PORT), *echo_flags(pod.net)]
        self.lab.spawn(pod.net.netns, argv, stdout=log, stderr=log)
        return pod

    # -- services and routes ------------------------------------------------------------------------
    def add_service(self, name: str, backends: list[str], protocol: str = "UDP") -> str:
        """A UDP Service on port 18082 with a VIP (both families' in a dual-stack mesh), and its EndpointSlices of
        the (ready) backend pods; `protocol="TCP"`: the same for the TCP floor (backends listening on BACKEND_PORT)."""
        vip, vip6 = next(self._vips)
        self.kube.service(self.namespace, name, vip, L4_OUTBOUND_PORT, protocol, vip6=vip6)
        self.services[name] = vip
        self.services6.update({name: vip6} if vip6 else {})
        self.set_endpoints(name, backends, protocol=protocol)
        self.progress(f"service {name}: VIP {vip}:{L4_OUTBOUND_PORT} -> {', '.join(backends)}")
        return vip

    def add_http_service(self, name: str, backends: list[str]) -> str:
        """A TCP Service on HTTP_APP_PORT (an east-west destination: HTTP/3 twins per source identity)."""
        vip, _ = next(self._vips)  # one family: a dual-stack mesh's is IPv4, an IPv6-only mesh's IPv6
        self.kube.service(self.namespace, name, vip, HTTP_APP_PORT, "TCP")
        self.services[name] = vip
        ready = [(self.pods[b].ip, b) for b in backends]
        self.kube.endpoint_slice(self.namespace, name, HTTP_APP_PORT, ready, "TCP")
        self.progress(f"service {name}: TCP {vip}:{HTTP_APP_PORT} -> {', '.join(backends)} (east-west destination)")
        return vip

    def set_endpoints(
        self, service: str, backends: list[str], terminating: Sequence[str] = (), protocol: str = "UDP"
    ) -> None:
        """The EndpointSlice controller's part: the Service's ready endpoints are exactly these pods, and the
        `terminating` ones are pods being deleted that still serve (their grace period)."""
        ready, ending = (
            [(ip, b) for b in pods for ip in pod_ips(self.pods[b].net)] for pods in (backends, terminating)
        )
        self.kube.endpoint_slice(self.namespace, service, BACKEND_PORT, ready, protocol, terminating=ending)

    def add_route(self, name: str, parent: str, backend: str) -> None:
        self.kube.udproute(self.namespace, name, parent, backend, L4_OUTBOUND_PORT)
        self.progress(f"UDPRoute {name}: {parent} -> {backend}")

    def weighted_route(self, name: str, parent: str, weights: dict[str, int], version: str = "v1alpha2") -> None:
        """Apply UDPRoute `name` on Service `parent` with one backendRef per Service in `weights` (name -> weight),
        through API `version`; applying it again replaces its backendRefs (a new generation)."""
        self.kube.weighted_udproute(self.namespace, name, parent, weights, L4_OUTBOUND_PORT, version)
        self.progress(f"UDPRoute {name} ({version}): {parent} -> " + ", ".join(f"{b} {w}" for b, w in weights.items()))

    def repoint_route(self, name: str, backend: str) -> None:
        self.kube.repoint_udproute(self.namespace, name, backend, L4_OUTBOUND_PORT)
        self.progress(f"UDPRoute {name} re-pointed to {backend}")

    def kubectl(self, *args: str) -> str | None:
        """Run kubectl (the pinned one when built) against this mesh's API (None when there is none); raises on failure."""
        exe = tool("kubectl") if available() else shutil.which("kubectl")
        if exe is None:
            return None
        argv = [exe, "--kubeconfig", self.kubeconfig, "-n", self.namespace, *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    # -- waiting on the operator's output -----------------------------------------------------------
    def wait_arms(self, node: MeshNodeProxy, want: dict[str, str], timeout: float = 60.0) -> dict[str, Any]:
        """Until MeshNode `node` lists every pod placed on it and the arms VIP -> cluster in `want`."""
        uids = {p.uid for p in self.pods.values() if p.node is node}

        def ok(obj: dict[str, Any]) -> bool:
            arms = udp_arms(obj)
            return uids <= pod_uids(obj) and all(arms.get(v, {}).get("cluster") == c for v, c in want.items())

        return self.kube.wait_meshnode(node.name, ok, timeout, what=f"arms {want}")

    def programmed(self, node: MeshNodeProxy, timeout: float = 30.0) -> str:
        """Wait for the sidecar's Programmed=True condition on MeshNode `node`; return its message."""

        def cond(obj: dict[str, Any]) -> dict[str, Any] | None:
            conds = (obj.get("status") or {}).get("conditions") or []
            return next((c for c in conds if c.get("type") == "Programmed" and c.get("status") == "True"), None)

        obj = self.kube.wait_meshnode(node.name, lambda o: cond(o) is not None, timeout, what="Programmed=True")
        found = cond(obj)
        return str(found.get("message", "")) if found else ""

    def wait_listeners(self, node: MeshNodeProxy, n: int, timeout: float = 60.0) -> None:
        wait_for(
            lambda: node.stat("listener_manager.total_listeners_active") >= n,
            timeout=timeout,
            what=f"{n} active listeners on {node.name}",
        )

    def diagnostics(self) -> str:
        parts = [n.log_tail() for n in self.nodes.values()]
        op = self.dir / "operator.log"
        if op.exists():
            parts.append(f"--- operator.log ---\n{op.read_text(errors='replace')[-2000:]}")
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                parts.append(f"--- MeshNode {node.name} ---\n{json.dumps(self.kube.meshnode(node.name))[:3000]}")
        return "\n".join(parts)

    # -- cleanup ------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.lab.stop_all(grace=2.0)  # the operator's kopf shutdown can outlast it: killed then
        self.lab.close()  # anything still running, and every netns
        with contextlib.suppress(Exception):
            self._server.close()
            self.kube.close()  # after: `kube` is missing when the server failed to start
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Mesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
