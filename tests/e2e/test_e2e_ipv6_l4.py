"""Plaintext UDP and the TCP floor on IPv6 and dual stack, across two nodes, with the real Envoy and the real kernel
(issue 27 item 4, the data path).

The MeshNode is written here (the state-file path the xDS tests use), not by the operator: the operator's
dual-stack reading (Service clusterIPs, EndpointSlices per address type) is another change. What runs is the
rest: node-a's Envoy on delta ADS serving `aether.xds.translate` for that MeshNode, its capture listeners bound
into the client pods' netns, pods captured by `aether.netns.install` (STRICT on the backends), IPv6 routes between
the nodes (`aether.testing.netlab`).

Topology: node-a runs the Envoy and two client pods (one with the deployed tproxy capture, one with REDIRECT: the
negative control); node-b runs the backends, each with an IPv4 and an IPv6 address. Services: three IPv6-only
(one VIP each), one dual-stack split 70/30 over two backends (an IPv4 and an IPv6 VIP, one cluster per family),
a dnsmasq, a socat echo for the size sweep, and a TCP one.
"""

from __future__ import annotations

import collections
import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from aether.api.meshnode import ArmBackend, Endpoint, MeshNode, MeshPod, ServiceArm
from aether.netns.contract import L4_OUTBOUND_PORT, CaptureMode, InboundMode, InboundPolicy
from aether.netns.install import install_capture
from aether.netns.nsthread import run_in_netns
from aether.netns.records import PodRecord
from aether.testing.eastwest_lab import AdsHarness, start_envoy
from aether.testing.envoy import Envoy
from aether.testing.netlab import GATEWAY6_LL, GATEWAY_LL, Lab, Node, Pod, sh
from aether.testing.probe import who_answers
from aether.testing.spoofing import counter
from aether.testing.udp_clients import (
    BIG_TXT,
    BIG_TXT_NAME,
    WHO_NAME,
    dig,
    dnsmasq_argv,
    exchange,
    socat_echo_argv,
    txt_strings,
)
from aether.testing.wait import wait_for
from aether.xds.resources import TranslateOptions
from aether.xds.translate.compose import translate

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

NS = "e2e6"
APP_PORT = 5353
TCP_PORT = 7000
# IPv6-only Services (VIP, backend), a dual-stack split, and the real programs' Services
V6_SERVICES = {"svc-a": ("fd00:96::a", "echo-a"), "svc-b": ("fd00:96::b", "echo-b"), "svc-c": ("fd00:96::c", "echo-c")}
SPLIT = {"IPv4": "10.96.6.100", "IPv6": "fd00:96::64"}
SPLIT_WEIGHTS = {"echo-a": 70, "echo-b": 30}
DNS_VIP, SWEEP_VIP, TCP_VIP = "fd00:96::53", "fd00:96::e", "fd00:96::70"
AAAA = "fd00:192:0:2::11"
SIZES = (64, 1452, 1453, 9000, 65507, 65527)  # 65,527 B: the largest UDP payload over IPv6 (65,507 over IPv4)


@dataclass
class Bed:
    lab: Lab
    workdir: Path
    ads: AdsHarness
    node_a: Node
    node_b: Node
    pods: dict[str, Pod] = field(default_factory=dict)
    hits: dict[str, Path] = field(default_factory=dict)
    envoy: Envoy | None = None

    def strict(self) -> InboundPolicy:
        """What the backends admit: node-a's addresses, from which its proxy delivers across nodes."""
        assert self.node_a.ip and self.node_a.ip6
        return InboundPolicy(InboundMode.STRICT, (self.node_a.ip, self.node_a.ip6, GATEWAY_LL))


def _ep(pod: Pod, port: int, v6: bool = True) -> Endpoint:
    ip = pod.ip6 if v6 else pod.ip
    assert ip is not None
    return Endpoint(ip=ip, port=port)


def _arms(bed: Bed) -> tuple[list[ServiceArm], list[ServiceArm]]:
    p = bed.pods
    udp = [
        ServiceArm(service=f"{NS}/{s}", vip=vip, cluster=f"udp:{NS}/{s}@ipv6", endpoints=[_ep(p[be], APP_PORT)])
        for s, (vip, be) in V6_SERVICES.items()
    ]
    for family, vip in SPLIT.items():
        v6 = family == "IPv6"
        backends = [
            ArmBackend(backend=f"{NS}/{be}", weight=w, share=float(w), endpoints=[_ep(p[be], APP_PORT, v6)])
            for be, w in SPLIT_WEIGHTS.items()
        ]
        cluster = f"udp-split:{NS}/split" + ("@ipv6" if v6 else "")
        udp.append(ServiceArm(service=f"{NS}/split", vip=vip, cluster=cluster, backends=backends))
    udp.append(
        ServiceArm(service=f"{NS}/dns", vip=DNS_VIP, cluster=f"udp:{NS}/dns@ipv6", endpoints=[_ep(p["dns"], 53)])
    )
    udp.append(
        ServiceArm(
            service=f"{NS}/sweep", vip=SWEEP_VIP, cluster=f"udp:{NS}/sweep@ipv6", endpoints=[_ep(p["sweep"], APP_PORT)]
        )
    )
    tcp = [
        ServiceArm(service=f"{NS}/tcp", vip=TCP_VIP, cluster=f"tcp:{NS}/tcp@ipv6", endpoints=[_ep(p["tcp"], TCP_PORT)])
    ]
    return udp, tcp


def _meshnode(bed: Bed) -> MeshNode:
    udp, tcp = _arms(bed)
    clients = [MeshPod(uid=f"u-{n}", namespace=NS, name=n, ip=bed.pods[n].ip) for n in ("client", "client-redirect")]
    return MeshNode.model_validate(
        {
            "metadata": {"name": "node-a"},
            "status": {
                "pods": [c.wire() for c in clients],
                "udp": {"services": [a.wire() for a in udp]},
                "tcp": {"services": [a.wire() for a in tcp]},
            },
        }
    )


def _backend(bed: Bed, name: str, argv: list[str]) -> None:
    log = open(bed.workdir / f"{name}.log", "ab")  # noqa: SIM115 (the child process owns it)
    bed.lab.spawn(bed.pods[name].netns, argv, stdout=log, stderr=log)


def _start(bed: Bed) -> None:
    lab, a, b = bed.lab, bed.node_a, bed.node_b
    for i, name in enumerate(("client", "client-redirect"), start=2):
        bed.pods[name] = lab.add_pod(a, name, f"10.200.1.{i}", ip6=f"fd00:200:1::{i}")
    for i, name in enumerate(("echo-a", "echo-b", "echo-c", "dns", "sweep", "tcp"), start=2):
        bed.pods[name] = lab.add_pod(b, name, f"10.200.2.{i}", ip6=f"fd00:200:2::{i}")
    install_capture(bed.pods["client"].path, CaptureMode.TPROXY)
    install_capture(bed.pods["client-redirect"].path, CaptureMode.REDIRECT)
    for name in ("echo-a", "echo-b", "echo-c", "dns", "sweep", "tcp"):
        install_capture(bed.pods[name].path, CaptureMode.TPROXY, inbound=bed.strict())
    for name in ("echo-a", "echo-b", "echo-c"):
        bed.hits[name] = bed.workdir / f"{name}.hits"
        bed.hits[name].touch()
        argv = [sys.executable, "-m", "aether.testing.udp_echo", name, str(APP_PORT), "--dual-stack"]
        _backend(bed, name, [*argv, "--hits", str(bed.hits[name])])
    dns = bed.pods["dns"]
    _backend(bed, "dns", dnsmasq_argv(dns.ip6 or "", 53, "192.0.2.11", bed.workdir, answer_ip6=AAAA))
    _backend(bed, "sweep", socat_echo_argv(bed.pods["sweep"].ip6 or "", APP_PORT))
    tcp = bed.pods["tcp"]
    _backend(
        bed, "tcp", ["socat", f"TCP6-LISTEN:{TCP_PORT},bind=[{tcp.ip6}],fork,reuseaddr", "SYSTEM:echo tcp-backend"]
    )
    node = _meshnode(bed)
    records = {
        f"u-{n}": PodRecord(uid=f"u-{n}", namespace=NS, name=n, netns=bed.pods[n].path)
        for n in ("client", "client-redirect")
    }
    bed.ads.set("node-a", translate(node, records, TranslateOptions(areas=("udp", "tcp-floor"))))
    bed.envoy = envoy = start_envoy(lab, a.netns, "node-a", bed.workdir, bed.ads)
    # two clients: a UDP listener per family each, a TCP-floor one (IPv6 arms only) each
    wait_for(lambda: envoy.stat("listener_manager.total_listeners_active") == 6, 30, "6 listeners active")


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    lab = Lab()
    workdir = tmp_path_factory.mktemp("ipv6-l4")
    ads = AdsHarness(workdir)
    try:
        a, b = lab.add_node("node-a"), lab.add_node("node-b")
        lab.link_nodes(a, b, "10.0.6.1", "10.0.6.2", a_ip6="fd00:10:6::1", b_ip6="fd00:10:6::2")
        tb = Bed(lab, workdir, ads, a, b)
        _start(tb)
        yield tb
    finally:
        lab.close()
        ads.close()


def _diag(bed: Bed) -> str:
    return bed.envoy.log_tail(3000) if bed.envoy else ""


def test_each_ipv6_vip_reaches_its_own_backend_across_nodes_with_replies_from_the_vip(bed: Bed) -> None:
    client = bed.pods["client"]
    failures: list[str] = []

    def all_selected() -> bool:
        failures.clear()
        for svc, (vip, backend) in V6_SERVICES.items():
            ans = who_answers(client.path, vip, tries=2, timeout=0.4)
            if ans.backend != backend or not ans.from_vip:
                failures.append(f"{svc} ([{vip}]:{L4_OUTBOUND_PORT}) expected {backend}, got {ans.show()}")
        return not failures

    with contextlib.suppress(TimeoutError):
        wait_for(all_selected, 30, "every IPv6 VIP answered by its own backend", interval=0)
    assert failures == [], "\n".join(failures) + _diag(bed)


def test_redirect_capture_loses_per_service_selection_on_ipv6(bed: Bed) -> None:
    """Negative control: REDIRECT rewrites the destination to ::1, so the matcher never sees an IPv6 VIP and every
    datagram goes to the blackhole (counted), none is answered."""
    assert bed.envoy is not None
    pod = bed.pods["client-redirect"]
    before = bed.envoy.stat("cluster.blackhole.upstream_cx_none_healthy")
    answers = [who_answers(pod.path, vip, tries=1, timeout=0.4) for vip, _be in V6_SERVICES.values()]
    assert [a.backend for a in answers] == [None] * len(V6_SERVICES)
    assert bed.envoy.stat("cluster.blackhole.upstream_cx_none_healthy") - before == len(V6_SERVICES)


def _fresh_flows(client: Pod, vip: str, n: int) -> collections.Counter[str | None]:
    return collections.Counter(who_answers(client.path, vip, tries=2, timeout=0.5).backend for _ in range(n))


def test_a_dual_stack_service_answers_on_both_vips_with_the_weights_holding_per_family(bed: Bed) -> None:
    client = bed.pods["client"]
    for name in ("echo-a", "echo-b"):
        bed.hits[name].write_text("")
    got = {family: _fresh_flows(client, vip, 200) for family, vip in SPLIT.items()}
    for family, counts in got.items():
        assert set(counts) == {"echo-a", "echo-b"}, (family, counts)
        share = counts["echo-a"] / 200
        assert 0.58 <= share <= 0.82, f"{family}: echo-a took {share:.0%} of 200 new flows for 70% asked ({counts})"
    for name in ("echo-a", "echo-b"):  # each family's datagrams reached the same two backends
        families = {line.split()[-1] for line in bed.hits[name].read_text().splitlines()}
        assert families == {"ipv4", "ipv6"}, (name, families)


def test_the_size_sweep_to_65527_bytes_over_an_ipv6_vip(bed: Bed) -> None:
    client = bed.pods["client"]
    wait_for(lambda: exchange(client.path, SWEEP_VIP, L4_OUTBOUND_PORT, b"x") is not None, 30, "the sweep echo")
    for size in SIZES:
        payload = os.urandom(size)
        got = exchange(client.path, SWEEP_VIP, L4_OUTBOUND_PORT, payload, timeout=2.0)
        assert got is not None, f"{size} B: no reply{_diag(bed)}"
        assert got[0] == payload and got[1][:2] == (SWEEP_VIP, L4_OUTBOUND_PORT), f"{size} B"

    def too_big() -> None:
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        try:
            s.sendto(bytes(65528), (SWEEP_VIP, L4_OUTBOUND_PORT))
        finally:
            s.close()

    with pytest.raises(OSError, match="Message too long"):  # the IPv6 limit is the socket's, not the mesh's
        run_in_netns(client.path, too_big)


def test_dig_aaaa_and_a_big_txt_answer_over_an_ipv6_vip(bed: Bed) -> None:
    client = bed.pods["client"]
    wait_for(lambda: dig(client.netns, DNS_VIP, L4_OUTBOUND_PORT, WHO_NAME, "AAAA").answers, 30, "dnsmasq over IPv6")
    aaaa = dig(client.netns, DNS_VIP, L4_OUTBOUND_PORT, WHO_NAME, "AAAA")
    assert [line.split()[-1] for line in aaaa.answers] == [AAAA], aaaa.output
    big = dig(client.netns, DNS_VIP, L4_OUTBOUND_PORT, BIG_TXT_NAME, "TXT", bufsize=4096)
    assert big.status == "NOERROR" and "tc" not in big.flags and big.size > 1500, big.output
    assert txt_strings(big.answers) == list(BIG_TXT)


def test_the_tcp_floor_on_an_ipv6_vip(bed: Bed) -> None:
    def call() -> bytes:
        with socket.create_connection((TCP_VIP, L4_OUTBOUND_PORT), timeout=3) as s:
            return s.recv(64)

    got = b""
    for _ in range(30):
        with contextlib.suppress(OSError):
            got = run_in_netns(bed.pods["client"].path, call)
        if got:
            break
    assert got == b"tcp-backend\n", _diag(bed)


def _udp_call(netns: str, target: str, port: int, ifname: str = "") -> str | None:
    """One datagram from `netns` (a named netns) with python, to `target` (on interface `ifname` for a link-local
    one: the scope as an index, made in that netns), its reply or None."""
    code = (
        "import socket,sys; s=socket.socket(socket.AF_INET6,socket.SOCK_DGRAM); s.settimeout(0.5); "
        "scope=socket.if_nametoindex(sys.argv[3]) if sys.argv[3] else 0; "
        "s.sendto(b'plain',(sys.argv[1],int(sys.argv[2]),0,scope)); "
        "print(s.recvfrom(65535)[0].decode())"
    )
    argv = ["ip", "netns", "exec", netns, sys.executable, "-c", code, target, str(port), ifname]
    return subprocess.run(argv, capture_output=True, text=True).stdout.strip() or None


def _link_local(pod: Pod) -> str:
    out = sh("ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link", netns=pod.netns)
    return out.split()[3].split("/")[0]


def test_strict_refuses_a_plaintext_ipv6_call_and_a_link_local_one(bed: Bed) -> None:
    """A client pod calling a backend's IPv6 address directly at its app port, and the node calling the backend's
    link-local address from fe80::1 (the node side of its veth): neither source is a mesh source, both are dropped
    by the backend's STRICT chain (counted). Control: the same calls answered once the backend is PERMISSIVE."""
    echo = bed.pods["echo-c"]
    direct = (bed.pods["client"].netns, echo.ip6 or "")
    link_local = (bed.node_b.netns, _link_local(echo))
    before = counter(echo, "inbound_in", "meta l4proto udp")
    assert _udp_call(*direct, APP_PORT) is None
    assert _udp_call(*link_local, APP_PORT, echo.host_if) is None
    assert counter(echo, "inbound_in", "meta l4proto udp") - before >= 2
    install_capture(echo.path, CaptureMode.TPROXY, inbound=InboundPolicy(InboundMode.PERMISSIVE))
    try:
        assert _udp_call(*direct, APP_PORT) == "echo-c|plain"
        assert _udp_call(*link_local, APP_PORT, echo.host_if) == "echo-c|plain"
    finally:
        install_capture(echo.path, CaptureMode.TPROXY, inbound=bed.strict())
    assert GATEWAY6_LL not in bed.strict().mesh_sources


def test_the_capture_listeners_refuse_an_ipv6_caller_from_outside_the_pod(bed: Bed) -> None:
    """capture_in on IPv6: node-a (a mesh source: STRICT admits it) dialling a backend's [IPv6]:18082 across the
    node link is dropped and counted by capture_in."""
    echo = bed.pods["echo-a"]
    before = counter(echo, "capture_in", "udp dport 18082")
    assert _udp_call(bed.node_a.netns, echo.ip6 or "", L4_OUTBOUND_PORT) is None
    assert counter(echo, "capture_in", "udp dport 18082") - before == 1
