"""What docs/operations.md tells a user about where a node's tables live, run as written with the pinned kubectl on
the real control plane (kube-apiserver 1.35.4), the operator in-process:

- the command that lists the nodes using a MeshServiceSlice (a slice does not list its readers; each MeshNode
  names the slices it reads in status.serviceSlices.names) answers exactly the nodes whose dependency set holds the
  slice's namespace;
- a MeshNode has no `udp` or `tcp` any more: `kubectl explain` says the field does not exist, and the old query
  prints nothing, while the arms are in the slices."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from aether.api.meshnode import API_GROUP
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import READ_ERRORS, Cluster, unique
from aether.testing.controlplane import available
from aether.testing.controlplane.binaries import tool
from aether.testing.wait import wait_for

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def documented_readers_command() -> str:
    """The one line of docs/operations.md that lists the nodes using slice shop.0."""
    (line,) = [ln for ln in OPERATIONS.read_text().splitlines() if "serviceSlices.names[*]" in ln]
    assert line.startswith("kubectl get mn ") and "s=shop.0" in line, line
    return line


def kubectl(k: Cluster, line: str) -> subprocess.CompletedProcess[str]:
    """A documented `kubectl ...` line (a shell pipeline) with the pinned kubectl on this cluster's kubeconfig."""
    argv0 = f"{tool('kubectl')} --kubeconfig {k.kubeconfig}"
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", re.sub(r"^kubectl ", argv0 + " ", line)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def world(cluster: Cluster) -> tuple[Cluster, dict[str, str]]:
    """Two mesh namespaces: `wide` (default egress: its pods' nodes read every mesh namespace) on node-w, `narrow`
    (egress: itself only) on node-n. -> the cluster and {role: name}."""
    if not available():
        pytest.skip("the pinned kubectl comes with the control plane (make k8s)")
    names = {"wide": unique("wide"), "narrow": unique("narrow"), "node-w": unique("nw"), "node-n": unique("nn")}
    cluster.apply(o.namespace(names["wide"]))
    cluster.apply(o.namespace(names["narrow"], egress=names["narrow"]))
    for role, ns, ip in (("node-w", "wide", "10.81.0.2"), ("node-n", "narrow", "10.81.0.3")):
        cluster.apply(o.node(names[role]))
        cluster.apply(o.pod(names[ns], "client", names[role]), status=o.pod_status(ip))
        cluster.apply(o.service(names[ns], "dns", None, [("dns", 53, "UDP")]))
    for role in ("node-w", "node-n"):

        def sliced(node: str = names[role]) -> list[str]:
            found: list[str] = (cluster.meshnode(node) or {})["status"]["serviceSlices"]["names"]
            return found

        wait_for(sliced, what=f"{role}'s slices", ignore=READ_ERRORS)
    return cluster, names


def readers(k: Cluster, slice_name: str) -> set[str]:
    line = documented_readers_command().replace("s=shop.0", f"s={slice_name}")
    proc = kubectl(k, line)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def test_the_documented_command_names_the_nodes_reading_a_slice(world: tuple[Cluster, dict[str, str]]) -> None:
    k, n = world
    # node-w reads every mesh namespace (other tests' namespaces too); node-n its own only
    wait_for(lambda: readers(k, f"{n['wide']}.0") >= {n["node-w"]}, what="wide's readers")
    assert n["node-n"] not in readers(k, f"{n['wide']}.0")
    assert readers(k, f"{n['narrow']}.0") >= {n["node-w"], n["node-n"]}
    assert readers(k, "no-such-namespace.0") == set()


def test_a_meshnode_has_no_udp_or_tcp_and_the_arms_are_in_the_slices(world: tuple[Cluster, dict[str, str]]) -> None:
    k, n = world
    explain = kubectl(k, f"kubectl explain meshnodes.status.udp --api-version={API_GROUP}/v1alpha1")
    assert explain.returncode != 0 and 'field "udp" does not exist' in explain.stderr, explain
    old = kubectl(k, f"kubectl get mn {n['node-w']} -o jsonpath='{{.status.udp.services}}'")
    assert (old.returncode, old.stdout) == (0, ""), old
    stored = k.meshnode(n["node-w"]) or {}
    assert not {"udp", "tcp"} & set(stored["status"]), stored["status"]
    arms = kubectl(
        k,
        f"kubectl get mss -l mesh.aether.dev/namespace={n['wide']} -o jsonpath='{{.items[*].spec.udp.services[*].service}}'",
    )
    assert arms.stdout.split() == [f"{n['wide']}/dns"], arms
