"""The gateway role as the operator gives it (`status.gateway` on a MeshNode, from the Node label
mesh.aether.dev/east-west-gateway=true): the node's proxy plays the east-west gateway on that address and exports
only the QUIC destinations a ServiceExport names (`exported`), through `aether.xds.translate.compose`; without the
role, `--east-west-gateway` keeps exporting every local destination (tests/xds/test_gateway_tcp.py)."""

from __future__ import annotations

from aether.api.meshnode import GatewayRole, MeshNode
from aether.netns.records import PodRecord
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.xds.resources import LISTENER, Resources, TranslateOptions
from aether.xds.translate.compose import translate
from aether.xds.translate.eastwest import gateway

OPTS = TranslateOptions(mesh_domain="mesh.example", trust_domain="cluster.local")
GW = "10.199.0.2"


def node_with(exported: tuple[str, ...], role: str | None) -> tuple[MeshNode, dict[str, PodRecord]]:
    node, records = sample_node(
        "gw-node",
        [SamplePod("u-web", "web-0", "10.200.2.7", "web-sa", "/run/netns/sample-web")],
        [
            SampleDestination("default/web", "web-sa", (8080,), ("10.200.2.7",)),
            SampleDestination("default/db", "db", (5432,), ("10.200.3.4",)),
        ],
    )
    for d in node.status.quic.destinations:
        d.exported = d.service in exported
    node.status.gateway = GatewayRole(address=role) if role else None
    return node, records


def chains(res: Resources) -> list[list[str]] | None:
    lst = res[LISTENER].get(gateway.LISTENER_NAME)
    return None if lst is None else [c["filterChainMatch"]["serverNames"] for c in lst["filterChains"]]


def test_the_role_exports_only_what_a_service_export_names() -> None:
    node, records = node_with(("default/web",), GW)
    res = translate(node, records, OPTS)
    assert res[LISTENER][gateway.LISTENER_NAME]["address"]["socketAddress"]["address"] == GW
    assert chains(res) == [["8080.web-sa.default.mesh.example"]]
    # --east-west-gateway names the address when given; the exported set is still the ServiceExports'
    res = translate(node, records, TranslateOptions(mesh_domain="mesh.example", east_west_gateway="10.199.0.9"))
    assert res[LISTENER][gateway.LISTENER_NAME]["address"]["socketAddress"]["address"] == "10.199.0.9"
    assert chains(res) == [["8080.web-sa.default.mesh.example"]]


def test_the_role_with_nothing_exported_is_no_listener_and_no_role_is_no_gateway() -> None:
    node, records = node_with((), GW)
    assert chains(translate(node, records, OPTS)) is None
    node, records = node_with(("default/web",), None)  # exported, but this node was not given the role
    assert chains(translate(node, records, OPTS)) is None
