"""The sidecar with every area on (the default): Envoy takes the east-west listeners too, because the sidecar
serves the SDS secrets they reference, and per-service UDP keeps working beside them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aether.testing.netlab import Lab
from aether.testing.nodebed import NodeBed, ask, udp_socket_in, wait_reply
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeBed]:
    lab = Lab()
    try:
        tb = NodeBed(lab, tmp_path_factory.mktemp("xds-all"), areas="")
        tb.add_client("client-0")
        tb.add_service("alpha", "10.96.8.1")
        tb.add_service("bravo", "10.96.8.2")
        tb.write_state(tb.meshnode())
        tb.start_sidecar()
        tb.start_envoy()
        yield tb
    finally:
        lab.close()


def test_every_listener_warms_and_envoy_accepts_the_state(bed: NodeBed) -> None:
    cond = bed.wait_programmed(timeout=60)
    assert cond["reason"] == "Accepted"

    def warmed() -> bool:
        stats = bed.stats("listener_manager.total_listeners")
        return (
            stats.get("listener_manager.total_listeners_warming") == 0
            and stats.get("listener_manager.total_listeners_active", 0) > 2  # more than the two L4 listeners
        )

    wait_for(warmed, timeout=60, what="east-west listeners active (their secrets served)")
    sds = bed.stats("sds.")
    assert sds and all(v == 0 for k, v in sds.items() if k.endswith("update_rejected")), sds


def test_udp_selection_beside_the_east_west_listeners(bed: NodeBed) -> None:
    sock = udp_socket_in(bed.clients["client-0"].path)
    try:
        for svc, vip in (("alpha", "10.96.8.1"), ("bravo", "10.96.8.2")):
            wait_reply(sock, vip, svc.encode() + b"|")
            got = ask(sock, vip, b"x")
            assert got is not None and got[0] == f"{svc}|x".encode() and got[1] == (vip, 18082)
    finally:
        sock.close()
