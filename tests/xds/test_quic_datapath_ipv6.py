"""HTTP/3 and h2 with per-source identity between pods over IPv6 (issue 27 item 4): the two-node rig of
test_quic_datapath.py (`aether.testing.quic_mesh`) with dual-stack pods, the destination reached at its IPv6
address and dialled at an IPv6 VIP.

client-0 (node A) and web-0 (node B) have an IPv4 and an IPv6 address (MeshPod `ips`), or, in the `ipv6-only`
runs, an IPv6 address alone (their MeshPod `ip`; the inbound then binds it and dials the app over IPv6 too); node A
knows default/web at
an IPv6 VIP with web-0's IPv6 address as its endpoint. So the request enters node A's `http-outbound6` listener on
[::]:18080 (diverted from [VIP]:18080), leaves on the source's QUIC twin (or h2) to [web-0's IPv6]:18008, and node B
takes it on web-0's IPv6 inbound listeners (`inbound-h3:...@ipv6`, `inbound-h2:...@ipv6`), which verify the source's
certificate as the IPv4 ones do.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aether.netns.contract import CaptureMode
from aether.netns.install import install_capture
from aether.testing.eastwest_lab import AdsHarness, http_in_netns, start_envoy, xfcc_uri
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.netlab import Lab
from aether.testing.quic_mesh import CLIENT, HOST, MD, OPTS, TD, WEB, Mesh
from aether.testing.wait import wait_for
from aether.xds.identity.ca import BuiltinCA
from aether.xds.resources import Resources
from aether.xds.translate.eastwest.build import EastWestOptions, build

pytestmark = [pytest.mark.privileged, pytest.mark.envoy]

VIP6 = "fd00:96::20"


class Mesh6(Mesh):
    """The rig with IPv6 pods: node A dials default/web at VIP6, its endpoint web-0's IPv6 address."""

    def resources_a(self, *, more_destinations: tuple[str, ...] = (), **kw: object) -> Resources:
        node, records = sample_node(
            "node-a",
            [SamplePod("u-client", "client-0", self.client.ip, "client", self.client.path)],
            [SampleDestination("default/web", "web-sa", (8080,), (str(self.web.ip6),), vip=VIP6)],
        )
        node.status.pods[0].ips = list(dict.fromkeys([self.client.ip, str(self.client.ip6)]))  # one: IPv6-only
        ew = EastWestOptions(access_log_path=str(self.workdir / "access-a.log"), **kw)  # type: ignore[arg-type]
        return build(node, records, OPTS, ew)

    def resources_b(self, policies: object = None) -> Resources:
        node, records = sample_node("node-b", [SamplePod("u-web", "web-0", self.web.ip, "web-sa", self.web.path)], [])
        node.status.pods[0].ips = list(dict.fromkeys([self.web.ip, str(self.web.ip6)]))
        ew = EastWestOptions(access_log_path=str(self.workdir / "access-b.log"), app_ports={"u-web": (8080,)})
        return build(node, records, OPTS, ew)

    def get6(self, n: int = 1) -> list[tuple[int, str]]:
        return http_in_netns(self.client.netns, HOST, n=n, ip=VIP6)


@contextlib.contextmanager
def rig(workdir: Path, v6_only: bool) -> Iterator[Mesh6]:
    """The two nodes; pods dual-stack, or (`v6_only`) with an IPv6 address alone (the app then listens on [::])."""
    lab = Lab()
    ads = AdsHarness(workdir)
    try:
        na, nb = lab.add_node("qa6"), lab.add_node("qb6")
        if v6_only:
            client = lab.add_pod(na, "client-0", "fd00:200:1::2")
            web = lab.add_pod(nb, "web-0", "fd00:200:2::7")
        else:
            client = lab.add_pod(na, "client-0", "10.200.1.2", ip6="fd00:200:1::2")
            web = lab.add_pod(nb, "web-0", "10.200.2.7", ip6="fd00:200:2::7")
        lab.link_nodes(na, nb, "10.199.0.1", "10.199.0.2", a_ip6="fd00:199::1", b_ip6="fd00:199::2")
        install_capture(client.path, CaptureMode.TPROXY)
        hits = workdir / "hits.log"
        hits.touch()
        echo = [sys.executable, "-m", "aether.testing.http_echo", "web-0", "8080", "--hits", str(hits), "--dual-stack"]
        proc = lab.spawn(web.netns, echo, stdout=subprocess.PIPE)
        assert proc.stdout is not None and b"ready" in proc.stdout.readline()
        a = start_envoy(lab, na.netns, "node-a", workdir, ads)
        b = start_envoy(lab, nb.netns, "node-b", workdir, ads)
        m = Mesh6(lab, workdir, ads, BuiltinCA(TD, MD), a, b, client, client, web, hits)
        m.serve_a()
        m.serve_b()
        a.wait_live()
        b.wait_live()
        yield m
    finally:
        ads.close()
        lab.close()


@pytest.fixture(scope="module", params=["dual-stack", "ipv6-only"])
def mesh(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh6]:
    with rig(tmp_path_factory.mktemp("quic6"), request.param == "ipv6-only") as m:
        yield m


def _until_200(mesh: Mesh6) -> list[tuple[int, str]]:
    last: list[tuple[int, str]] = []

    def ok() -> list[tuple[int, str]] | None:
        nonlocal last
        last = mesh.get6()
        return last if last[0][0] == 200 else None

    return wait_for(ok, 30, "a 200 over IPv6", interval=0.3, diagnose=lambda: f"{last}; {mesh.a.log_tail(2000)}")


def _b_saw(mesh: Mesh6, proto: str) -> bool:
    return any(ln.startswith(f"{proto} 200") and f"peer={CLIENT} " in ln for ln in mesh.access_b())


def test_h3_over_ipv6_carries_the_source_identity(mesh: Mesh6) -> None:
    (_, body), *_ = _until_200(mesh)
    assert xfcc_uri(body) == CLIENT
    assert [xfcc_uri(b) for _, b in mesh.get6(n=3)] == [CLIENT] * 3
    wait_for(lambda: _b_saw(mesh, "HTTP/3"), 10, "HTTP/3 from client-0 in node B's access log")
    assert mesh.a.stat("cluster.quic_default/web@client.upstream_rq_200") > 0
    # node B took it on web-0's IPv6 listener: its QUIC listener stats are keyed by the address it is bound to
    assert mesh.b.stat_sum(r"^listener\.\[fd00_200_2__7\]_18008\.downstream_cx_total$") > 0, mesh.b.stats("18008")
    assert WEB  # the destination's identity is the one node A pinned (a wrong one is refused: test_quic_datapath)


def test_h2_over_ipv6_carries_the_source_identity(mesh: Mesh6) -> None:
    try:
        mesh.serve_a(mesh.resources_a(quic=False))
        wait_for(lambda: "quic_default/web@client" not in mesh.a.admin("/clusters"), 30, "twins gone")
        (_, body), *_ = _until_200(mesh)
        assert xfcc_uri(body) == CLIENT
        wait_for(lambda: _b_saw(mesh, "HTTP/2"), 10, "HTTP/2 from client-0 in node B's access log")
    finally:
        mesh.serve_a()
