"""`aether demo [--keep] [--control-plane real|emulated] [--ip-family ipv4|dual|ipv6]`: the whole mesh on one machine,
and what it does with your datagrams.

As root it starts an API server (the real control plane when `make k8s` has built it, else the API test bed), the
operator, one node's xds sidecar and a real Envoy in network namespaces;
creates client pods, three UDP echo backends and an HTTP app (netns + the real aether-cni); applies Services and a
UDPRoute through the API; then shows which VIP reached which backend, what a route change did, how weights split
new sessions, what the same datagrams do under a REDIRECT capture, which SPIFFE ID arrived at the app over each
source's HTTP/3 twin, the QUIC pairs the sidecar recorded in the MeshNode, and that the app port refuses a direct
call (STRICT inbound) and a MeshAuthorizationPolicy turns a denied identity away (403). Everything it made goes
away on exit, Ctrl-C, SIGTERM or failure;
`--keep` leaves the mesh running (with instructions) until Ctrl-C. `--ip-family dual` (demo_families.py) does the
UDP selection and the re-point on each Service's IPv6 VIP too; `--ip-family ipv6` runs every section over IPv6 alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from aether.api.naming import mesh_host, quic_twin, spiffe_id, udp_split_cluster
from aether.e2e import demo_clusters
from aether.e2e import demo_families as families
from aether.e2e.demo_families import IP_FAMILIES, family_problem, ipv6_rows, wait_ipv6
from aether.e2e.demo_report import (
    AccessRow,
    IdentityRow,
    PairRow,
    Row,
    access_table,
    identity_table,
    keep_instructions,
    pair_table,
    split_ok,
    split_table,
    table,
)
from aether.e2e.harness import HTTP_APP_PORT, Mesh, MeshPod
from aether.e2e.kube import udp_arms
from aether.e2e.lifecycle import pair_state, route_condition, wait_pairs
from aether.e2e.node_proxy import MeshNodeProxy
from aether.netns.contract import L4_OUTBOUND_PORT, CaptureMode
from aether.testing import controlplane
from aether.testing.apiserver import KINDS, Kind
from aether.testing.controlplane.families import IpFamily
from aether.testing.netlab import is_root
from aether.testing.probe import http_get, wait_answer, wait_http, who_answers
from aether.testing.split_probe import Split, locality_weights, probe_split
from aether.testing.wait import wait_for

NAMESPACE = "demo"
NODE = "node-1"
SERVICES = {"alpha": "echo-alpha", "bravo": "echo-bravo", "charlie": "echo-charlie"}
ROUTE = "bravo-route"
AREAS = "udp,tcp-floor,eastwest"  # everything the sidecar translates (east-west with its built-in CA)
WEB = "web"  # a TCP Service: an east-west destination, reached over HTTP/3 twins per source identity
HTTP_CLIENTS = {"client": "client", "reporter": "reporter"}  # pod -> ServiceAccount
POLICY = "web-callers"  # the MeshAuthorizationPolicy of section 5: only the client's identity may call web
SPLIT = {"charlie": 70, "alpha": 30, "bravo": 0}  # step 3: the route's weights (bravo drained)
SPLIT_NAMES = {SERVICES[s]: w for s, w in SPLIT.items()}  # the same, by the backend that answers
SPLIT_PROBES = 200


class Interrupted(BaseException):
    """SIGINT/SIGTERM: unwind through every `finally` so cleanup runs."""


_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the aether package's folder
_RETRY = 0.05  # seconds between tries to raise a deferred signal
_DEFER_AT_MOST = 5.0  # then raise wherever the main thread is (a library call that never returns to us)
_pending: list[tuple[int, float]] = []  # the signal waiting for our own code, and when it came


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Raise Interrupted, but only from our own code: raised inside a library (seen: urllib3 putting a connection
    back into its pool, between a lock's acquire and the `with` that releases it) the exception leaves that lock
    held, and the library's own `finally` then waits on it forever. Elsewhere it retries every 50 ms via SIGALRM."""
    if signum == signal.SIGALRM:
        if not _pending:
            return
        signum, since = _pending[0]
    else:
        _pending[:] = [(signum, time.monotonic())]
        since = _pending[0][1]
    ours = frame is not None and frame.f_code.co_filename.startswith(_OURS)
    if ours or time.monotonic() - since > _DEFER_AT_MOST:
        _pending.clear()
        raise Interrupted(signal.Signals(signum).name)
    signal.setitimer(signal.ITIMER_REAL, _RETRY)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _pending.clear()
        for s, h in old.items():
            signal.signal(s, h)


def _ignore_signals() -> None:
    """While cleaning up: a second Ctrl-C must not leave half the netns behind."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)


def preflight() -> str | None:
    """Why the demo cannot run here, or None."""
    if not is_root():
        return "needs root (network namespaces, nftables, policy routing): run it as root, e.g. `sudo make demo`"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install iproute2 nftables; `make demo` does it)"
    from aether.testing.envoy import EnvoyNotFound, envoy_path

    try:
        envoy_path()
    except EnvoyNotFound as exc:
        return str(exc)
    return None


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:5.1f}s] {msg}", flush=True)


@dataclass(frozen=True)
class _Lab:
    """What `run` made: the node, the three client pods and the Services' VIPs."""

    node: MeshNodeProxy
    client: MeshPod
    redirected: MeshPod
    reporter: MeshPod
    vips: dict[str, str]


def _build(mesh: Mesh, clock: Clock) -> _Lab:
    """The node, pods, backends, Services and the route, applied through the API; returns once every VIP answers."""
    node = mesh.add_node(NODE)
    mesh.start_node_proxies()
    client = mesh.add_pod(node, "client", sa="client")
    redirected = mesh.add_pod(node, "client-redirect", sa="client", capture=CaptureMode.REDIRECT)
    reporter = mesh.add_pod(node, "reporter", sa=HTTP_CLIENTS["reporter"])
    for backend in SERVICES.values():
        mesh.add_backend(node, backend)
    mesh.add_http_backend(node, "web-0", sa="web")
    mesh.add_http_service(WEB, ["web-0"])
    for svc, backend in SERVICES.items():
        mesh.add_service(svc, [backend])
    mesh.add_route(ROUTE, "bravo", "bravo")
    vips = mesh.services
    mesh.wait_arms(node, {vips[s]: families.primary_cluster(mesh, f"udp:{NAMESPACE}/{s}") for s in SERVICES})
    clock.say("operator wrote MeshNode node-1 (3 arms); waiting for the sidecar to program Envoy")
    for svc, backend in SERVICES.items():
        wait_answer(client.netns_path, vips[svc], backend)
    if mesh.services6:
        clock.say(wait_ipv6(mesh, node, client, NAMESPACE, SERVICES))
    clock.say(f"mesh ready: Programmed=True ({mesh.programmed(node)})")
    return _Lab(node, client, redirected, reporter, vips)


def _udp_sections(mesh: Mesh, lab: _Lab) -> bool:
    """Sections 1-4: selection by VIP, a route re-pointed, the weighted split, the REDIRECT control. -> all as
    expected."""
    client, vips, node, where = lab.client, lab.vips, lab.node, families.capture_listeners(mesh.ip_family)
    before = {s: who_answers(client.netns_path, vips[s]) for s in SERVICES}
    print(f"\n1. Per-service selection: one Envoy listener on {where} in the client's netns,")
    print("   the mark-and-divert capture keeps the VIP, Envoy picks the Service by destination IP:\n")
    rows = [Row(f"{NAMESPACE}/client", f"{NAMESPACE}/{s}", before[s], SERVICES[s]) for s in SERVICES]
    rows += ipv6_rows(mesh, client, NAMESPACE, SERVICES)  # a dual-stack mesh: the same on each IPv6 VIP
    print(table(rows))

    envoy_pid = node.envoy.proc.pid if node.envoy else None
    t = time.monotonic()
    mesh.repoint_route(ROUTE, "charlie")
    wait_answer(client.netns_path, vips["bravo"], SERVICES["charlie"])
    took = time.monotonic() - t
    accepted = route_condition(mesh, ROUTE, "Accepted")
    after = {s: who_answers(client.netns_path, vips[s]) for s in SERVICES}
    print(f"\n2. UDPRoute {NAMESPACE}/{ROUTE} re-pointed from Service bravo to Service charlie (merge patch")
    print(f"   through the API): took effect in {took:.1f}s, route Accepted={accepted}, same Envoy process")
    print(f"   (pid {envoy_pid}, still running: {node.envoy is not None and node.envoy.proc.poll() is None}):\n")
    expect = {**SERVICES, "bravo": SERVICES["charlie"]}
    rows2 = [
        Row(f"{NAMESPACE}/client", f"{NAMESPACE}/{s}", after[s], expect[s], before=before[s].backend) for s in SERVICES
    ]
    if "bravo" in mesh.services6:
        wait_answer(client.netns_path, mesh.services6["bravo"], SERVICES["charlie"])
    rows2 += ipv6_rows(mesh, client, NAMESPACE, expect)
    print(table(rows2))

    split = weighted_split(mesh, client, vips["bravo"])
    print(f"\n3. Weighted split: the same route given backendRefs charlie {SPLIT['charlie']} / alpha")
    print(f"   {SPLIT['alpha']} / bravo {SPLIT['bravo']} (weights split new sessions). {SPLIT_PROBES} probes to")
    print("   Service bravo, each from a fresh UDP socket (a new session), 10 in flight:\n")
    print(split_table(SPLIT_NAMES, dict(split.by_backend), split.probes))
    split_good = split_ok(SPLIT_NAMES, dict(split.by_backend), split.probes)

    print("\n4. The negative control: the same datagrams from a pod captured with REDIRECT (the classic")
    print("   iptables-style capture) instead of mark-and-divert. REDIRECT rewrites the destination to")
    print("   127.0.0.1, the VIP is gone, and every Service lands on Envoy's no-match blackhole:\n")
    red = [
        Row(
            f"{NAMESPACE}/client-redirect",
            f"{NAMESPACE}/{s}",
            who_answers(lab.redirected.netns_path, vips[s], 2, 0.3),
            None,
        )
        for s in SERVICES
    ]
    print(table(red))
    return all(r.ok for r in (*rows, *rows2, *red)) and split_good


def _east_west_sections(mesh: Mesh, lab: _Lab) -> bool:
    """Sections 5-7: each source's SPIFFE ID over its HTTP/3 twin, the recorded pairs, STRICT and the policy.
    -> all as expected."""
    client, reporter, node = lab.client, lab.reporter, lab.node
    print("\n5. East-west HTTP/3 with per-source identity: each pod's request to Service web goes through its")
    print("   own QUIC twin cluster carrying its own SVID (mTLS); the app reports the SPIFFE ID it received")
    print("   in x-forwarded-client-cert:\n")
    ids = [
        identity_row(mesh, node, pod, sa)
        for pod, sa in ((client, HTTP_CLIENTS["client"]), (reporter, HTTP_CLIENTS["reporter"]))
    ]
    print(identity_table(ids))
    pairs = pair_rows(mesh, node)
    print(
        f"\n6. QUIC pairs: MeshNode {NODE} status.quic.pairs, written by the sidecar (kubectl get mn {NODE} -o yaml)."
    )
    print("   A twin exists only for a pair that dialled: each source's first request fetched its own on demand:\n")
    print(pair_table(pairs))
    access = inbound_rows(mesh, client, reporter)
    print("\n7. Only the mesh gets in, and only whom a policy allows: web-0's inbound is STRICT (the pod takes")
    print(f"   new flows only on the mesh's inbound port), and MeshAuthorizationPolicy {POLICY} lets only")
    print(f"   {spiffe_id(NAMESPACE, HTTP_CLIENTS['client'])} call Service {WEB} (Accepted={access[0]}; Envoy's RBAC")
    print("   filter on the destination's inbound, matched on the verified peer certificate):\n")
    print(access_table(access[1]))
    return all(r.ok for r in ids) and all(r.ok for r in pairs) and all(r.ok for r in access[1])


def _keep_running(mesh: Mesh, lab: _Lab) -> None:
    """--keep: print how to use the running mesh, then wait for Ctrl-C."""
    print()
    print(
        keep_instructions(
            mesh.kubeconfig,
            lab.client.net.netns,
            lab.vips["alpha"],
            sys.executable,
            str(Path(sys.executable).parent / "aether"),
        ),
        flush=True,
    )
    with contextlib.suppress(Interrupted):  # Ctrl-C is how --keep ends: not an error
        while True:
            time.sleep(3600)


def run(keep: bool, clock: Clock, workdir: Path, control_plane: Kind, ip_family: IpFamily = "ipv4") -> int:
    tag = "ae" + secrets.token_hex(3)
    print(f"aether demo: lab tag {tag}, working directory {workdir}", flush=True)
    mesh = Mesh(workdir, NAMESPACE, clock.say, tag, AREAS, control_plane=control_plane, ip_family=ip_family)
    try:
        lab = _build(mesh, clock)
        udp_ok = _udp_sections(mesh, lab)
        ok = _east_west_sections(mesh, lab) and udp_ok
        good = (
            "every VIP reached the backend it should; the split followed its weights; each source's own SPIFFE ID "
            "arrived over HTTP/3; each pair is in the MeshNode; only the mesh and the allowed identity reached the app"
        )
        print(f"\nresult: {good if ok else 'SOMETHING UNEXPECTED (see above)'}")
        if keep:
            _keep_running(mesh, lab)
        return 0 if ok else 1
    except (Exception, Interrupted):
        if not isinstance(sys.exc_info()[1], Interrupted):
            print("\naether demo failed; the last of the logs:\n" + mesh.diagnostics(), file=sys.stderr)
        raise
    finally:
        _ignore_signals()
        clock.say("cleaning up: processes, network namespaces, files")
        mesh.close()


def inbound_rows(mesh: Mesh, client: MeshPod, reporter: MeshPod) -> tuple[str | None, list[AccessRow]]:
    """Section 7: the app port called directly (STRICT drops it), then a policy allowing only the client's
    identity, and both sources through the mesh (200 and RBAC's 403). -> (the policy's Accepted condition, rows)."""
    web, host = mesh.pods["web-0"], mesh_host(NAMESPACE, WEB)
    direct = http_get(reporter.netns_path, host, port=HTTP_APP_PORT, ip=web.ip, timeout=2.0)
    mesh.kube.authorization_policy(NAMESPACE, POLICY, WEB, [spiffe_id(NAMESPACE, HTTP_CLIENTS["client"])])
    accepted = mesh.kube.policy_condition(NAMESPACE, POLICY)
    denied = wait_http(reporter.netns_path, host, want=403)
    allowed = wait_http(client.netns_path, host)
    return accepted, [
        AccessRow(f"{NAMESPACE}/{reporter.name}", families.directly(web.ip, HTTP_APP_PORT), direct, None, "STRICT"),
        AccessRow(f"{NAMESPACE}/{client.name}", f"{host} (mesh)", allowed, 200, f"allowed by {POLICY}"),
        AccessRow(f"{NAMESPACE}/{reporter.name}", f"{host} (mesh)", denied, 403, f"not in {POLICY}: RBAC"),
    ]


def weighted_split(mesh: Mesh, client: MeshPod, vip: str) -> Split:
    """Give ROUTE the SPLIT weights, wait for the split arm on the MeshNode and for Envoy's EDS, then probe."""
    mesh.weighted_route(ROUTE, "bravo", SPLIT)
    want = {f"{NAMESPACE}/{b}": w for b, w in SPLIT.items()}
    cluster = families.primary_cluster(mesh, udp_split_cluster(NAMESPACE, "bravo"))

    def arm_has_weights(obj: dict[str, Any]) -> bool:
        arm = udp_arms(obj).get(vip, {})
        return arm.get("cluster") == cluster and {b["backend"]: b["weight"] for b in arm.get("backends", [])} == want

    mesh.kube.wait_meshnode(NODE, arm_has_weights, what=f"the split arm {want}")
    node = mesh.nodes[NODE]
    wait_for(
        lambda: locality_weights(json.loads(node.running_envoy().admin("/config_dump?include_eds")), cluster) == want,
        timeout=30,
        what="the split in Envoy's EDS",
    )
    return probe_split(client.netns_path, vip, L4_OUTBOUND_PORT, SPLIT_PROBES)


def identity_row(mesh: Mesh, node: MeshNodeProxy, pod: MeshPod, sa: str) -> IdentityRow:
    """One HTTP request from `pod` to Service web, and whether it went out over its HTTP/3 twin."""
    twin = quic_twin(NAMESPACE, WEB, sa)
    counter = f"cluster.{twin.replace(':', '_')}.upstream_rq_total"
    before = node.stat(counter)
    answer = wait_http(pod.netns_path, mesh_host(NAMESPACE, WEB))
    return IdentityRow(
        f"{NAMESPACE}/{pod.name}",
        mesh_host(NAMESPACE, WEB),
        answer,
        spiffe_id(NAMESPACE, sa),
        twin,
        over_http3=node.stat(counter) > before
        and node.stat(f"cluster.{twin.replace(':', '_')}.upstream_cx_http3_total") > 0,
    )


def pair_rows(mesh: Mesh, node: MeshNodeProxy) -> list[PairRow]:
    """The node's pairs once the sidecar wrote the ones the identity table dialled (or whatever it holds then)."""
    expected = {quic_twin(NAMESPACE, WEB, sa) for sa in HTTP_CLIENTS.values()}
    with contextlib.suppress(TimeoutError):
        wait_pairs(mesh, node, expected, set())
    pairs, dormant, _ = pair_state(mesh, node)
    return [
        PairRow(p.source, p.destination, p.twin, p.evidence, p.last_kind, p.twin in expected, twin in dormant)
        for twin, p in sorted({**pairs, **dormant}.items())
    ] or [PairRow("-", "-", "(none)", None, None, False)]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="aether demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", action="store_true", help="leave the mesh running (with instructions) until Ctrl-C")
    p.add_argument("--control-plane", choices=KINDS, help="real or emulated (default: real when built)")
    p.add_argument("--ip-family", choices=IP_FAMILIES, default="ipv4", help="the Services' and pods' IP families")
    p.add_argument("--clusters", type=int, choices=(1, 2), default=1, help="2: one mesh over two clusters")
    args = p.parse_args(argv)
    kind: Kind = args.control_plane or ("real" if controlplane.available() else "emulated")
    why = family_problem(args.ip_family, kind) or preflight()
    if why is not None:
        print(f"aether demo: {why}", file=sys.stderr)
        return 1
    clock = Clock()
    workdir = Path(tempfile.mkdtemp(prefix="aether-demo-"))
    code = 1
    try:
        with _signals_raise():
            two = demo_clusters.run(clock.say, kind, args.keep) if args.clusters == 2 else None
            code = run(args.keep, clock, workdir, kind, args.ip_family) if two is None else two
    except Interrupted as exc:
        print(f"aether demo: interrupted ({exc})", file=sys.stderr)
        code = 130
    except Exception as exc:
        print(f"aether demo: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    clock.say(f"done: nothing left behind (working directory {workdir} removed)")
    return code
