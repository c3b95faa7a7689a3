"""Per-service UDP on IPv6 through the deployed shell: the `aether xds` sidecar process serving its real Envoy from
a MeshNode state file with IPv6 and dual-stack arms (the clusters named per family as the operator names them,
`udp:<ns>/<svc>@ipv6`), pods captured by the installer. The sidecar's gates take the IPv6 arms, Envoy reports them
Programmed, and each IPv6 VIP reaches its own backend with the reply from [VIP]:18082, beside the same Services'
IPv4 VIPs.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from aether.api.meshnode import Endpoint, ServiceArm
from aether.testing.netlab import Lab
from aether.testing.nodebed import NodeBed, ask, wait_reply
from aether.testing.probe import pod_socket

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

SERVICES = {"alpha": ("10.96.8.1", "fd00:96:8::1"), "bravo": ("10.96.8.2", "fd00:96:8::2")}
ONLY6 = ("charlie", "fd00:96:8::3")  # an IPv6-only Service


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeBed]:
    lab = Lab()
    try:
        tb = NodeBed(lab, tmp_path_factory.mktemp("xds-e2e6"), ipv6=True)
        tb.add_client("client-0")
        for svc, (vip, _vip6) in SERVICES.items():
            tb.add_service(svc, vip)
        charlie = tb.add_service(ONLY6[0], "10.96.8.250")  # its IPv4 arm is left out of the MeshNode below
        arms6 = [
            ServiceArm(
                service=s.name,
                vip=vip6,
                cluster=f"udp:default/{name}@ipv6",
                endpoints=[Endpoint(ip=str(s.backend.ip6), port=s.port)],
            )
            for name, vip6, s in [
                *((n, v6, tb.services[n]) for n, (_v4, v6) in SERVICES.items()),
                (ONLY6[0], ONLY6[1], charlie),
            ]
        ]
        tb.write_state(tb.meshnode(sorted(SERVICES), extra_arms=arms6))
        tb.start_sidecar()
        tb.start_envoy()
        tb.wait_programmed()
        tb.wait_listeners(2)  # the pod's capture listeners: 0.0.0.0:18082 and [::]:18082
        yield tb
    finally:
        lab.close()


def test_each_vip_of_both_families_reaches_its_own_backend(bed: NodeBed) -> None:
    client = bed.clients["client-0"].path
    wanted = [(svc, vip) for svc, pair in SERVICES.items() for vip in pair] + [ONLY6]
    for svc, vip in wanted:
        sock = pod_socket(client, 1.0, socket.AF_INET6 if ":" in vip else socket.AF_INET)
        try:
            wait_reply(sock, vip, svc.encode() + b"|")
            got = ask(sock, vip, f"to-{svc}".encode())
            assert got is not None, f"{svc} at {vip}: no reply"
            assert got[0] == f"{svc}|to-{svc}".encode() and got[1][:2] == (vip, 18082), (svc, vip, got)
        finally:
            sock.close()
    assert bed.condition()["status"] == "True"
    assert (
        bed.stats("cluster.blackhole.upstream_cx_none_healthy").get("cluster.blackhole.upstream_cx_none_healthy", 0)
        == 0
    )
