"""One bad arm never blocks a node (real Envoy, the sidecar process, captured pods): while two arms claim one VIP,
both are refused and every other arm keeps flowing, and a change to an unrelated Service still reaches Envoy.

Seen red on the old sidecar: its duplicate-VIP gate refused the whole state, so nothing was ever served
(no reply from charlie, Programmed=False GateRefused)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aether.api.meshnode import Endpoint, ServiceArm
from aether.testing.netlab import Lab
from aether.testing.nodebed import NodeBed, ask, udp_socket_in, wait_reply
from aether.testing.promtext import value

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

VIPS = {"alpha": "10.96.8.1", "bravo": "10.96.8.2", "charlie": "10.96.8.3", "delta": "10.96.8.4"}


@pytest.fixture
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeBed]:
    lab = Lab()
    try:
        tb = NodeBed(lab, tmp_path_factory.mktemp("xds-dupvip"))
        tb.add_client("client")
        for svc, vip in VIPS.items():
            tb.add_service(svc, vip)
        yield tb
    finally:
        lab.close()


def _duplicate(bed: NodeBed, charlie_to: str) -> list[ServiceArm]:
    """alpha and bravo both claiming alpha's VIP; charlie's VIP pointing at `charlie_to`'s backend."""
    bravo = bed.services["bravo"].arm().model_copy(update={"vip": VIPS["alpha"]})
    target = bed.services[charlie_to]
    charlie = ServiceArm(
        service="default/charlie",
        vip=VIPS["charlie"],
        cluster=f"udp:default/{charlie_to}",
        backend=f"default/{charlie_to}",
        endpoints=[Endpoint(ip=target.backend.ip, port=target.port)],
    )
    return [bed.services["alpha"].arm(), bravo, charlie]


def test_a_duplicate_vip_refuses_its_arms_and_every_other_arm_flows(bed: NodeBed) -> None:
    state = bed.meshnode([])
    state.status.udp.services = _duplicate(bed, "charlie")
    bed.write_state(state)
    bed.start_sidecar()
    bed.start_envoy()
    cond = bed.wait_programmed()
    assert cond["reason"] == "AcceptedWithRefusals" and "duplicate-vip" in str(cond["message"])
    assert VIPS["alpha"] in str(cond["message"])
    sock = udp_socket_in(bed.clients["client"].path, timeout=0.3)
    try:
        wait_reply(sock, VIPS["charlie"], b"charlie|")  # the unrelated arm flows
        assert ask(sock, VIPS["alpha"]) is None  # the contested VIP goes nowhere: neither claimant is guessed
        # a change to the unrelated Service still reaches Envoy while the duplicate exists
        state.status.udp.services = _duplicate(bed, "delta")
        bed.write_state(state)
        wait_reply(sock, VIPS["charlie"], b"delta|")
        assert value(bed.sidecar_metrics(), "aether_xds_gate_refusals_total", gate="duplicate-vip") == 1.0
    finally:
        sock.close()
