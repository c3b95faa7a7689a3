"""The sidecar's in-kernel UDP path (issue 29, docs/operations.md#the-udp-data-path): which arms select it, and
the one worker thread that programs them into every meshed pod's netns.

- `kernel_plan` (pure): a node's served arms whose effective data path (`ServiceArm.dataplane`, else the node's
  `--udp-dataplane`) is `kernel`, as the kernel path's arms (`kernel_arms`: plaintext UDP only, both families; each
  with the Service's idle timeout, the node's `--udp-idle-timeout` for the rest), and the pods to
  program: those the MeshNode lists that have a pod record (the netns path), as the Envoy path binds listeners.
- `KernelUdpPath`: `submit` hands it the latest (node, records) and returns at once (it is called under the
  sidecar's lock, on the thread that reconciled); its worker thread, the only one that programs, applies the plan
  with `program_kernel_udp`: a pod is programmed when what it should hold differs from what it last got (its
  `previous`), or after a failure (retried every `RETRY_S`). A pod that left is forgotten (its netns is gone); a pod
  whose arms no longer select kernel gets a smaller table (an empty one when none). A node that never selected
  kernel touches no netns but once: at its start it deletes any table an earlier sidecar left (its Services left
  kernel while it was down). After a sidecar restart the first apply to each pod is a full replace of what is there
  (one nft transaction: the working rules stay until the new ones load). What failed goes to `on_problems`, one
  entry per pod netns (the Programmed condition's message); the netns keeps its previous rules. A pod whose netns
  file is gone (its CNI DEL ran before its record went) is not a failure: nothing is left to program.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aether.api.meshnode import MeshNode, ServiceArm, UdpDataplane
from aether.netns.kernel_udp import KernelArm
from aether.netns.kernel_udp_install import KernelUdpError, program_kernel_udp, remove_kernel_udp
from aether.netns.records import PodRecord
from aether.xds.sidecar.kernel_arms import kernel_arm

log = logging.getLogger("aether.xds.sidecar.kernel")
RETRY_S = 5.0  # a pod netns whose rules failed is tried again this often (and on every change)
LOGGED_ARMS = 8  # an apply's log line names this many arms, then counts the rest
REPORTED = 5  # Programmed's message names this many failed pod netns, then counts the rest (the MeshNode's size)


class Program(Protocol):
    def __call__(
        self,
        netns_path: str,
        arms: Sequence[KernelArm],
        *,
        previous: Sequence[KernelArm] = (),
        default_idle_timeout_s: float | None = None,
    ) -> int: ...


Remove = Callable[[str], None]


@dataclass(frozen=True)
class PodTarget:
    name: str  # <namespace>/<name>
    netns: str


@dataclass(frozen=True)
class KernelPlan:
    arms: tuple[KernelArm, ...]  # the same for every pod of the node
    services: Mapping[str, str]  # VIP -> <namespace>/<name> of the Service dialled (metrics, logs)
    pods: Mapping[str, PodTarget]  # pod uid -> where to program
    selected: bool  # the node's default or any arm selects kernel


def vip_key(vip: str) -> str:
    """A VIP as the counters name it (an IPv6 one compressed, RFC 5952)."""
    try:
        return str(ipaddress.ip_address(vip))
    except ValueError:
        return vip


def selects_kernel(arm: ServiceArm, default: UdpDataplane) -> bool:
    return (arm.dataplane or default) == "kernel"


def kernel_selected(node: MeshNode, default: UdpDataplane) -> bool:
    """Whether any of `node`'s UDP arms takes the kernel path (cheap: no plan is built)."""
    return default == "kernel" or any(a.dataplane == "kernel" for a in node.status.udp.services)


def kernel_plan(node: MeshNode, records: Mapping[str, PodRecord], default: UdpDataplane) -> KernelPlan:
    """What every meshed pod of `node` should hold (pure)."""
    chosen = [a for a in node.status.udp.services if selects_kernel(a, default)]
    arms, services = [], {}
    for arm in chosen:
        k = kernel_arm(arm)
        if k is not None:
            arms.append(k)
            services[vip_key(k.vip)] = arm.service
    pods = {
        p.uid: PodTarget(f"{p.namespace}/{p.name}", records[p.uid].netns) for p in node.status.pods if p.uid in records
    }
    return KernelPlan(tuple(arms), services, pods, default == "kernel" or bool(chosen))


def _show(arm: KernelArm) -> str:
    live = [f"{b.ip}:{b.port}" + (f" w{b.weight}" if b.weight != 1 else "") for b in arm.backends if b.valid]
    dropped = sum(not b.valid for b in arm.backends)
    return f"[{', '.join(live)}" + (f", {dropped} dropped" if dropped else "") + "]"


def changes(previous: Sequence[KernelArm], arms: Sequence[KernelArm], services: Mapping[str, str]) -> str:
    """The arms an apply changed, for its log line: `<service> <VIP> [backends]` (LOGGED_ARMS of them), removed VIPs."""
    before = {a.vip: a for a in previous}
    changed = [a for a in arms if before.get(a.vip) != a]
    removed = sorted(set(before) - {a.vip for a in arms})
    shown = [f"{services.get(vip_key(a.vip), '?')} {a.vip} {_show(a)}" for a in changed[:LOGGED_ARMS]]
    more = f", and {len(changed) - LOGGED_ARMS} more" if len(changed) > LOGGED_ARMS else ""
    text = f"changed: {', '.join(shown)}{more}" if changed else "nothing changed"
    return text + (f"; removed: {', '.join(removed)}" if removed else "")


def reported(failures: Mapping[str, str]) -> tuple[str, ...]:
    """What Programmed's message carries: the first REPORTED failures (by pod uid), then how many more."""
    listed = [failures[u] for u in sorted(failures)]
    more = len(listed) - REPORTED
    return tuple(listed[:REPORTED]) + (
        (f"and {more} more pod netns (the sidecar's log names each)",) if more > 0 else ()
    )


@dataclass(frozen=True)
class Applied:
    """What one pod netns holds: the arms of its last successful apply."""

    target: PodTarget
    arms: tuple[KernelArm, ...]
    services: Mapping[str, str] = field(default_factory=dict)


def _changed(plan: KernelPlan, uid: str, last: Applied | None, failed: bool) -> bool:
    target = plan.pods[uid]
    if last is None:  # never programmed here: only once kernel is selected (or to settle a failed first try)
        return plan.selected or failed
    return failed or last.arms != plan.arms or last.target != target


class KernelUdpPath:
    """The one owner of the node's kernel UDP programming (see the module docstring)."""

    def __init__(
        self,
        default: UdpDataplane = "envoy",
        *,
        program: Program = program_kernel_udp,
        remove: Remove = remove_kernel_udp,
        on_problems: Callable[[tuple[str, ...]], None] | None = None,
        retry_s: float = RETRY_S,
        idle_timeout_s: float | None = None,
        path_exists: Callable[[str], bool] = os.path.exists,
    ) -> None:
        self.default: UdpDataplane = default
        self.idle_timeout_s = idle_timeout_s  # the node's (--udp-idle-timeout), for arms without their own
        self._program, self._remove, self._exists = program, remove, path_exists
        self._adopting = True  # the first plan: what an earlier sidecar left in the pods' netns
        self.on_problems = on_problems
        self.on_idle: Callable[[int], None] | None = None  # the worker applied submission N, the latest
        self.submitted = 0  # submissions so far (each reconcile's)
        self.involved = default == "kernel"  # this node has used the kernel path (its default, or any arm, once)
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._latest: tuple[MeshNode, Mapping[str, PodRecord], int] | None = None
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.applied: dict[str, Applied] = {}  # pod uid -> what its netns holds (worker-owned; read: `holding`)
        self.failures: dict[str, str] = {}  # pod uid -> why its last apply failed

    def submit(self, node: MeshNode, records: Mapping[str, PodRecord]) -> int:
        """The latest served state: programmed by the worker (only the last of several queued ones). Returns its
        number, which `on_idle` reports once the worker has applied it."""
        with self._lock:
            self.submitted += 1
            self._latest = (node, records, self.submitted)
            self._idle.clear()
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="kernel-udp", daemon=True)
                self._thread.start()
        self._wake.set()
        return self.submitted

    def holding(self) -> list[Applied]:
        """What every programmed pod netns holds now (a copy, for the metrics)."""
        with self._lock:
            return list(self.applied.values())

    def wait_idle(self, timeout: float) -> bool:
        """Tests: True once everything submitted so far was applied (or failed)."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        plan: KernelPlan | None = None
        seq = 0
        while not self._closed:
            self._wake.wait(self._retry_s if self.failures else None)
            self._wake.clear()
            if self._closed:
                return
            with self._lock:
                latest, self._latest = self._latest, None
            if latest is not None:
                plan, seq = kernel_plan(latest[0], latest[1], self.default), latest[2]
            if plan is not None:
                try:
                    self.apply(plan)
                except Exception:
                    log.exception("programming the kernel UDP path failed")
            with self._lock:
                done = self._latest is None
            if done and self.on_idle is not None:
                self.on_idle(seq)
            if done:
                self._idle.set()

    def apply(self, plan: KernelPlan) -> None:
        """Bring every pod netns to `plan` (the worker's step; tests call it directly)."""
        for uid in [u for u in self.applied if u not in plan.pods]:
            with self._lock:
                gone = self.applied.pop(uid)
            log.info("kernel UDP: pod %s left (netns %s): forgotten", gone.target.name, gone.target.netns)
        for uid in [u for u in self.failures if u not in plan.pods]:
            del self.failures[uid]
        before = dict(self.failures)
        self.involved = self.involved or plan.selected
        if self._adopting:
            self._adopting = False
            if not plan.selected:
                self._clear_leftovers(plan)
        for uid, target in plan.pods.items():
            last = self.applied.get(uid)
            if _changed(plan, uid, last, uid in self.failures):
                self._apply_one(uid, target, plan, last)
        if self.failures != before and self.on_problems is not None:
            self.on_problems(reported(self.failures))

    def _clear_leftovers(self, plan: KernelPlan) -> None:
        """Nothing selects kernel at this sidecar's start: a table an earlier sidecar loaded (its Services have left
        kernel since) would keep rewriting their VIPs, so each pod's is deleted (an idempotent delete). Where that
        fails (a sidecar without the privileges: it never programmed one) it is only logged at debug level."""
        for uid, target in plan.pods.items():
            try:
                self._remove(target.netns)
            except KernelUdpError as exc:
                log.debug("kernel UDP: no leftover table removed in pod %s: %s", target.name, exc)
                continue
            with self._lock:
                self.applied[uid] = Applied(target, ())

    def _apply_one(self, uid: str, target: PodTarget, plan: KernelPlan, last: Applied | None) -> None:
        previous = last.arms if last is not None and last.target == target else ()
        t0 = time.perf_counter()
        try:
            forgot = self._program(
                target.netns, plan.arms, previous=previous, default_idle_timeout_s=self.idle_timeout_s
            )
        except KernelUdpError as exc:
            if not self._exists(target.netns):  # the pod is going (CNI DEL removed its netns before its record)
                log.info("kernel UDP: pod %s has no netns %s any more: not programmed", target.name, target.netns)
                self.failures.pop(uid, None)
                return
            why = f"kernel UDP rules not applied in pod {target.name}: {exc}"
            if self.failures.get(uid) != why:
                log.warning("%s", why)
            self.failures[uid] = why
            return
        with self._lock:
            self.applied[uid] = Applied(target, plan.arms, plan.services)
        self.failures.pop(uid, None)
        log.info(
            "kernel UDP: pod %s (netns %s) holds %d arms; %s%s, %.1f ms",
            target.name,
            target.netns,
            len(plan.arms),
            changes(previous, plan.arms, plan.services),
            f", {forgot} flows of departed backends forgotten" if forgot else "",
            (time.perf_counter() - t0) * 1000,
        )
