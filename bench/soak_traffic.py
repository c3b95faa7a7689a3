"""The soak's traffic: paced, continuous probers, one thread per (class, source pod), each request judged as it
returns (bench.soak_report.Outcome). Classes:

- `udp_echo`: one long-lived socket per prober (an app's connected-style UDP client), datagrams of mixed sizes to
  Service `echo` (UDP echo backends answering `<name>|<payload>`); the reply must carry the payload back;
- `udp_dns`: a fresh socket per query (a stub resolver) asking dnsmasq behind Service `dns` for `who.test` A; each
  backend answers its own address, so the answer names the backend;
- `udp_weighted`: a fresh socket per datagram (a new flow each: the route's weights apply) to Service `split`, whose
  UDPRoute splits between Services `w1` and `w2`;
- `h3`: east-west HTTP through the pod's outbound listener to Service `web` (HTTP/3 twins per source identity); the
  app must have received the source's own SPIFFE ID (XFCC) on every 200;
- `h2`: the same from pods on a node whose sidecar runs `--east-west-quic off`: its Envoy sends every request on the
  h2 cluster (TCP mTLS HTTP/2 to the destination pod's inbound, the source's own SVID), checked the same way;
- `tcp_floor`: an HTTP request as raw bytes over the TCP floor (TCP 18082) to Service `floor`.

"timeout": no UDP reply within TIMEOUT; "no answer": no HTTP response (refused, reset or timed out).
"Wrong backend": a backend that was never one of that Service's (or its route's). A 503 on `h3` or `h2` is `503 NC`
when the source node's Envoy counted a request with no cluster (`http.*.no_cluster`) since the last 503 it served;
after the source's first 200 on that path (its pair for h3, its h2 cluster for h2) it counts in
`nc503_after_first_use`.
"""

from __future__ import annotations

import contextlib
import random
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aether.api.naming import mesh_host, spiffe_id
from aether.e2e.harness import Mesh, MeshPod
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.testing.probe import ask, http_get, pod_socket
from aether.testing.promtext import named, scrape
from aether.testing.udp_clients import WHO_NAME, dns_answer_count, dns_query, exchange
from bench.soak_report import OK, Outcome

SIZES = (64, 512, 1400, 1500, 4000, 9000)  # the echo's datagram sizes (both sides of 1,452 and of one MTU)
TIMEOUT = 2.0  # a request unanswered this long is a timeout
DETAILED = 200  # failures read with the node's counters (the rest are counted only)
ENVOY_COUNTERS = (
    "downstream_sess_tx_errors",
    "sess_rx_errors",
    "upstream_cx_overflow",
    "upstream_cx_connect_fail",
    "upstream_rq_503",
    "no_cluster",
    "rbac.denied",
)
SIDECAR_COUNTERS = ("aether_xds_nacks_total", "aether_xds_connected_streams")


@dataclass
class Recorder:
    """Every outcome, the backends each Service ever had, and the pairs' first uses (thread-safe)."""

    mesh: Mesh
    outcomes: list[Outcome] = field(default_factory=list)
    valid: dict[str, set[str]] = field(default_factory=dict)  # service -> backends it ever had (names or IPs)
    first_use: dict[str, float] = field(default_factory=dict)  # source SA (h2: "h2:<sa>") -> its first 200
    last_ok: dict[str, float] = field(default_factory=dict)  # the same key -> its latest 200
    nc503_after_first_use: int = 0
    metrics_ports: dict[str, int] = field(default_factory=dict)  # node -> its sidecar's --metrics port
    detailed: int = 0
    _nc_seen: dict[str, int] = field(default_factory=dict)  # node -> the no_cluster count at its last 503
    lock: threading.Lock = field(default_factory=threading.Lock)

    def allow(self, service: str, *backends: str) -> None:
        with self.lock:
            self.valid.setdefault(service, set()).update(backends)

    def ok_backend(self, service: str, backend: str | None) -> bool:
        with self.lock:
            return backend is not None and backend in self.valid.get(service, set())

    def add(self, o: Outcome) -> None:
        with self.lock:
            self.outcomes.append(o)

    def pair_ok(self, sa: str, at: float) -> None:
        with self.lock:
            self.first_use.setdefault(sa, at)
            self.last_ok[sa] = at

    def no_cluster(self, pod: MeshPod) -> bool:
        """Whether the pod's node Envoy counted a no-cluster request since its last 503 (a new Envoy starts at 0)."""
        try:
            now = pod.node.running_envoy().stat_sum(r"^http\..*\.no_cluster$")
        except (OSError, RuntimeError):
            return False
        with self.lock:
            before = self._nc_seen.get(pod.node.name, 0)
            self._nc_seen[pod.node.name] = now
        return now > before if now >= before else now > 0

    def counters(self, pod: MeshPod) -> dict[str, int]:
        """The source node's Envoy and sidecar counters a failure is read with (the first DETAILED failures only)."""
        with self.lock:
            self.detailed += 1
            if self.detailed > DETAILED:
                return {}
        out: dict[str, int] = {}
        with contextlib.suppress(OSError, RuntimeError):
            envoy = pod.node.running_envoy()
            out = {k: envoy.stat_sum(rf"{re.escape(k)}$") for k in ENVOY_COUNTERS}
            out["control_plane.connected_state"] = envoy.stat("control_plane.connected_state")
        port = self.metrics_ports.get(pod.node.name)
        if port:
            with contextlib.suppress(OSError):
                samples = scrape(f"http://127.0.0.1:{port}/metrics")
                out |= {m: int(sum(named(samples, m).values())) for m in SIDECAR_COUNTERS}
        return out

    def nc_after_first_use(self, sa: str) -> None:
        with self.lock:
            if sa in self.first_use:
                self.nc503_after_first_use += 1


Probe = Callable[["Prober", int], tuple[str, str, str | None]]  # -> (kind, detail, destination pod)


class Prober(threading.Thread):
    """One source pod sending one class's requests every `interval` seconds until `stop` is set (or `leave()`)."""

    def __init__(self, rec: Recorder, cls: str, pod: MeshPod, sa: str, interval: float, seed: int) -> None:
        super().__init__(name=f"soak-{cls}-{pod.name}", daemon=True)
        self.rec, self.cls, self.pod, self.sa, self.interval = rec, cls, pod, sa, interval
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.sock: socket.socket | None = None

    def leave(self) -> None:
        self.stop.set()
        self.join(timeout=10)

    def run(self) -> None:
        probe = PROBES[self.cls]
        seq = 0
        next_at = time.monotonic()
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                kind, detail, dest = probe(self, seq)
            except Exception as exc:  # a probe's own error is an outcome too, never the end of the prober
                kind, detail, dest = "error", repr(exc), None
            end = time.monotonic()
            o = Outcome(self.cls, self.pod.name, self.pod.node.name, start, end, kind, detail, dest)
            if kind != OK:
                o.counters = self.rec.counters(self.pod)
            self.rec.add(o)
            seq += 1
            next_at = max(next_at + self.interval, end)
            self.stop.wait(next_at - time.monotonic())
        if self.sock is not None:
            self.sock.close()

    def node_of(self, pod: str | None) -> str | None:
        found = self.rec.mesh.pods.get(pod) if pod else None
        return found.node.name if found else None


def _echo(p: Prober, seq: int) -> tuple[str, str, str | None]:
    if p.sock is None:
        p.sock = pod_socket(p.pod.netns_path, TIMEOUT)
    size = p.rng.choice(SIZES)
    payload = f"{p.pod.name}-{seq}-".encode().ljust(size, b"x")
    answer = ask(p.sock, p.rec.mesh.services["echo"], payload)
    if answer.backend is None:
        return "timeout", f"{size} B", None
    if not p.rec.ok_backend("echo", answer.backend) or not answer.from_vip:
        return "wrong backend", f"{answer.show()} for {size} B", answer.backend
    return OK, "", answer.backend


def _dns(p: Prober, seq: int) -> tuple[str, str, str | None]:
    qid = seq & 0xFFFF
    got = exchange(p.pod.netns_path, p.rec.mesh.services["dns"], L4_OUTBOUND_PORT, dns_query(qid, WHO_NAME), TIMEOUT)
    if got is None:
        return "timeout", "", None
    reply, _ = got
    if dns_answer_count(reply, qid) < 1:
        return "error", f"DNS reply without an answer ({len(reply)} B)", None
    ip = socket.inet_ntoa(struct.unpack("!4s", reply[-4:])[0])
    return (OK, "", ip) if p.rec.ok_backend("dns", ip) else ("wrong backend", f"answer {ip}", ip)


def _weighted(p: Prober, seq: int) -> tuple[str, str, str | None]:
    payload = f"{p.pod.name}-{seq}".encode()
    got = exchange(p.pod.netns_path, p.rec.mesh.services["split"], L4_OUTBOUND_PORT, payload, TIMEOUT)
    if got is None:
        return "timeout", "", None
    name, _, rest = got[0].partition(b"|")
    backend = name.decode(errors="replace")
    if rest != payload or not p.rec.ok_backend("split", backend):
        return "wrong backend", f"{got[0][:60]!r}", backend
    return OK, "", backend


def _http(p: Prober, seq: int) -> tuple[str, str, str | None]:
    """`h3` and `h2` alike: the class is the source node's transport (QUIC twins, or `--east-west-quic off`)."""
    mesh = p.rec.mesh
    answer = http_get(p.pod.netns_path, mesh_host(mesh.namespace, "web"), timeout=TIMEOUT)
    dest = p.node_of(answer.backend)
    user = p.sa if p.cls == "h3" else f"{p.cls}:{p.sa}"  # h3: the pair (the watcher's key); h2: the source's path
    if answer.status == 200:
        if not p.rec.ok_backend("web", answer.backend):
            return "wrong backend", str(answer.backend), dest
        if answer.spiffe_id != spiffe_id(mesh.namespace, p.sa):
            return "wrong identity", f"{answer.spiffe_id} for {p.sa}", dest
        p.rec.pair_ok(user, time.monotonic())
        return OK, "", dest
    if answer.status == 503 and p.rec.no_cluster(p.pod):
        p.rec.nc_after_first_use(user)
        return "503 NC", "", dest
    return ("no answer" if answer.status is None else str(answer.status)), "", dest


def _tcp_floor(p: Prober, seq: int) -> tuple[str, str, str | None]:
    mesh = p.rec.mesh
    answer = http_get(p.pod.netns_path, "floor", port=L4_OUTBOUND_PORT, timeout=TIMEOUT, ip=mesh.services["floor"])
    if answer.status is None:
        return "no answer", "", None
    if answer.status != 200 or not p.rec.ok_backend("floor", answer.backend):
        return "wrong backend", f"{answer.status} {answer.backend}", answer.backend
    return OK, "", answer.backend


PROBES: dict[str, Probe] = {
    "udp_echo": _echo,
    "udp_dns": _dns,
    "udp_weighted": _weighted,
    "h3": _http,
    "h2": _http,
    "tcp_floor": _tcp_floor,
}
