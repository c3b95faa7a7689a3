"""The operator on a real API server beside the emulator: bench/operator_reconcile's synthetic cluster (default egress;
10,000 Services / 1,000 nodes / 50,000 pods at 1,000 namespaces) loaded into kube-apiserver + etcd and into the API
test bed as its own process (`aether dev-api`), then `aether operator` on each through a FaultProxy that counts its
requests and bytes. Per server: the load, the time to converge (every MeshNode Ready as the model computes it, every
MeshServiceSlice there; polled as Tables), the operator's writes and reads, endpoint flips (time until the slice shows
it, writes), CPU s (utime+stime) per phase and peak RSS (VmHWM) of each server process, the operator and this one.
Long because: one benchmark end to end (the cluster as requests, two servers' and the operator's lifecycles, the
meters, the report), none of it used elsewhere; its pure parts are tested in tests/test_bench_operator_apiserver.py.
Run: .venv/bin/python -m bench.operator_apiserver [--namespaces N] [--nodes N] [--control-plane real|emulated|both]
[--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from aether.api.client import api_client
from aether.testing import controlplane
from aether.testing.apiserver import api_server
from aether.testing.apitestbed import objects as o
from aether.testing.controlplane.cluster import Process, free_port
from aether.testing.controlplane.faultproxy import FaultProxy, Tally
from aether.testing.promtext import by_label, scrape, value
from aether.testing.synthetic_cluster import PODS_PER_NS, SERVICES_PER_NS, build, pod_node

Request = tuple[str, str, Any]  # (method, path, body)
PORTS = [("dns", 53, "UDP"), ("http", 8080, "TCP")]
EP_PORTS = [("dns", 5353, "UDP"), ("http", 8080, "TCP")]
JSON, MERGE = "application/json", "application/merge-patch+json"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
MESH = "/apis/mesh.aether.dev/v1alpha1"
WRITES = ("create", "update", "patch", "delete", "deletecollection")
CLK_TCK = os.sysconf("SC_CLK_TCK")
AETHER = [sys.executable, "-m", "aether.cli"]


# -- the cluster as requests (pure) -----------------------------------------------------------------------------------
def pod_ip(i: int, j: int) -> str:
    return f"10.{i // 200}.{i % 200}.{j + 1}"


def endpoints(i: int, k: int, flipped: bool = False) -> list[tuple[str, bool, str | None]]:
    """Service s<k>'s five endpoints (its pods); `flipped`: the first one not ready."""
    return [(pod_ip(i, k * 5 + e), not (flipped and e == 0), f"p{k * 5 + e}") for e in range(5)]


def stages(n_ns: int, nodes: int) -> list[tuple[str, list[Request]]]:
    """synthetic_cluster.build's objects as API requests, each stage needing only the ones before it."""
    names = [f"ns{i:04d}" for i in range(n_ns)]
    base: list[Request] = [("POST", "/api/v1/nodes", o.node(f"node{n:04d}")) for n in range(nodes)]
    base += [("POST", "/api/v1/namespaces", o.namespace(ns)) for ns in names]
    sa = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": f"sa{a}"}} for a in (0, 1)]
    accounts: list[Request] = [("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", b) for ns in names for b in sa]
    objects: list[Request] = []
    status: list[Request] = []
    for i, ns in enumerate(names):
        for k in range(SERVICES_PER_NS):
            vip = f"10.100.{i // 25}.{(i % 25) * 10 + k}"  # synthetic_cluster's 10.96 moved: 10.96.0.1 is taken
            objects.append(("POST", f"/api/v1/namespaces/{ns}/services", o.service(ns, f"s{k}", vip, PORTS)))
            eps = o.endpoint_slice(ns, f"s{k}", EP_PORTS, endpoints(i, k))
            objects.append(("POST", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", eps))
        route = o.udproute(ns, "r", "s0", [o.backend("s1", 53, 2), o.backend("s2", 53, 1)], version="v1")
        objects.append(("POST", f"/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/udproutes", route))
        for j in range(PODS_PER_NS):
            pod = o.pod(ns, f"p{j}", f"node{pod_node(i, j, nodes):04d}", f"sa{j // 5 % 2}")
            objects.append(("POST", f"/api/v1/namespaces/{ns}/pods", pod))
            status.append(("PATCH", f"/api/v1/namespaces/{ns}/pods/p{j}/status", o.pod_status(pod_ip(i, j))))
    labels = ("Nodes, Namespaces", "ServiceAccounts", "Services, EndpointSlices, UDPRoutes, Pods", "Pod status")
    return list(zip(labels, (base, accounts, objects, status), strict=True))


def expected(n_ns: int, nodes: int) -> tuple[dict[str, tuple[int, int]], set[str]]:
    """What the operator converges to, from the pure model: MeshNode -> (pods, slices); the MeshServiceSlices."""
    out = build(n_ns, nodes, scoped=False)[0].reconcile()
    want = {n: (d.owned["summary"]["pods"], d.owned["summary"]["slices"]) for n, d in out.desired.items()}
    return want, {name for name, spec in out.slices.items() if spec is not None}


def progress(node_rows: list[dict[str, Any]], want: dict[str, tuple[int, int]]) -> int:
    """How many MeshNodes of a Table are Ready with the Pods and Slices columns the model computes."""
    ok = [
        r.get("Ready") == "True" and want.get(str(r.get("Name"))) == (r.get("Pods"), r.get("Slices")) for r in node_rows
    ]
    return sum(ok)


def arm_ips(slice_obj: dict[str, Any], service: str) -> set[str] | None:
    for arm in ((slice_obj.get("spec") or {}).get("udp") or {}).get("services") or []:
        if arm.get("service") == service:
            return {e["ip"] for e in arm.get("endpoints") or []}
    return None


def proc_figures(stat: str, status: str, clk_tck: int = CLK_TCK) -> tuple[float, float]:
    """(utime + stime in s, VmHWM in MiB) from /proc/<pid>/stat (fields 14, 15; the name may hold spaces) and status."""
    fields = stat[stat.rindex(")") + 2 :].split()
    hwm = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    return (int(fields[11]) + int(fields[12])) / clk_tck, hwm / 1024


def writes(before: dict[Any, Tally], after: dict[Any, Tally]) -> dict[str, list[int]]:
    """The write requests between two FaultProxy.traffic() snapshots: 'verb plural[/sub]' -> [requests, bytes]."""
    out: dict[str, list[int]] = {}
    for key, t in after.items():
        b = before.get(key, Tally())
        if key[0] in WRITES and t.requests > b.requests:
            name = f"{key[0]} {key[1]}{'/' + key[2] if key[2] else ''}"
            out[name] = [t.requests - b.requests, t.request_bytes - b.request_bytes]
    return out


# -- processes ------------------------------------------------------------------------------------------------------
def client_for(kubeconfig: Path, pool: int) -> kubernetes.client.ApiClient:
    return api_client(str(kubeconfig), pool=pool)


def call(client: Any, method: str, path: str, body: Any = None, accept: str = JSON) -> tuple[int, bytes]:
    headers = {"Accept": accept, "Content-Type": MERGE if method == "PATCH" else JSON}
    params = client.param_serialize(method, path, header_params=headers, body=body, auth_settings=["BearerToken"])
    resp = client.call_api(*params)
    return int(resp.status), bytes(resp.read())


def send(client: Any, req: Request) -> None:
    """One request, retried on 429, 5xx and 404 (a namespace admission has not seen yet); 409 after a retry: landed."""
    method, path, body = req
    for attempt in range(6):
        status, data = call(client, method, path, body)
        if status < 300 or (status == 409 and attempt > 0):
            return
        if status not in (404, 429, 500, 503, 504) or attempt == 5:
            raise RuntimeError(f"{method} {path}: {status} {data[:300]!r}")
        time.sleep(0.2 * 2**attempt)


def table(client: Any, path: str) -> list[dict[str, Any]]:
    status, data = call(client, "GET", path, accept=TABLE)
    if status != 200:
        raise RuntimeError(f"GET {path} as a Table: {status} {data[:300]!r}")
    doc = json.loads(data)
    names = [c["name"] for c in doc["columnDefinitions"]]
    return [dict(zip(names, r["cells"], strict=False)) for r in doc.get("rows") or []]


@dataclass
class Server:
    version: str
    kubeconfig: Path  # direct, as the admin (the loader and the polls)
    proxy: FaultProxy  # the operator's way in
    pids: dict[str, int]


@contextlib.contextmanager
def server(kind: str, workdir: Path) -> Iterator[Server]:
    if kind == "real":
        with api_server("real", faults=True) as real:
            cp, proxy = real.control_plane, real.proxy
            assert cp is not None and proxy is not None
            pids = {n: p.proc.pid for n, p in cp.processes.items() if p.proc is not None}
            yield Server(f"kube-apiserver {cp.version}", cp.kubeconfig_path, proxy, pids)
        return
    kubeconfig, argv = workdir / "emulated.kubeconfig", [*AETHER, "dev-api", "--control-plane", "emulated"]
    dev = Process(
        "aether dev-api", [*argv, "--channel", "experimental", "--kubeconfig", str(kubeconfig)], workdir / "dev.log"
    )
    dev.start()
    try:
        until = time.monotonic() + 60
        while "serving" not in dev.log.read_text():  # the kubeconfig is written once its CRDs are in
            if not dev.alive() or time.monotonic() > until:
                raise RuntimeError(f"aether dev-api did not start:\n{dev.tail()}")
            time.sleep(0.1)
        assert dev.proc is not None
        url = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        proxy = FaultProxy.plain(url, workdir / "proxy.kubeconfig")
        try:
            yield Server("the API test bed (aether dev-api)", kubeconfig, proxy, {dev.name: dev.proc.pid})
        finally:
            proxy.stop()
    finally:
        dev.stop()


@dataclass
class Operator:
    proc: Any  # subprocess.Popen
    metrics: str  # its /metrics URL

    def wait(self, what: str, pred: Callable[[], bool], timeout: float, interval: float) -> int:
        """Poll `pred` every `interval` s until true (-> the number of polls); raise if the operator exits."""
        deadline, polls = time.monotonic() + timeout, 0
        while not pred():
            polls += 1
            if self.proc.poll() is not None:
                raise RuntimeError(f"the operator exited ({self.proc.returncode}) while waiting for {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not after {timeout:g} s")
            time.sleep(interval)
        return polls + 1

    def settle(self, timeout: float) -> Any:
        """Until it has run two more resyncs (every written object compared with the API's copy) and passes."""
        keys, start = ("aether_operator_resyncs_total", "aether_operator_reconcile_passes_total"), scrape(self.metrics)
        self.wait(
            "two resyncs",
            lambda: all(value(scrape(self.metrics), k) >= value(start, k) + 2 for k in keys),
            timeout,
            0.5,
        )
        return scrape(self.metrics)


@contextlib.contextmanager
def operator(kubeconfig: Path, workdir: Path) -> Iterator[Operator]:
    """`aether operator` through the proxy, with its metrics on a free port."""
    port = free_port()
    proc = Process(
        "operator",
        [*AETHER, "operator", "--kubeconfig", str(kubeconfig), "--metrics", f"127.0.0.1:{port}"],
        workdir / "operator.log",
    )
    proc.start()
    try:
        yield Operator(proc.proc, f"http://127.0.0.1:{port}/metrics")
    finally:
        proc.stop()


class Meter:
    """CPU seconds and peak RSS of named processes at named moments."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self.marks: dict[str, dict[str, tuple[float, float]]] = {}

    def mark(self, name: str) -> None:
        self.marks[name] = {
            p: proc_figures(Path(f"/proc/{pid}/stat").read_text(), Path(f"/proc/{pid}/status").read_text())
            for p, pid in self.pids.items()
        }

    def figures(self) -> dict[str, float]:
        out: dict[str, float] = {}
        phases = (("load", "start", "loaded"), ("operator converging", "loaded", "converged"))
        for p in self.pids:
            for label, a, b in (*phases, ("endpoint flips", "converged", "changed")):
                if p in self.marks[a] or a != "start":
                    out[f"{p}: CPU s, {label}"] = self.marks[b][p][0] - self.marks[a].get(p, (0.0, 0.0))[0]
            out[f"{p}: peak RSS MiB"] = self.marks["changed"][p][1]
        return out


def load(client: Any, plan: list[tuple[str, list[Request]]], threads: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with ThreadPoolExecutor(threads) as pool:
        for label, reqs in plan:
            t0 = time.perf_counter()
            list(pool.map(lambda r: send(client, r), reqs))
            dt = time.perf_counter() - t0
            out[f"load {label}: requests"], out[f"load {label}: s"] = len(reqs), dt
            print(f"  loaded {label}: {len(reqs)} requests in {dt:.1f} s ({len(reqs) / dt:.0f}/s)", flush=True)
    return out


def own_writes(a: Any, b: Any) -> tuple[float, float]:
    """(MeshNode + slice writes, of which drift rewrites) between two scrapes of the operator's metrics."""
    kinds = [
        (f"aether_operator_{k}_writes_total", {"outcome": o})
        for k in ("meshnode", "slice")
        for o in ("created", "patched")
    ]
    drift = [("aether_operator_drift_corrections_total", {"kind": k}) for k in ("meshnode", "slice")]
    wrote, fixed = (sum(value(b, n, **lb) - value(a, n, **lb) for n, lb in keys) for keys in (kinds, drift))
    return wrote, fixed


def total(w: dict[str, list[int]], i: int) -> int:
    return sum(v[i] for v in w.values())


def converge(srv: Server, client: Any, op: Operator, want: Any, timeout: float) -> dict[str, Any]:
    """From the operator's start until every MeshNode is Ready as computed and every slice is there; then settled."""
    nodes, slices = want
    t0, last = time.monotonic(), [0.0]

    def done() -> bool:
        ok = progress(table(client, f"{MESH}/meshnodes"), nodes)
        have = {str(r["Name"]) for r in table(client, f"{MESH}/meshserviceslices")} if ok == len(nodes) else set()
        if time.monotonic() - last[0] > 15:
            last[0] = time.monotonic()
            print(f"  {time.monotonic() - t0:6.1f} s: {ok}/{len(nodes)} MeshNodes converged", flush=True)
        return ok == len(nodes) and slices <= have

    polls = op.wait("convergence", done, timeout, 1.0)
    took, at, m_at = time.monotonic() - t0, srv.proxy.traffic(), scrape(op.metrics)
    m = op.settle(timeout)
    wrote, later = writes({}, at), writes(at, srv.proxy.traffic())
    print(f"  converged in {took:.1f} s ({polls} polls); then, in two resyncs: {later or 'no writes'}", flush=True)
    return {
        "figures": {
            "converge: s from the operator's start": took,
            "converge: polls (1 s apart)": polls,
            "converge: objects written": total(wrote, 0),
            "converge: MiB written (request bodies)": total(wrote, 1) / 2**20,
            "converge: MiB read (lists, watch streams)": sum(t.response_bytes for t in at.values()) / 2**20,
            "then, two resyncs: objects written": total(later, 0),
            "then, two resyncs: drift rewrites (metrics)": own_writes(m_at, m)[1],
            "then, two resyncs: MiB written": total(later, 1) / 2**20,
        },
        "writes": wrote,
        "writes_after": later,
        "metrics": {k: by_label(m, f"aether_operator_{k}_writes_total", "outcome") for k in ("meshnode", "slice")},
    }


def flip(srv: Server, client: Any, op: Operator, ns_i: int, unready: bool, timeout: float) -> dict[str, Any]:
    """Endpoint p15 of ns<ns_i>/s3 turns unready (or ready): the time until its MeshServiceSlice shows it and the
    writes until then; then settled (two resyncs), the operator's own writes and its drift rewrites meanwhile."""
    ns, ip = f"ns{ns_i:04d}", pod_ip(ns_i, 15)
    body = {"endpoints": o.endpoint_slice(ns, "s3", EP_PORTS, endpoints(ns_i, 3, flipped=unready))["endpoints"]}
    before, m0 = srv.proxy.traffic(), scrape(op.metrics)
    t0 = time.perf_counter()
    send(client, ("PATCH", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/s3-1", body))

    def shown() -> bool:
        status, data = call(client, "GET", f"{MESH}/meshserviceslices/{ns}.0")
        ips = arm_ips(json.loads(data), f"{ns}/s3") if status == 200 else None
        return ips is not None and (ip not in ips) == unready and len(ips) == (4 if unready else 5)

    op.wait("the flip in its slice", shown, 120, 0.01)
    ms, until = (time.perf_counter() - t0) * 1000, writes(before, srv.proxy.traffic())
    own, drift = own_writes(m0, op.settle(timeout))
    print(f"  flip: {ms:.0f} ms; writes until shown {until}; then own writes {own - drift:.0f}, drift {drift:.0f}")
    return {"ms": ms, "until_shown": until, "own": own - drift, "drift": drift}


def flip_figures(runs: list[dict[str, Any]]) -> dict[str, float]:
    ms = sorted(r["ms"] for r in runs)
    return {
        "endpoint flip: ms until its slice shows it (median)": ms[len(ms) // 2],
        "endpoint flip: ms (max)": ms[-1],
        "endpoint flip: objects written until shown (max)": max(total(r["until_shown"], 0) for r in runs),
        "endpoint flip: KiB written until shown (max)": max(total(r["until_shown"], 1) for r in runs) / 1024,
        "endpoint flip: the operator's own writes, settled (max)": max(r["own"] for r in runs),
        "endpoint flip: drift rewrites meanwhile (max)": max(r["drift"] for r in runs),
    }


def measure(kind: str, args: Any, want: Any, workdir: Path) -> dict[str, Any]:
    with server(kind, workdir) as srv:
        print(f"{kind}: {srv.version}", flush=True)
        meter = Meter({**srv.pids, "bench": os.getpid()})
        client = client_for(srv.kubeconfig, args.threads)
        meter.mark("start")
        t0 = time.perf_counter()
        figures = load(client, stages(args.namespaces, args.nodes), args.threads)
        figures["load: s"] = time.perf_counter() - t0
        meter.mark("loaded")
        with operator(srv.proxy.kubeconfig_path, workdir) as op:
            meter.pids["operator"] = op.proc.pid
            result = converge(srv, client, op, want, args.timeout)
            meter.mark("converged")
            i = args.namespaces // 2
            runs = [flip(srv, client, op, i, n % 2 == 0, args.timeout) for n in range(args.flips)]
            meter.mark("changed")
        figures |= result.pop("figures") | flip_figures(runs) | meter.figures()
        return {"server": srv.version, "figures": figures, **result, "flips": runs}


def render(results: dict[str, dict[str, Any]]) -> str:
    kinds = list(results)
    two = len(kinds) == 2
    lines = [
        f"| figure | {' | '.join(kinds)} |{' real/emulated |' if two else ''}",
        "|---" * (len(kinds) + 1 + two) + "|",
    ]
    for key in dict.fromkeys(k for r in results.values() for k in r["figures"]):
        vals = [results[k]["figures"].get(key) for k in kinds]
        cells = ["-" if v is None else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}" for v in vals]
        if two:
            cells.append(f"{vals[0] / vals[1]:.2f}x" if vals[0] is not None and vals[1] else "-")
        lines.append(f"| {key} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.operator_apiserver")
    ap.add_argument("--namespaces", type=int, default=1000, help="10 Services and 50 pods each (default 1000)")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--control-plane", choices=("real", "emulated", "both"), default="both")
    ap.add_argument("--json", type=Path, help="write every figure and the writes by resource here")
    ap.add_argument("--threads", type=int, default=16, help="the loader's (default 16)")
    ap.add_argument("--flips", type=int, default=3, help="endpoint flips (unready, ready, ...; default 3)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for convergence (default 1800)")
    args = ap.parse_args(argv)
    if args.control_plane != "emulated" and not controlplane.available():
        print("the real control plane is not built: make k8s", file=sys.stderr)
        return 2
    want = expected(args.namespaces, args.nodes)
    print(f"cluster: {args.namespaces} namespaces, {args.nodes} nodes; {len(want[1])} MeshServiceSlices expected")
    results: dict[str, dict[str, Any]] = {}
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # so that the finally blocks stop what was started
    for kind in ["real", "emulated"] if args.control_plane == "both" else [args.control_plane]:
        workdir = Path(tempfile.mkdtemp(prefix=f"aether-bench-{kind}-"))
        try:
            results[kind] = measure(kind, args, want, workdir)
        except BaseException:
            for log in sorted(workdir.rglob("*.log")):
                tail = log.read_text(errors="replace").splitlines()[-15:]
                print(f"--- {log.name}:", *tail, sep="\n  ", file=sys.stderr)
            raise
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    print(render(results))
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, **results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
