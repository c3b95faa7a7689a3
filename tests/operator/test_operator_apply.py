"""MeshNode status is written by server-side apply, one field manager per writer: the operator's fields and the
sidecar's (its condition types, the QUIC pairs) are each owned by their writer, so a write racing another writer's
or a user's edit of the object needs no re-read and no retry, and neither writer undoes the other's fields.

Red first (the negative control in the first test): the write this replaced, a merge patch carrying the
resourceVersion it was computed from, gets 409 Conflict after the same user edit (what the hand-written
conflict-retry loops were for)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from aether.api.client import OPERATOR_USER_AGENT, api_client
from aether.api.meshnode import API_GROUP, API_VERSION, PLURAL, Condition, MeshNodeStatus, QuicPair
from aether.operator.kubeapi import MERGE, KubeWriter
from aether.operator.nodestatus import owned_wire
from aether.operator.writes import Refusals, write_node
from aether.testing.apiserver import Kind, api_server
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.harness import Cluster, unique
from aether.testing.apitestbed.server import AuditRecord
from aether.testing.controlplane import ControlPlane
from aether.testing.wait import wait_for
from aether.xds.sidecar.kube_source import KubeStatusSink

SERVERS: dict[str, ControlPlane] = {}


@pytest.fixture(scope="module")
def kubeconfig(api_kind: Kind) -> Iterator[str]:
    if api_kind != "real":
        pytest.skip("server-side apply and its field ownership are the real server's (the emulator approximates them)")
    with api_server("real") as server:
        assert server.control_plane is not None
        SERVERS[server.kubeconfig] = server.control_plane
        yield server.kubeconfig


def server_audit(kubeconfig: str) -> list[AuditRecord]:
    """The API server's audit log: what reached it, with the response codes."""
    return wait_for(lambda: SERVERS[kubeconfig].audit, what="the audit log")


def owned(ready: str, reason: str) -> dict[str, Any]:
    return owned_wire(MeshNodeStatus(conditions=[Condition(type="Ready", status=ready, reason=reason)]))


def conditions(k: Cluster, node: str) -> dict[str, dict[str, Any]]:
    status = (k.meshnode(node) or {}).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


def writes(k: Cluster, node: str) -> tuple[KubeWriter, str]:
    k.apply(o.node(node))
    uid = (k.get("v1", "Node", node) or {})["metadata"]["uid"]
    return KubeWriter(api_client(k.kubeconfig, OPERATOR_USER_AGENT)), uid


def test_a_status_write_racing_a_user_edit_needs_no_retry(kubeconfig: str) -> None:
    k, node = Cluster(kubeconfig, None), unique("apply")
    writer, uid = writes(k, node)
    assert write_node(writer, Refusals(), node, owned("True", "Reconciled"), None, uid) == "patched"
    stale = k.meshnode(node)
    assert stale is not None
    # a user's edit of the object between the operator's read and its write (a label here: any write moves the
    # resourceVersion)
    res = k.res(f"{API_GROUP}/{API_VERSION}", "MeshNode")
    res.patch(body={"metadata": {"labels": {"team": "net"}}}, name=node, content_type=MERGE)
    # the negative control: the old write, a merge patch carrying the resourceVersion read, is a 409
    old_patch = {"metadata": {"resourceVersion": stale["metadata"]["resourceVersion"]}, "status": {"pods": []}}
    with pytest.raises(ApiException) as conflict:
        writer.custom.patch_cluster_custom_object_status(
            API_GROUP, API_VERSION, PLURAL, node, old_patch, _content_type=MERGE
        )
    assert conflict.value.status == 409
    # the apply computed from the same stale copy lands at once: one request, no re-read
    since = len(server_audit(kubeconfig))
    assert write_node(writer, Refusals(), node, owned("False", "Degraded"), stale, uid) == "patched"
    ours = [(r.verb, r.subresource, r.code) for r in server_audit(kubeconfig)[since:] if r.name == node]
    assert ours == [("patch", "status", 200)], ours
    after = k.meshnode(node) or {}
    assert conditions(k, node)["Ready"]["status"] == "False"
    assert after["metadata"]["labels"]["team"] == "net"
    managers = {(m["manager"], m["operation"]) for m in after["metadata"]["managedFields"]}
    assert ("aether-operator", "Apply") in managers


def test_the_operator_and_the_sidecar_own_their_own_fields(kubeconfig: str) -> None:
    k, node = Cluster(kubeconfig, None), unique("apply")
    writer, uid = writes(k, node)
    write_node(writer, Refusals(), node, owned("True", "Reconciled"), None, uid)
    sink = KubeStatusSink(node, kubeconfig)
    sink.publish(node, [Condition(type="Programmed", status="True", reason="Accepted")])
    pair = QuicPair(
        source="spiffe://cluster.local/ns/a/sa/c",
        destination="a/web",
        twin="quic:a/web@c",
        since="2026-12-01T00:00:00Z",
        evidence="Fetch",
    )
    sink.publish_pairs(node, [pair], [])
    stale = k.meshnode(node)
    # the operator's next write, from a copy read before the sidecar's: the sidecar's fields stay
    write_node(writer, Refusals(), node, owned("False", "Degraded"), stale, uid)
    status = (k.meshnode(node) or {})["status"]
    assert {t: c["status"] for t, c in conditions(k, node).items()} == {"Ready": "False", "Programmed": "True"}
    assert [p["twin"] for p in status["quic"]["pairs"]] == ["quic:a/web@c"] and status["quic"]["pairCount"] == 1
    # the sidecar's next write of one condition type leaves the operator's and its other writer's alone
    sink.publish(node, [Condition(type="PairsPersisted", status="True", reason="Written")])
    assert set(conditions(k, node)) == {"Ready", "Programmed", "PairsPersisted"}
    sink.publish_pairs(node, [], [])
    status = (k.meshnode(node) or {})["status"]
    assert status["quic"]["pairs"] == [] and status["quic"]["pairCount"] == 0
    assert set(conditions(k, node)) == {"Ready", "Programmed", "PairsPersisted"}
