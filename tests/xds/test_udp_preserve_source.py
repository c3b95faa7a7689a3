"""--udp-preserve-source through the real Envoy (one node): the backend sees the client pod's own address, the reply
still comes back from VIP:18082, and every datagram size still passes. Negative control: without the node return
path (aether.netns.node_return) nothing comes back at all: the replies go to the pod, which is not talking to the
backend. Across nodes: tests/e2e/test_e2e_udp_preserve_source.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from aether.netns import node_return
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.testing.netlab import Lab, Pod
from aether.testing.nodebed import NodeBed
from aether.testing.udp_clients import add_app_backend, exchange, socat_echo_argv, socat_peer_argv
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

WHO_VIP, ECHO_VIP = "10.96.9.1", "10.96.9.2"
PORT = 7000


@dataclass
class Bed:
    node: NodeBed
    client: Pod


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    lab = Lab()
    try:
        nb = NodeBed(lab, tmp_path_factory.mktemp("udp-src"), sidecar_args=["--udp-preserve-source"])
        client = nb.add_client("client-0")
        add_app_backend(nb, "who", WHO_VIP, "10.202.4.2", PORT, socat_peer_argv("10.202.4.2", PORT))
        add_app_backend(nb, "echo", ECHO_VIP, "10.202.4.3", PORT, socat_echo_argv("10.202.4.3", PORT))
        node_return.install(nb.node.path)
        nb.write_state(nb.meshnode())
        nb.start_sidecar()
        nb.start_envoy()
        nb.wait_programmed()
        nb.wait_listeners(1)
        bed = Bed(nb, client)
        wait_for(lambda: _ask(bed, WHO_VIP, b"up"), what="the who backend through the mesh")
        yield bed
    finally:
        lab.close()


def _ask(bed: Bed, vip: str, payload: bytes) -> tuple[bytes, tuple[str, int]] | None:
    return exchange(bed.client.path, vip, L4_OUTBOUND_PORT, payload)


def test_backend_sees_the_client_pod_and_the_reply_comes_from_the_vip(bed: Bed) -> None:
    got = wait_for(partial(_ask, bed, WHO_VIP, b"who am i"), what="an answer from the who backend")
    assert got == (f"{bed.client.ip}\n".encode(), (WHO_VIP, L4_OUTBOUND_PORT)), got


def test_every_size_still_passes(bed: Bed) -> None:
    for size in (64, 1452, 1453, 9000, 65507):
        payload = os.urandom(size)
        got = _ask(bed, ECHO_VIP, payload)
        assert got is not None and got[0] == payload, f"{size} B"


def test_negative_control_without_the_node_return_path_nothing_comes_back(bed: Bed) -> None:
    """Seen red: the replies are addressed to the client pod and routed to it, bypassing Envoy's session."""
    node_return.remove(bed.node.node.path)
    try:
        assert _ask(bed, WHO_VIP, b"again") is None
    finally:
        node_return.install(bed.node.node.path)
    assert wait_for(lambda: _ask(bed, WHO_VIP, b"back"), what="replies again with the return path")


def test_envoy_config_and_docs_name_the_option() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    assert "--udp-preserve-source" in doc and "aether node-return install" in doc
