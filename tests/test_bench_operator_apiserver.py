"""bench/operator_apiserver's pure helpers: the requests it loads are synthetic_cluster.build's cluster (fed to the
operator's model they give the same MeshNodes and slices, the VIPs moved from 10.96 to 10.100), the convergence
check it reads from the MeshNode Table, and what it reads from /proc and from the fault proxy's counters."""

from __future__ import annotations

import copy
import json
from typing import Any

from aether.operator.reconcile.model import ClusterModel
from aether.testing.benchload import load_bench
from aether.testing.controlplane.faultproxy import Tally
from aether.testing.synthetic_cluster import build

bench = load_bench("operator_apiserver")  # bench/ by its path (aether.testing.benchload says why)
arm_ips, endpoints, expected, proc_figures = bench.arm_ips, bench.endpoints, bench.expected, bench.proc_figures
progress, stages, writes = bench.progress, bench.stages, bench.writes

KINDS = {"nodes": "node", "namespaces": "namespace", "services": "service", "endpointslices": "slice"}
KINDS |= {"udproutes": "route", "pods": "pod"}


def model_of(n_ns: int, nodes: int) -> ClusterModel:
    """The bench's requests applied as the API would store them (uids as build() gives them, pod status merged)."""
    objs: dict[tuple[str, str, str], dict[str, Any]] = {}
    for _label, reqs in stages(n_ns, nodes):
        for method, path, body in reqs:
            parts = path.strip("/").split("/")
            if method == "PATCH":  # .../namespaces/<ns>/pods/<name>/status
                objs[("pods", parts[3], parts[5])].update(copy.deepcopy(body))
                continue
            plural, ns = parts[-1], parts[parts.index("namespaces") + 1] if "namespaces" in parts[:-1] else ""
            obj = copy.deepcopy(body)
            name = obj["metadata"]["name"]
            if plural == "nodes":
                obj["metadata"]["uid"] = f"u{int(name[4:])}"
            if plural == "pods":
                obj["metadata"]["uid"] = f"{ns}-{name}"
            if plural == "udproutes":
                obj["metadata"].update({"generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"})
            objs[(plural, ns, name)] = obj
    m = ClusterModel()
    for (plural, _ns, _name), obj in objs.items():
        if plural in KINDS:
            m.apply_raw(KINDS[plural], obj)  # type: ignore[arg-type]
    return m


def test_the_requests_are_synthetic_clusters_cluster() -> None:
    ours = model_of(3, 30).reconcile()
    theirs = build(3, 30, scoped=False)[0].reconcile()
    assert set(ours.desired) == set(theirs.desired) and len(ours.desired) == 30
    assert set(ours.slices) == set(theirs.slices) == {"ns0000.0", "ns0001.0", "ns0002.0"}
    for name, spec in ours.slices.items():
        assert json.loads(json.dumps(spec).replace('"10.100.', '"10.96.')) == theirs.slices[name]
    for name, desired in ours.desired.items():
        assert desired.owned["summary"] == theirs.desired[name].owned["summary"]
        assert desired.owned["pods"] == theirs.desired[name].owned["pods"]


def test_the_stages_come_in_dependency_order() -> None:
    plan = dict(stages(2, 20))
    assert list(plan) == [
        "Nodes, Namespaces",
        "ServiceAccounts",
        "Services, EndpointSlices, UDPRoutes, Pods",
        "Pod status",
    ]
    assert len(plan["ServiceAccounts"]) == 4 and len(plan["Pod status"]) == 100
    accounts = {(p.split("/")[4], b["metadata"]["name"]) for _, p, b in plan["ServiceAccounts"]}
    pods = [b for _, p, b in plan["Services, EndpointSlices, UDPRoutes, Pods"] if p.endswith("/pods")]
    assert {(b["metadata"]["namespace"], b["spec"]["serviceAccountName"]) for b in pods} <= accounts
    services = [b for _, p, b in plan["Services, EndpointSlices, UDPRoutes, Pods"] if p.endswith("/services")]
    assert all(b["spec"]["clusterIP"].startswith("10.100.") for b in services)  # inside 10.96.0.0/12, not 10.96.0.1


def test_a_flip_turns_one_endpoint_unready() -> None:
    assert [ready for _, ready, _ in endpoints(7, 3, flipped=True)] == [False, True, True, True, True]
    assert endpoints(7, 3)[0] == ("10.0.7.16", True, "p15")


def test_progress_counts_meshnodes_ready_as_computed() -> None:
    want, slices = expected(2, 20)
    assert slices == {"ns0000.0", "ns0001.0"}
    rows = [{"Name": n, "Pods": pods, "Slices": s, "Ready": "True"} for n, (pods, s) in want.items()]
    assert progress(rows, want) == 20
    rows[0]["Ready"] = "False"
    rows[1]["Pods"] = -1
    assert progress(rows[:-1], want) == 17  # one not Ready, one short of a pod, one missing


def test_arm_ips() -> None:
    spec = {"udp": {"services": [{"service": "a/s3", "endpoints": [{"ip": "10.0.0.1", "port": 53}]}]}}
    assert arm_ips({"spec": spec}, "a/s3") == {"10.0.0.1"}
    assert arm_ips({"spec": spec}, "a/s4") is None


def test_proc_figures() -> None:
    stat = "4242 (kube apiserver) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 9 1 2"
    status = "Name:\tkube-apiserver\nVmPeak:\t 9000 kB\nVmHWM:\t  524288 kB\nVmRSS:\t 1000 kB\n"
    assert proc_figures(stat, status, clk_tck=100) == (3.0, 512.0)


def test_writes_between_snapshots() -> None:
    before = {("patch", "meshserviceslices", ""): Tally(2, 100, 10), ("list", "pods", ""): Tally(1, 0, 5000)}
    after = {
        ("patch", "meshserviceslices", ""): Tally(3, 160, 20),
        ("list", "pods", ""): Tally(2, 0, 9000),
        ("patch", "meshnodes", "status"): Tally(1, 700, 900),
    }
    assert writes(before, after) == {"patch meshserviceslices": [1, 60], "patch meshnodes/status": [1, 700]}
