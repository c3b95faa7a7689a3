"""The real control plane as a user meets it: `aether dev-api --control-plane real`, then kubectl and the operator.
The server reports the pinned version, allocates ClusterIPs, and its EndpointSlice controller (not the test) writes
the slice that the operator turns into an arm."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest

from aether.testing.apiserver import Kind, api_server
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, InProcessOperator, unique
from aether.testing.commands import command
from aether.testing.controlplane import SERVICE_CIDR
from aether.testing.controlplane.binaries import repository_root, tool
from aether.testing.wait import wait_for

CONTROLLER_MANAGED = "endpointslice-controller.k8s.io"


def pinned_version() -> str:
    text = (repository_root() / "k8s" / "go.mod").read_text()
    found = re.search(r"^require k8s\.io/kubernetes (v\S+)$", text, re.M)
    assert found, "k8s/go.mod pins no k8s.io/kubernetes"
    return found.group(1)


@pytest.fixture(scope="module")
def dev_api(api_kind: Kind, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if api_kind != "real":
        pytest.skip("AETHER_CONTROL_PLANE=emulated: this module is about the real control plane")
    kubeconfig = tmp_path_factory.mktemp("devapi") / "kubeconfig"
    proc = subprocess.Popen(
        [*command(), "dev-api", "--control-plane", "real", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving https://127.0.0.1:" in line, line + proc.stdout.read()
        yield kubeconfig
    finally:
        proc.terminate()
        proc.wait(60)


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    out = subprocess.run(
        [tool("kubectl"), "--kubeconfig", str(kubeconfig), *args], input=stdin, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_kubectl_version_reports_the_pinned_server(dev_api: Path) -> None:
    version = json.loads(kubectl(dev_api, "version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == pinned_version()
    assert version["clientVersion"]["gitVersion"] == pinned_version()


def test_the_controller_writes_the_slice_the_operator_turns_into_an_arm(dev_api: Path) -> None:
    k = Cluster(str(dev_api), None)
    ns, node = unique("cp"), unique("node")
    k.apply(o.namespace(ns))
    k.apply(o.node(node))
    k.apply(o.pod(ns, "client", node, "client"), status=o.pod_status("10.44.0.2"))
    backend = {**o.pod(ns, "dns-0", node), "metadata": {"name": "dns-0", "namespace": ns, "labels": {"app": "dns"}}}
    k.apply(backend, status=o.pod_status("10.44.0.5"))
    svc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "dns", "namespace": ns},
        "spec": {
            "selector": {"app": "dns"},
            "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}],
        },
    }
    created = k.apply(svc).to_dict()
    vip = created["spec"]["clusterIP"]
    assert ip_address(vip) in ip_network(SERVICE_CIDR), f"{vip} is not from the service CIDR {SERVICE_CIDR}"

    def controller_slice() -> dict[str, Any] | None:
        items = json.loads(kubectl(dev_api, "-n", ns, "get", "endpointslices", "-o", "json"))["items"]
        for s in items:
            labels = s["metadata"].get("labels") or {}
            ready = [e for e in s.get("endpoints") or [] if (e.get("conditions") or {}).get("ready")]
            if labels.get("endpointslice.kubernetes.io/managed-by") == CONTROLLER_MANAGED and ready:
                return dict(s)
        return None

    es = wait_for(controller_slice, what="the EndpointSlice controller's slice for the ready pod")
    assert [e["addresses"] for e in es["endpoints"]] == [["10.44.0.5"]]
    assert es["endpoints"][0]["targetRef"]["name"] == "dns-0"
    op = InProcessOperator(str(dev_api))
    op.start()
    try:
        arm = wait_for(lambda: k.arm(node, f"{ns}/dns"), what="the operator's arm", ignore=READ_ERRORS)
        assert arm["vip"] == vip and arm["endpoints"] == [{"ip": "10.44.0.5", "port": 5353}]
        assert k.slices(), "the arm lives in a MeshServiceSlice"
    finally:
        op.stop()


def upstream_refused_routes(ns: str) -> list[dict[str, Any]]:
    """UDPRoutes that upstream Gateway API v1.6.1's CEL rules refuse: a Service backendRef without a port, and two
    parentRefs to one Service naming neither sectionName nor port."""
    no_port = o.udproute(ns, "no-port", "dns", [{"name": "dns"}], version="v1")
    twice = o.udproute(ns, "twice", "dns", [o.backend("dns", 53)], version="v1")
    twice["spec"]["parentRefs"] = [{"group": "", "kind": "Service", "name": "dns"}] * 2
    return [no_port, twice]


CEL_MESSAGES = ("Must have port for Service reference", "sectionName or port must be unique")


@pytest.mark.parametrize("kind", ["real", "emulated"])
def test_upstream_cel_refuses_what_the_emulator_stored(kind: Kind, api_kind: Kind) -> None:
    """Red first: the emulator (no CEL) stores both routes; the real server refuses each with upstream's message.
    (`api_kind`: the real control plane must be built.)"""
    with api_server(kind, channel="experimental") as server:
        ns = unique("cel")
        k = Cluster(server.kubeconfig, None)
        k.apply(o.namespace(ns))
        for route, message in zip(upstream_refused_routes(ns), CEL_MESSAGES, strict=True):
            out = subprocess.run(
                [tool("kubectl"), "--kubeconfig", server.kubeconfig, "create", "--validate=false", "-f", "-"],
                input=json.dumps(route),
                capture_output=True,
                text=True,
            )
            if kind == "real":
                assert out.returncode != 0 and message in out.stderr, out.stdout + out.stderr
            else:
                assert out.returncode == 0, out.stderr
