"""A Service's own UDP session idle timeout on the real data path (one node, real Envoy, the real capture).

udp_proxy's idle timeout is per listener, so a Service with its own (annotation mesh.aether.dev/udp-idle-timeout,
carried as `ServiceArm.idle_timeout_seconds`) gets a capture listener bound to its VIP in each client pod's netns,
beside the pod's wildcard listener; the kernel delivers a datagram to the most specific bound socket. Seen here:
the short Service's session expires (its listener's `idle_timeout` stat) and the next datagram of the same socket
opens a new session, while another Service on the same pod and port keeps its session (the default, 60 s).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from aether.netns.contract import L4_OUTBOUND_PORT
from aether.testing.netlab import Lab, Pod
from aether.testing.nodebed import NodeBed, ask, udp_socket_in, wait_reply
from aether.testing.promtext import named, parse, value
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

SHORT_VIP, LONG_VIP = "10.96.9.1", "10.96.9.2"
SHORT_S = 1.0
WILD = "udp.udp_capture_default_client-0"
VIP = f"udp.udp_capture_default_client-0_{SHORT_VIP.replace('.', '_')}"


@dataclass
class Bed:
    node: NodeBed
    client: Pod


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    lab = Lab()
    try:
        nb = NodeBed(lab, tmp_path_factory.mktemp("udp-idle"))
        client = nb.add_client("client-0")
        short = nb.add_service("short", SHORT_VIP)
        nb.add_service("long", LONG_VIP)
        node = nb.meshnode()
        for arm in node.status.udp.services:
            if arm.vip == short.vip:
                arm.idle_timeout_seconds = SHORT_S
        nb.write_state(node)
        nb.start_sidecar()
        nb.start_envoy()
        nb.wait_programmed()
        nb.wait_listeners(2)  # the pod's wildcard listener and the short Service's VIP listener
        yield Bed(nb, client)
    finally:
        lab.close()


def test_short_timeout_expires_its_sessions_while_the_other_service_keeps_the_default(bed: Bed) -> None:
    nb = bed.node
    s_short, s_long = udp_socket_in(bed.client.path), udp_socket_in(bed.client.path)
    try:
        wait_reply(s_short, SHORT_VIP, b"short")
        wait_reply(s_long, LONG_VIP, b"long")
        stats = nb.stats("udp.")
        # each VIP's flow landed on its own listener: the short one on the VIP-bound socket, the other on the wildcard
        assert stats[f"{VIP}.downstream_sess_total"] >= 1, stats
        assert stats[f"{WILD}.downstream_sess_total"] >= 1, stats
        before_total = stats[f"{VIP}.downstream_sess_total"]
        # the short Service's session idles out (Envoy's own counter), the other's stays open
        wait_for(lambda: nb.stats(f"{VIP}.")[f"{VIP}.idle_timeout"] >= before_total, timeout=15, what="idle expiry")
        stats = nb.stats("udp.")
        assert stats[f"{VIP}.downstream_sess_active"] == 0, stats
        assert stats[f"{WILD}.downstream_sess_active"] >= 1, stats
        assert stats[f"{WILD}.idle_timeout"] == 0, stats
        # the same counters as Prometheus metrics (what docs/operations.md tells operators to alert on)
        prom = parse(nb.admin("/stats/prometheus"))
        idle = value(prom, "envoy_udp_idle_timeout_total", envoy_udp_prefix=VIP.removeprefix("udp."))
        assert idle == before_total, named(prom, "envoy_udp_idle_timeout_total")
        # the same socket's next datagram opens a new session (and is answered)
        got = ask(s_short, SHORT_VIP)
        assert got is not None and got[0].startswith(b"short") and got[1] == (SHORT_VIP, L4_OUTBOUND_PORT)
        assert nb.stats(f"{VIP}.")[f"{VIP}.downstream_sess_total"] == before_total + 1
    finally:
        s_short.close()
        s_long.close()
