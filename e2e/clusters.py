"""Two clusters in the netns lab, one mesh (tests/e2e/test_e2e_two_clusters.py; docs/operations.md#two-clusters):
two e2e meshes (each its own real control plane, `aether operator`, two nodes with their sidecars and real Envoys),
one CA for both (one trust domain), and one link between A's gateway node and B's client node that carries the
gateway's address only: no pod of one cluster has a route to a pod of the other.

    with two_clusters() as tc:          # A: a-gw (labelled gateway), a-web (web-0); B: b-client (client-0), b-other
        tc.b_get("client-0")              # h2 from B's client-0 through A's gateway to web-0

Cluster A exports Service web (a ServiceExport); cluster B imports it (a MeshPeer naming A's gateway address and
a ServiceImport), as a user does on two real clusters. The aether_quic_sni module is on every Envoy's search path,
so A's gateway serves UDP 18009 too and B's sources reach web over their HTTP/3 twins through it; `h2_via_tcp`
exercises the TCP 18009 half with curl, and Service api (web-0 again), imported through a second MeshPeer for the
same gateway whose spec.transports is [h2], is reached by B's source proxies over h2 on TCP 18009 (no twin)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aether.api.naming import DEFAULT_MESH_DOMAIN, mesh_host, quic_sni
from aether.e2e.harness import Mesh, Progress, _quiet
from aether.netns.contract import EAST_WEST_PORT
from aether.netns.nsthread import run_in_netns
from aether.testing import envoy_modules
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster
from aether.testing.netlab import Node, sh
from aether.testing.probe import HttpAnswer, wait_http
from aether.testing.wait import wait_for

NS = "shop"
AREAS = "udp,tcp-floor,eastwest,gateway"
GATEWAY_IP, B_LINK_IP = "10.251.0.1", "10.251.0.2"  # the one link across: A's gateway node <-> B's client node
PEER = "cluster-a"
# the same gateway as a peer whose gateways offer h2 only (MeshPeer spec.transports: [h2]); Service api (web-0
# behind a second Service) is imported through it: B's sources reach it over h2 on TCP 18009, no QUIC twin
H2_PEER, H2_ONLY = "cluster-a-h2", "api"
GATEWAY_LISTENER = "east-west-gateway"
SEARCH_PATH = "ENVOY_DYNAMIC_MODULES_SEARCH_PATH"


@dataclass
class TwoClusters:
    a: Mesh
    b: Mesh
    gateway: str = GATEWAY_IP

    @property
    def api_a(self) -> Cluster:
        return Cluster(self.a.kubeconfig, None)

    @property
    def api_b(self) -> Cluster:
        return Cluster(self.b.kubeconfig, None)

    def b_get(self, pod: str, service: str = "web", want: int = 200, timeout: float = 30.0) -> HttpAnswer:
        """GET http://<service>.<ns>.<mesh domain>:18080 from B's pod, retried until `want` (or the last answer)."""
        return wait_http(self.b.pods[pod].netns_path, mesh_host(NS, service), timeout=timeout, want=want)

    def gateway_stat(self, stat: str) -> int:
        return self.a.nodes["a-gw"].stat(stat)

    def h2_via_tcp(self, sa: str = "client") -> tuple[int, dict[str, Any]]:
        """h2 over TCP 18009 from B's client node: curl holding B's `sa` SVID plays the source proxy (SNI
        `8080.web.<ns>.<mesh domain>`, the destination verified against the shared root by its DNS SAN): A's gateway
        passes it to web-0's inbound, which verifies the SVID and sets XFCC. (status, the app's JSON answer)."""
        sni, d = quic_sni(8080, "web", NS, DEFAULT_MESH_DOMAIN), self.b.certs_dir
        argv = ["ip", "netns", "exec", self.b.nodes["b-client"].net.netns, "curl", "-sS", "--http2"]
        argv += ["--cert", str(d / NS / sa / "svid.pem"), "--key", str(d / NS / sa / "svid_key.pem")]
        argv += ["--cacert", str(d / "bundle.pem"), "--connect-to", f"{sni}:443:{self.gateway}:{EAST_WEST_PORT}"]
        out = subprocess.run(
            [*argv, f"https://{sni}/", "-w", "\n%{http_code}"], capture_output=True, text=True, timeout=20
        )
        body, _, code = out.stdout.rpartition("\n")
        return int(code or 0), json.loads(body) if body.startswith("{") else {}

    def direct_to_web0(self) -> int | None:
        """B's client-0 straight to A's web-0 app, around the mesh: the errno of the failed TCP connect (None if it
        connected): ENETUNREACH, since no route joins the two clusters' pods."""
        web0 = self.a.pods["web-0"].ip

        def connect() -> int | None:
            try:
                socket.create_connection((web0, 8080), timeout=2).close()
            except OSError as exc:
                return exc.errno
            return None

        return run_in_netns(self.b.pods["client-0"].netns_path, connect)


def link_across(a: Mesh, a_node: Node, b: Mesh, b_node: Node, a_ip: str, b_ip: str) -> None:
    """A veth between a node of cluster A and one of cluster B with a /30 on it and no route to any pod (unlike
    Lab.link_nodes): the other cluster's node address is reachable, its pods are not. Gone with either netns."""
    ia, ib = f"{a.lab.tag}xa", f"{a.lab.tag}xb"
    sh("ip", "link", "add", ia, "netns", a_node.netns, "type", "veth", "peer", "name", ib, "netns", b_node.netns)
    for node, ifn, ip in ((a_node, ia, a_ip), (b_node, ib, b_ip)):
        sh("ip", "addr", "add", f"{ip}/30", "dev", ifn, netns=node.netns)
        sh("ip", "link", "set", ifn, "up", netns=node.netns)


def _cluster_a(a: Mesh) -> None:
    """A: the gateway node labelled (its InternalIP the link's address), web-0 behind Service web, exported."""
    api = Cluster(a.kubeconfig, None)
    gw = {**o.node("a-gw"), "metadata": {"name": "a-gw", "labels": {"mesh.aether.dev/east-west-gateway": "true"}}}
    api.apply(gw, status=o.node_status(GATEWAY_IP))
    a.start_node_proxies()
    a.add_http_backend(a.nodes["a-web"], "web-0", sa="web")
    for svc in ("web", H2_ONLY):
        a.add_http_service(svc, ["web-0"])
        api.apply(o.service_export(NS, svc))

    def exported() -> bool:
        dests = (a.kube.meshnode("a-gw") or {}).get("status", {}).get("quic", {}).get("destinations") or []
        return {f"{NS}/web", f"{NS}/{H2_ONLY}"} <= {d.get("service") for d in dests if d.get("exported")}

    wait_for(exported, 60, f"web and {H2_ONLY} exported on A's gateway node", ignore=READ_ERRORS)
    envoy = a.nodes["a-gw"].running_envoy()
    wait_for(lambda: GATEWAY_LISTENER in envoy.active_config("dynamic_listeners"), 60, "A's gateway listener")


def _cluster_b(b: Mesh) -> None:
    """B: client-0 on the node linked to A's gateway; A's web imported through a MeshPeer, A's api through one
    saying its gateway offers h2 only."""
    api = Cluster(b.kubeconfig, None)
    b.start_node_proxies()
    b.add_pod(b.nodes["b-client"], "client-0", sa="client")
    api.apply(o.mesh_peer(PEER, [GATEWAY_IP]))
    api.apply(o.mesh_peer(H2_PEER, [GATEWAY_IP], transports=["h2"]))
    api.apply(o.service_import(NS, "web", [("http", 8080, "TCP")], PEER, "web"))
    api.apply(o.service_import(NS, H2_ONLY, [("http", 8080, "TCP")], H2_PEER, "web"))


@contextlib.contextmanager
def _quic_modules(progress: Progress) -> Iterator[None]:
    """Every sidecar and Envoy started inside finds the aether_quic_sni module (built by cargo if needed): A's
    gateway then serves UDP 18009 as well (the sidecar's --east-west-gateway-quic auto)."""
    before = os.environ.get(SEARCH_PATH)
    os.environ[SEARCH_PATH] = str(envoy_modules.build())
    progress(f"{SEARCH_PATH}={os.environ[SEARCH_PATH]} (the gateway's QUIC SNI module)")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SEARCH_PATH, None)
        else:
            os.environ[SEARCH_PATH] = before


@contextlib.contextmanager
def two_clusters(progress: Progress = _quiet, tags: tuple[str, str] | None = None) -> Iterator[TwoClusters]:
    """The two clusters, torn down on exit (also on failure); `tags`: the two labs' netns name prefixes."""
    tag_a, tag_b = tags or (None, None)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_quic_modules(progress))
        a = stack.enter_context(Mesh(namespace=NS, areas=AREAS, shared_ca=True, progress=progress, tag=tag_a))
        b = stack.enter_context(Mesh(namespace=NS, areas=AREAS, shared_ca=True, ca=a.ca, progress=progress, tag=tag_b))
        a.add_node("a-gw"), a.add_node("a-web")
        b.add_node("b-client"), b.add_node("b-other")
        link_across(a, a.nodes["a-gw"].net, b, b.nodes["b-client"].net, GATEWAY_IP, B_LINK_IP)
        progress(f"link across: A's a-gw {GATEWAY_IP} <-> B's b-client {B_LINK_IP} (TCP/UDP {EAST_WEST_PORT} only)")
        _cluster_a(a)
        _cluster_b(b)
        yield TwoClusters(a, b)
