"""How MeshAuthorizationPolicies reach the sidecar: a state file's `kind: List` (file mode, `aether xds render`), the
cluster's policies read-only (cluster mode, `aether.xds.sidecar.kube_policies`, on the real control plane;
`AETHER_CONTROL_PLANE=emulated` on the API test bed), and the sidecar serving nothing in cluster mode before the
first list (a guarded Service is never served open)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from aether.api.meshnode import MeshNodeFileError
from aether.api.statefile import load_state_file, split_items
from aether.testing.apiserver import Kind, Server, api_server
from aether.testing.apitestbed import AuditRecord
from aether.testing.apitestbed.harness import Cluster
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.wait import wait_for
from aether.xds.ads.cache import SnapshotCache
from aether.xds.resources import ROUTE, TranslateOptions
from aether.xds.sidecar.kube_policies import PolicyWatch
from aether.xds.sidecar.loop import Sidecar
from aether.xds.sidecar.sources import FileSource

TD = "cluster.local"
CLIENT = f"spiffe://{TD}/ns/default/sa/client"
ROUTE_8080 = "inbound:default/web-0:8080"


def policy(name: str = "web-callers", sources: Sequence[str] = (CLIENT,)) -> dict[str, Any]:
    return {
        "apiVersion": "mesh.aether.dev/v1alpha1",
        "kind": "MeshAuthorizationPolicy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"targetRefs": [{"kind": "Service", "name": "web"}], "rules": [{"from": list(sources)}]},
    }


def node_and_records(netns: str = "/run/netns/web") -> tuple[Any, Any]:
    return sample_node(
        "node-b",
        [SamplePod("u-web", "web-0", "10.200.2.7", "web-sa", netns)],
        [SampleDestination("default/web", "web-sa", (8080,), ("10.200.2.7",))],
    )


def state_list(*policies: dict[str, Any]) -> dict[str, Any]:
    node, _ = node_and_records()
    return {"apiVersion": "v1", "kind": "List", "items": [node.wire(), *policies]}


def rules_in(resources: dict[str, Any]) -> list[str] | None:
    """The policies the 8080 route's RBAC allows by (its matchers' action names); None: no policy guards it."""
    route = resources[ROUTE][ROUTE_8080]["virtualHosts"][0]["routes"][0]
    per = route.get("typedPerFilterConfig", {}).get("envoy.filters.http.rbac")
    if per is None:
        return None
    matchers = per["rbac"]["matcher"].get("matcherList", {}).get("matchers", [])
    return [m["onMatch"]["action"]["name"] for m in matchers]


# -- the state file ---------------------------------------------------------------------------------------------
def test_a_state_list_holds_one_meshnode_and_policies(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    path.write_text(yaml.safe_dump(state_list(policy())))
    node, others = load_state_file(path)
    assert node.metadata.name == "node-b"
    assert [p["metadata"]["name"] for p in others["MeshAuthorizationPolicy"]] == ["web-callers"]
    plain = tmp_path / "node.json"
    plain.write_text(json.dumps(node.wire()))
    assert load_state_file(plain)[1] == {}  # a bare MeshNode still is a state file


@pytest.mark.parametrize(
    ("items", "needle"),
    [([], "exactly one MeshNode, found 0"), ([{"metadata": {}}], "items[0]: not an object with a kind")],
)
def test_a_bad_list_names_the_problem(items: list[Any], needle: str) -> None:
    with pytest.raises(MeshNodeFileError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        split_items({"kind": "List", "items": items}, "f.yaml")


def test_render_compiles_the_lists_policies(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    records = tmp_path / "records"
    records.mkdir()
    (records / "u-web.json").write_text(
        json.dumps(
            {"uid": "u-web", "namespace": "default", "name": "web-0", "netns": "/run/netns/web", "ips": ["10.200.2.7"]}
        )
    )
    path.write_text(json.dumps(state_list(policy(), policy("broken", ["*"]))))
    out = subprocess.run(
        [sys.executable, "-m", "aether.cli", "xds", "render", "--state", str(path), "--records", str(records)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    rendered = {"type.googleapis.com/envoy.config.route.v3.RouteConfiguration": json.loads(out.stdout)[ROUTE]}
    rules = rules_in({ROUTE: rendered[ROUTE]})
    assert rules == ["default/web-callers"]  # the broken one adds nothing (it fails closed)
    assert "MeshAuthorizationPolicy default/broken is not accepted: it allows nothing on web" in out.stderr


def test_file_source_carries_the_policies(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    path.write_text(yaml.safe_dump(state_list(policy())))
    stop = threading.Event()
    update = next(iter(FileSource(path).updates(stop)))
    stop.set()
    assert update.node is not None and update.policies is not None
    assert [p["metadata"]["name"] for p in update.policies] == ["web-callers"]


# -- the sidecar --------------------------------------------------------------------------------------------------
def test_the_sidecar_serves_a_policy_change_as_a_route_change() -> None:
    cache = SnapshotCache()
    sc = Sidecar("node-b", cache, options=TranslateOptions(trust_domain=TD), path_exists=lambda _: True)
    node, records = node_and_records()
    sc.on_records(records)
    sc.on_state(node, policies=[])
    before = cache.get("node-b")
    assert before is not None and rules_in(before.resources) is None
    sc.on_policies([policy()])
    after = cache.get("node-b")
    assert after is not None and after.version != before.version
    assert rules_in(after.resources) == ["default/web-callers"]
    sc.on_policies([policy()])  # the same policies again: nothing new
    assert cache.get("node-b") is after


def test_cluster_mode_serves_nothing_before_the_first_policy_list() -> None:
    cache = SnapshotCache()
    sc = Sidecar("node-b", cache, options=TranslateOptions(trust_domain=TD), path_exists=lambda _: True)
    sc.awaiting_policies = True
    node, records = node_and_records()
    sc.on_records(records)
    sc.on_state(node)
    assert cache.get("node-b") is None
    assert sc.condition is not None and "waiting for the first list" in sc.condition.message
    sc.on_policies([policy()])
    served = cache.get("node-b")
    assert served is not None and rules_in(served.resources) is not None


# -- cluster mode: the policies from the API, read-only ----------------------------------------------------------------
@pytest.fixture(scope="module")
def server(api_kind: Kind) -> Iterator[Server]:
    with api_server(api_kind) as started:
        yield started


def audit(server: Server) -> list[AuditRecord]:
    """The API server's own record of every request (kube-apiserver's audit log; the test bed's request log)."""
    if server.control_plane is not None:
        return server.control_plane.audit
    assert server.bed is not None
    return server.bed.audit


def test_the_watch_hands_over_every_change(server: Server) -> None:
    seen: list[list[str]] = []
    watch = PolicyWatch(lambda ps: seen.append([p["metadata"]["name"] for p in ps]), server.kubeconfig, 2)
    stop = threading.Event()
    t = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    t.start()
    try:
        wait_for(lambda: seen and seen[-1] == [], 10, "the first (empty) list")
        cluster = Cluster(server.kubeconfig, server.faults)
        cluster.apply(policy())
        wait_for(lambda: seen[-1] == ["web-callers"], 10, "the created policy")
        cluster.apply(policy("second"))
        wait_for(lambda: seen[-1] == ["second", "web-callers"], 10, "both")
        cluster.delete("mesh.aether.dev/v1alpha1", "MeshAuthorizationPolicy", "web-callers", "default")
        wait_for(lambda: seen[-1] == ["second"], 10, "the deletion")
    finally:
        stop.set()
        t.join(timeout=5)
    assert not t.is_alive()

    def sidecar_requests() -> list[AuditRecord]:
        return [
            r
            for r in audit(server)
            if r.resource == "meshauthorizationpolicies" and r.user_agent.startswith("aether-xds")
        ]

    def verbs() -> set[str]:
        return {r.verb for r in sidecar_requests()}

    # the real server audits a watch when it ends (the emulator when it starts): wait for the last one's record
    wait_for(lambda: verbs() >= {"list", "watch"}, 10, "the sidecar's list and watch in the audit")
    assert verbs() <= {"list", "watch"}, verbs()  # read-only
