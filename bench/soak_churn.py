"""The soak's churn: events on a seeded schedule (the seed shuffles each round of kinds and picks targets), one at
a time, each recorded as a bench.soak_report.Event from its first action until the soak saw its effect.

- `pod_roll`: Service `echo`'s backend replaced as a Deployment rolls it: the new pod starts and becomes ready, the
  old one is marked terminating (still serving), leaves the slice, then is deleted (CNI DEL, API object);
- `endpoint_flap`: one of Service `dns`'s two backends not ready (its app still runs), then ready again;
- `route_edit`: UDPRoute `split` re-applied with new weights, or re-pointed to one backend;
- `policy_edit`: the MeshAuthorizationPolicy on `web` rewritten (same callers allowed, one made-up caller rotated);
- `new_sa`: a new ServiceAccount's first pod (allowed by the policy first) on the node holding fewest such pods:
  a new pair's first use;
- `sa_leaves`: the oldest such ServiceAccount's last pod on the node holding most of them stops calling and is
  deleted (its pair goes dormant), and the policy stops naming that ServiceAccount;
- `sidecar_restart`, `envoy_restart`: a node's sidecar (SIGTERM, a new one) or Envoy (a new process, no hot
  restart); `operator_restart`: the operator stopped and started again;
- `api_down`: kube-apiserver stopped for 10 s (etcd keeps the data), then started again.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from aether.api.naming import spiffe_id, udp_cluster
from aether.e2e.harness import Mesh
from aether.e2e.lifecycle import delete_pod, restart_envoy, restart_operator, restart_sidecar
from aether.e2e.node_proxy import MeshNodeProxy
from aether.testing.controlplane import ControlPlane
from aether.testing.envoy import ADMIN_ERRORS
from aether.testing.wait import wait_for
from bench.soak_report import ENVOY_RESTART, UDP_SWAP, Event
from bench.soak_traffic import Prober, Recorder

KINDS = (
    "pod_roll",
    "endpoint_flap",
    "route_edit",
    "policy_edit",
    "new_sa",
    "sa_leaves",
    "sidecar_restart",
    ENVOY_RESTART,
    "operator_restart",
    "api_down",
)
PROCESS_RESTARTS = ("sidecar_restart", ENVOY_RESTART, "operator_restart")
WEIGHTS = ({"w1": 50, "w2": 50}, {"w1": 90, "w2": 10}, {"w1": 0, "w2": 100}, {"w2": 1}, {"w1": 1}, {"w1": 30, "w2": 70})
API_DOWN_S = 10.0
POLICY = "web-callers"
SETTLE = 60.0  # the longest any event waits for its effect
SWAP_WAIT = 5.0  # how long a route edit watches the Envoys for capture listeners being replaced
SWAP_SETTLED = 1.0  # the count held still this long: the swap is over


@dataclass
class Churn:
    mesh: Mesh
    rec: Recorder
    rng: random.Random
    start_probers: Callable[[str, str, str], list[Prober]]  # (node, pod, sa) -> the probers started for it
    sidecar_args: Callable[[MeshNodeProxy], tuple[str, ...]]
    swap: threading.Lock  # held while a process is replaced (the watcher tells asked-for exits from crashes)
    callers: list[str]  # the ServiceAccounts the policy allows
    events: list[Event] = field(default_factory=list)
    echo: str = "echo-0"
    extra: list[tuple[str, list[Prober]]] = field(default_factory=list)  # (pod, its probers) of new_sa pods
    extra_nodes: dict[str, str] = field(default_factory=dict)  # new_sa pod -> its node
    restart_every: int = 1  # the process restarts run in every n-th round of kinds (1: every round)
    restarts_until: float | None = None  # time.monotonic() after which no round holds a process restart
    _n: int = 0
    _round: int = 0

    def schedule(self) -> list[str]:
        """The next round of kinds, shuffled; the process restarts only in every `restart_every`-th round and in
        rounds that begin before `restarts_until`, so that a process can live long enough for its memory to be
        judged (bench.soak_growth) while the rest churns."""
        self._round += 1
        restarts = self._round % self.restart_every == 0
        restarts = restarts and (self.restarts_until is None or time.monotonic() < self.restarts_until)
        kinds = [k for k in KINDS if k not in PROCESS_RESTARTS or restarts]
        self.rng.shuffle(kinds)
        return kinds

    def run(self, kind: str) -> Event:
        self._n += 1
        node = self.rng.choice(sorted(self.mesh.nodes))
        event = Event(kind, node, time.monotonic())
        self.events.append(event)
        try:
            getattr(self, kind)(event, self.mesh.nodes[node])
        except Exception as exc:  # the event failed to happen: recorded, the soak goes on
            event.detail += f" FAILED: {exc!r}"[:500]
        event.end = time.monotonic()
        return event

    # -- events --------------------------------------------------------------------------------------
    def pod_roll(self, e: Event, node: MeshNodeProxy) -> None:
        old, new = self.echo, f"echo-{self._n}"
        e.target, e.detail = f"{old}->{new}@{node.name}", ""
        self.mesh.add_backend(node, new)
        self.rec.allow("echo", new)
        self.mesh.set_endpoints("echo", [old, new])
        self._hosts("echo", {old, new})
        self.mesh.set_endpoints("echo", [new], terminating=[old])
        self._hosts("echo", {old, new}, draining=frozenset({old}))
        self.mesh.set_endpoints("echo", [new])
        self._hosts("echo", {new})
        delete_pod(self.mesh, old)
        self.echo = new

    def endpoint_flap(self, e: Event, _: MeshNodeProxy) -> None:
        down = self.rng.choice(["dns-1", "dns-2"])
        up = "dns-2" if down == "dns-1" else "dns-1"
        e.target = down
        self.mesh.set_endpoints("dns", [up])
        self._hosts("dns", {up})
        self.mesh.set_endpoints("dns", [up, down])
        self._hosts("dns", {up, down})

    def route_edit(self, e: Event, _: MeshNodeProxy) -> None:
        weights = self.rng.choice(WEIGHTS)
        e.target, e.detail = "split", str(weights)
        before = self._swaps()
        self.mesh.weighted_route("split", "split", weights)
        self._record_swaps(e, before)

    def _swaps(self) -> dict[str, int]:
        """node -> its Envoy's `listener_manager.listener_modified` (one per capture listener replaced)."""
        out = {}
        for name, node in self.mesh.nodes.items():
            with contextlib.suppress(*ADMIN_ERRORS, RuntimeError):
                out[name] = node.stat("listener_manager.listener_modified")
        return out

    def _record_swaps(self, e: Event, before: dict[str, int]) -> None:
        """A route edit that changes which cluster a VIP names replaces every pod's UDP capture listener on each
        node (a weights-only edit changes endpoints, no listener): wait up to SWAP_WAIT for a node's count to move,
        then until it holds still, and record a UDP_SWAP event for each node whose count moved (the window
        docs/limits.md describes: a reply in flight at the swap can be lost)."""
        moved: dict[str, float] = {}
        deadline, last, seen = time.monotonic() + SWAP_WAIT, dict(before), time.monotonic()
        while time.monotonic() < deadline:
            now = self._swaps()
            for name, count in now.items():
                if name in before and count != last.get(name):
                    moved[name], seen = time.monotonic(), time.monotonic()
            last = now
            if moved and time.monotonic() - seen >= SWAP_SETTLED:
                break
            time.sleep(0.1)  # polling Envoy's counter: the signal is the count moving
        for name, at in sorted(moved.items()):
            self.events.append(Event(UDP_SWAP, name, e.start, at, f"{last[name] - before[name]} listeners replaced"))

    def policy_edit(self, e: Event, _: MeshNodeProxy) -> None:
        e.target = POLICY
        self._policy(f"ghost-{self._n}")

    def new_sa(self, e: Event, node: MeshNodeProxy) -> None:
        node = self._spread(node)
        sa, pod = f"sa-{self._n}", f"caller-{self._n}"
        e.target = f"{pod}({sa})@{node.name}"
        self.callers.append(sa)
        self._policy()
        self._rbac_has(spiffe_id(self.mesh.namespace, sa))
        self.mesh.add_pod(node, pod, sa=sa)
        wait_for(lambda: f"http-outbound:{self.mesh.namespace}/{pod}" in node.admin("/listeners"), SETTLE, pod)
        self.extra.append((pod, self.start_probers(node.name, pod, sa)))
        self.extra_nodes[pod] = node.name

    def _held(self) -> Counter[str]:
        """node -> the new ServiceAccounts' pods on it."""
        return Counter(self.extra_nodes.values())

    def _spread(self, drawn: MeshNodeProxy) -> MeshNodeProxy:
        """The node a new ServiceAccount's pod goes to: the one holding the fewest such pods, `drawn` on a tie (as
        kube-scheduler's default scoring spreads pods). Placed at random, each node's count wandered as far as every
        such pod (a node's Envoy went 30 -> 45 listeners in the ninth 30-minute run), and its heap with it, which the
        growth verdict then has to tell from a leak; spread, each node's live state holds level."""
        on = self._held()
        held = {name: on[name] for name in self.mesh.nodes}  # a node holding none counts 0
        fewest = min(held.values())
        return drawn if held[drawn.name] == fewest else self.mesh.nodes[min(n for n, c in held.items() if c == fewest)]

    def _leaving(self) -> int:
        """The index in `extra` of the pod that leaves: the oldest on the node holding the most such pods (so the
        nodes' counts stay within one of each other, as `_spread` keeps them when pods arrive)."""
        held = self._held()
        most = max(held.values(), default=0)
        return next((i for i, (pod, _) in enumerate(self.extra) if held.get(self.extra_nodes.get(pod, "")) == most), 0)

    def sa_leaves(self, e: Event, node: MeshNodeProxy) -> None:
        if not self.extra:
            e.kind = "new_sa"
            self.new_sa(e, node)
            return
        pod, probers = self.extra.pop(self._leaving())
        self.extra_nodes.pop(pod, None)
        e.target = pod
        for p in probers:
            p.leave()
        delete_pod(self.mesh, pod)
        self._forget(pod)

    def _forget(self, pod: str) -> None:
        """The policy stops naming the ServiceAccount whose last pod left (as its owner would tidy it): a policy
        that kept every ServiceAccount the run ever made grew by one source per new ServiceAccount (15 in a
        30-minute run), and with it the RBAC every Envoy, sidecar and the operator hold: live state growing with
        time, which the heap gate (bench.soak_growth) cannot tell from a leak."""
        sa = f"sa-{pod.removeprefix('caller-')}"
        if sa in self.callers:
            self.callers.remove(sa)
            self._policy()

    def sidecar_restart(self, e: Event, node: MeshNodeProxy) -> None:
        with self.swap:
            self.mesh.sidecar_args = self.sidecar_args(node)
            restart_sidecar(self.mesh, node)

    def envoy_restart(self, e: Event, node: MeshNodeProxy) -> None:
        listeners = node.stat("listener_manager.total_listeners_active")
        with self.swap:
            restart_envoy(self.mesh, node)
        e.detail = f"{listeners} listeners before"
        wait_for(lambda: node.stat("listener_manager.total_listeners_active") >= listeners, SETTLE, "listeners")

    def operator_restart(self, e: Event, _: MeshNodeProxy) -> None:
        e.target = "operator"
        with self.swap:
            restart_operator(self.mesh)

    def api_down(self, e: Event, _: MeshNodeProxy) -> None:
        e.target = "kube-apiserver"
        api = self.mesh.api
        if not isinstance(api, ControlPlane):
            e.detail = "not done: the API is not a real control plane"
            return
        api.set_down(True)
        try:
            time.sleep(API_DOWN_S)  # the outage itself, not a wait for a signal
        finally:
            api.set_down(False)

    # -- waiting on effects ----------------------------------------------------------------------------
    def _hosts(self, service: str, pods: set[str], draining: frozenset[str] = frozenset()) -> None:
        """Until every node's Envoy holds exactly these pods for the Service (`draining` ones not healthy)."""
        cluster = udp_cluster(self.mesh.namespace, service)
        ips = {self.mesh.pods[p].ip: p in draining for p in pods}

        def held() -> bool:
            for node in self.mesh.nodes.values():
                health = node.host_health(cluster)
                if set(health) != set(ips) or any(d == (health[ip] == "healthy") for ip, d in ips.items()):
                    return False
            return True

        wait_for(held, SETTLE, f"{service} hosts {sorted(pods)}", ignore=(OSError, RuntimeError))

    def _policy(self, ghost: str = "ghost-0") -> None:
        ns = self.mesh.namespace
        sources = [spiffe_id(ns, sa) for sa in (*self.callers, ghost)]
        self.mesh.kube.authorization_policy(ns, POLICY, "web", sources)

    def _rbac_has(self, identity: str) -> None:
        """Until every node's Envoy has `identity` in its config (the policy's RBAC at web's inbounds)."""

        def there() -> bool:
            return all(identity in n.admin("/config_dump") for n in self.mesh.nodes.values())

        wait_for(there, SETTLE, f"{identity} in the inbound RBAC", ignore=(OSError, RuntimeError))
