"""The soak's CPU probe: east-west proxy CPU per request, h3 and h2, over the run (the design record's gate: h3/h2 at
most 1.5x). One Envoy per node carries every class at once, so its CPU cannot be split by class; the probe measures
what extra requests of one class add instead.

Every `every` seconds a cycle of five windows: baseline, an h3 burst, baseline, an h2 burst, baseline. A burst is
BURST GETs to Service `web` over one keep-alive connection to a source pod's outbound listener, at most RATE per
second (the paced probers keep their own schedule beside it), each answer's backend and caller identity checked
as the probers check theirs; the h3 burst comes from a pod on a node with QUIC twins, the h2 one from a pod on the
node running `--east-west-quic off`. Both nodes' Envoys' utime+stime (`Envoy.cpu_seconds`, 10 ms ticks) are read at
every window's edges: a request crosses its source's Envoy and its destination's, on either node. Per burst:

    marginal CPU per request = (burst CPU - baseline rate x burst duration) / requests answered

with the baseline rate the mean of the two baselines beside it. The source Envoy's counter of the cluster the class
must take (the source's twin for h3, the h2 cluster for h2) is read around each burst: it must have moved by at least
the requests answered (the transport is checked, not assumed). A burst is kept only when, from its first baseline's
start to its second's end, no Envoy was replaced and no sidecar or Envoy restart overlapped, every request was
answered right and the counter moved; the report gives per class the median over its kept bursts, and the median of
the h3/h2 ratios of the cycles that kept both.
"""

from __future__ import annotations

import http.client
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aether.api.naming import h2_cluster, mesh_host, quic_twin, spiffe_id
from aether.e2e.harness import Mesh, MeshPod
from aether.netns.contract import HTTP_OUTBOUND_PORT
from aether.netns.nsthread import run_in_netns
from aether.testing.probe import http_answer
from bench.soak_report import Event, Outcome

BURST = 300  # requests per burst
RATE = 100.0  # at most this many per second (a burst lasts about 3 s)
BASE_S = 3.0  # each baseline window
SPOILERS = ("envoy_restart", "sidecar_restart")  # events whose CPU (a new process, a full push) spoils a cycle
TIMEOUT = 2.0
GIVE_UP = 5  # failures after which a burst stops
CLASSES = ("h3", "h2")


@dataclass(frozen=True)
class Source:
    cls: str  # h3 or h2
    pod: MeshPod
    sa: str

    def cluster_stat(self, namespace: str) -> str:
        """The source Envoy's request counter of the cluster this class must take."""
        name = quic_twin(namespace, "web", self.sa) if self.cls == "h3" else h2_cluster(namespace, "web")
        return f"cluster.{name.replace(':', '_')}.upstream_rq_total"


@dataclass
class Burst:
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    backends: dict[str, int] = field(default_factory=dict)
    response_bytes: list[int] = field(default_factory=list)


def request_bytes(host: str) -> int:
    """The GET as http.client sends it with an explicit Host (it adds Accept-Encoding: identity)."""
    return len(f"GET / HTTP/1.1\r\nHost: {host}\r\nAccept-Encoding: identity\r\n\r\n".encode())


def burst(pod: MeshPod, host: str, want_id: str, valid: set[str], n: int = BURST, rate: float = RATE) -> Burst:
    """`n` GETs over one keep-alive connection from inside the pod (a new one after an error), each judged."""
    out = Burst()

    def run() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", HTTP_OUTBOUND_PORT, timeout=TIMEOUT)
        next_at = time.monotonic()
        for _ in range(n):
            if len(out.failed) >= GIVE_UP:  # the cycle is spoilt already: no minutes of timeouts
                break
            time.sleep(max(0.0, next_at - time.monotonic()))  # the pace, not a wait for a signal
            next_at += 1 / rate
            try:
                conn.request("GET", "/", headers={"Host": host})
                resp = conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                out.failed.append(repr(exc)[:120])
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", HTTP_OUTBOUND_PORT, timeout=TIMEOUT)
                continue
            got = http_answer(resp.status, body.decode(errors="replace"))
            if got.status != 200 or got.backend not in valid or got.spiffe_id != want_id:
                out.failed.append(f"{got.status} {got.backend} {got.spiffe_id}")
                continue
            out.ok += 1
            out.backends[got.backend] = out.backends.get(got.backend, 0) + 1
            headers = sum(len(k) + len(v) + 4 for k, v in resp.getheaders())
            out.response_bytes.append(len(body) + headers + len(f"HTTP/1.1 {resp.status} {resp.reason}\r\n\r\n"))
        conn.close()

    run_in_netns(pod.netns_path, run)
    return out


@dataclass
class CpuProbe:
    mesh: Mesh
    sources: Sequence[Source]  # one h3, one h2
    valid: Callable[[], set[str]]  # the web backends now
    events: Callable[[], Sequence[Event]]
    every: float = 60.0
    first_after: float = 20.0
    cycles: list[dict[str, Any]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    @contextmanager
    def running(self) -> Iterator[None]:
        """The probe's cycles in a thread for the body's duration."""
        thread = threading.Thread(target=self._loop, name="soak-cpu", daemon=True)
        thread.start()
        try:
            yield
        finally:
            self.stop.set()
            thread.join(timeout=60)

    def _loop(self) -> None:
        next_at = time.monotonic() + self.first_after
        while not self.stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.every
            try:
                self.cycles.append(self._cycle())
            except Exception as exc:  # a cycle that could not run (an Envoy down) is recorded, the probe goes on
                why = {"kept": False, "why": repr(exc)[:300]}
                self.cycles.append({"t": time.monotonic(), "windows": [], **{cls: why for cls in CLASSES}})

    def _cpu(self) -> tuple[float, tuple[int, ...]]:
        envoys = [n.running_envoy() for n in sorted(self.mesh.nodes.values(), key=lambda n: n.name)]
        return sum(e.cpu_seconds() for e in envoys), tuple(e.proc.pid for e in envoys)

    def _window(self, source: Source | None) -> dict[str, Any]:
        """One window: a burst from `source`, or a baseline (None); CPU and time at its edges."""
        ns = self.mesh.namespace
        before = source.pod.node.stat(source.cluster_stat(ns)) if source else 0
        cpu0, pids0 = self._cpu()
        t0 = time.monotonic()
        got = None
        if source is None:
            self.stop.wait(BASE_S)  # the baseline window itself
        else:
            got = burst(source.pod, mesh_host(ns, "web"), spiffe_id(ns, source.sa), self.valid())
        t1 = time.monotonic()
        cpu1, pids1 = self._cpu()
        out: dict[str, Any] = {"t0": t0, "t1": t1, "s": round(t1 - t0, 3), "cpu_s": round(cpu1 - cpu0, 3)}
        out |= {"pids0": pids0, "pids1": pids1}
        if source is not None and got is not None:
            moved = source.pod.node.stat(source.cluster_stat(ns)) - before
            out |= {"cls": source.cls, "ok": got.ok, "failed": len(got.failed), "failures": got.failed[:5]}
            out |= {"counter": source.cluster_stat(ns), "counter_moved": moved, "backends": got.backends}
            out["response_bytes"] = statistics.median(got.response_bytes) if got.response_bytes else None
        return out

    def _cycle(self) -> dict[str, Any]:
        h3, h2 = self.sources
        w = [self._window(None), self._window(h3), self._window(None), self._window(h2), self._window(None)]
        out: dict[str, Any] = {"t": w[0]["t0"], "windows": w}
        if self.stop.is_set():  # the run ended inside the cycle: its last baseline was cut short
            return out | {cls: {"kept": False, "why": "the run ended inside the cycle"} for cls in CLASSES}
        out["h3"], out["h2"] = self._judge(*w[0:3]), self._judge(*w[2:5])
        return out

    def _judge(self, before: dict[str, Any], b: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        """One class's burst between its two baselines: its marginal CPU per request, and whether it is kept."""
        base = (before["cpu_s"] / before["s"] + after["cpu_s"] / after["s"]) / 2
        us = round(1e6 * (b["cpu_s"] - base * b["s"]) / b["ok"], 1) if b["ok"] else None
        start, end = before["t0"], after["t1"]
        spoilers = [f"{e.kind}:{e.target}" for e in self.events() if e.kind in SPOILERS and e.overlaps(start, end)]
        why = [
            *(["an Envoy was replaced"] if before["pids0"] != after["pids1"] else []),
            *([f"events {spoilers}"] if spoilers else []),
            *([f"{b['failed']} failed"] if b["failed"] else []),
            *([f"{b['counter']} moved {b['counter_moved']}"] if b["counter_moved"] < b["ok"] else []),
        ]
        return {"us_per_request": us, "kept": not why, "why": "; ".join(why)}


def _median(values: Sequence[float], digits: int = 1) -> float | None:
    return round(statistics.median(values), digits) if values else None


def _span(values: Sequence[float], digits: int = 1) -> list[float] | None:
    return [round(min(values), digits), round(max(values), digits)] if values else None


def _relative(cycle: dict[str, Any], t0: float) -> dict[str, Any]:
    """A cycle as the JSON lists it: times from the run's start."""
    windows = [w | {"t0": round(w["t0"] - t0, 2), "t1": round(w["t1"] - t0, 2)} for w in cycle["windows"]]
    return cycle | {"t": round(cycle["t"] - t0, 1), "windows": windows}


def _latency(took: list[float]) -> dict[str, Any]:
    took.sort()
    pick = (lambda q: round(1e3 * took[min(len(took) - 1, int(q * len(took)))], 1)) if took else (lambda q: None)
    return {"requests": len(took), "p50_ms": pick(0.5), "p99_ms": pick(0.99)}


def paced(outcomes: Iterable[Outcome], cycles: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Whether the bursts disturbed the paced probers: per class, the latency of requests that started inside a
    burst window and of those that did not."""
    bursts = [(w["t0"], w["t1"]) for c in cycles for w in c["windows"] if w.get("cls")]
    split: dict[str, tuple[list[float], list[float]]] = {}
    for o in outcomes:
        inside, outside = split.setdefault(o.cls, ([], []))
        (inside if any(a <= o.start <= b for a, b in bursts) else outside).append(o.end - o.start)
    return {cls: {"in_bursts": _latency(i), "outside": _latency(x)} for cls, (i, x) in sorted(split.items())}


def summary(cycles: Sequence[dict[str, Any]], t0: float, host: str) -> dict[str, Any]:
    """The report's figures: per class the median marginal CPU per request over its kept bursts, the median of the
    h3/h2 ratios of the cycles that kept both."""
    kept = {cls: [c[cls]["us_per_request"] for c in cycles if c.get(cls, {}).get("kept")] for cls in CLASSES}
    both = [c for c in cycles if all(c.get(cls, {}).get("kept") for cls in CLASSES)]
    ratios = [
        c["h3"]["us_per_request"] / c["h2"]["us_per_request"] for c in both if (c["h2"]["us_per_request"] or 0) > 0
    ]
    sizes = [w["response_bytes"] for c in cycles for w in c["windows"] if w.get("response_bytes")]
    return {
        "cpu_per_request_us": {cls: _median(v) for cls, v in kept.items()},
        "h3_over_h2_cpu": _median(ratios, 3),
        "cpu_probe": {
            "cycles": len(cycles),
            "kept": {cls: len(v) for cls, v in kept.items()},
            "cycles_with_both": len(both),
            "burst_requests": BURST,
            "burst_rate_per_s": RATE,
            "baseline_s": BASE_S,
            "request_bytes": request_bytes(host),
            "response_bytes_median": _median(sizes, 0),
            "us_per_request_range": {cls: _span(v) for cls, v in kept.items()},
            "ratio_range": _span(ratios, 3),
            "list": [_relative(c, t0) for c in cycles],
        },
    }
