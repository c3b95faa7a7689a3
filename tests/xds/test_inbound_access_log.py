"""The inbound's JSON access log on Envoy's stdout, real Envoy and real requests (the rig: `aether.testing.quic_mesh`,
whose Envoys write stdout and stderr to one log file): one object per request with the verified source SPIFFE ID,
the Service asked for, the pod and port reached, the protocol (HTTP/3 on a twin, HTTP/2 without) and the status.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from aether.testing.envoy import Envoy
from aether.testing.quic_mesh import CLIENT, HOST, OTHER, TWIN, Mesh, quic_mesh
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with quic_mesh(tmp_path_factory.mktemp("accesslog")) as m:
        yield m


def json_lines(node: Envoy) -> list[dict[str, Any]]:
    out = []
    for line in node.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"aether-inbound"' in line:
            out.append(json.loads(line))
    return out


def _wait_lines(node: Envoy, n: int) -> list[dict[str, Any]]:
    def enough() -> list[dict[str, Any]] | None:
        lines = json_lines(node)
        return lines if len(lines) >= n else None

    return wait_for(enough, 10, f"{n} JSON log lines in {node.node_id}'s stdout")


def test_each_request_is_one_json_line_with_source_service_protocol_status(mesh: Mesh) -> None:
    mesh.until_200(mesh.client)
    before = len(json_lines(mesh.b))
    assert [s for s, _ in mesh.get(mesh.client, n=2) + mesh.get(mesh.other, n=1)] == [200, 200, 200]
    lines = _wait_lines(mesh.b, before + 3)[before:]
    want = {"destinationService": HOST, "destinationPod": "default/web-0", "appPort": 8080, "status": 200}
    for line, source in zip(lines, (CLIENT, CLIENT, OTHER), strict=True):
        assert {k: line[k] for k in want} == want, line
        assert (line["source"], line["protocol"]) == (source, "HTTP/3"), line
        assert line["sni"] == "8080.web-sa.default.mesh.example" and line["peerSerial"], line
    assert json_lines(mesh.a) == []  # only inbounds log this way: node A has no local destination
    try:
        mesh.serve_a(mesh.resources_a(quic=False))
        wait_for(lambda: TWIN not in mesh.a.admin("/clusters"), 30, "twins gone")
        mesh.until_200(mesh.client)
        last = _wait_lines(mesh.b, before + 4)[-1]
        assert (last["source"], last["protocol"], last["status"]) == (CLIENT, "HTTP/2", 200), last
    finally:
        mesh.serve_a()
        mesh.wait_applied(mesh.a, TWIN)
