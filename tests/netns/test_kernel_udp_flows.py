"""100,000 concurrent UDP flows on the in-kernel UDP path, against the real kernel: a client pod netns holding the
capture (tproxy, STRICT inbound) and table `ip aether_udp` with one Service split 70/30 over two udp_echo backend
pods; eight child processes in the client netns (`aether.testing.udp_flows`, 12,500 flows each: a process here may
hold at most 20,000 open files, and root lacks CAP_SYS_RESOURCE to raise that) hold one socket per flow, each bound
to its own source address and port (four extra addresses on the client's eth0, 25,000 ports each: one address has
at most 64,512 unprivileged ports), all open at once. The ports stay clear of the mesh's own numbers: a reply to a
pod socket bound to port 18082 is dropped by the capture's guard (`capture_in`: no datagram from off the pod reaches
port 18082), on either data path.

What is checked: every flow gets its reply, from VIP:18082; the client netns's conntrack table holds all 100,000
at the same time; the Service chain's counter (a nat chain sees only a flow's first datagram) counted exactly
100,000 new flows and the backend chains' counters agree with who answered; the split is within 5 sigma of 70/30;
a second datagram on every still-open flow reaches the same backend as its first and makes no new NAT decision.

Limits: the netns's `nf_conntrack_max` is the initial netns's (262,144 on these machines) and cannot be raised
from inside a pod's netns (writing it there is refused, EINVAL); the UDP conntrack timeout
(`nf_conntrack_udp_timeout`, per netns) is raised in the client netns so that the first flows outlive a run slowed
by a loaded machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from typing import Any, cast

import pytest

from aether.netns.contract import L4_OUTBOUND_PORT, CaptureMode, InboundMode, InboundPolicy
from aether.netns.install import install_capture
from aether.netns.kernel_udp import KernelArm, KernelBackend
from aether.netns.kernel_udp_install import program_kernel_udp
from aether.testing import conntrack
from aether.testing.netlab import GATEWAY_LL, Lab, Pod, sh
from aether.testing.probe import ask, pod_socket
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

FLOWS = 100_000
NAMED = 5353
VIP = "10.96.29.20"
SOURCES = ("10.29.1.1", "10.29.1.2", "10.29.1.3", "10.29.1.4")  # the flows' (the probes use the pod's own, 10.29.0.2)
PORTS = (20_000, 44_999)  # per source address: 25,000 ports, above the mesh's 18008-18082
WORKERS_PER_SOURCE = 2  # processes, 12,500 flows each
INFLIGHT = 100  # per process: 800 datagrams outstanding towards two Python echo servers
CT_UDP_TIMEOUT = 300  # s, in the client netns only


def _sysctl(netns: str, key: str) -> int:
    return int(sh("sysctl", "-n", key, netns=netns).strip())


def _conntrack_picks(client: Pod, backends: tuple[Pod, ...]) -> Counter[str]:
    """The client netns's conntrack entries of UDP flows to VIP:18082, by the backend pod that answers them (the
    reply direction's source); "unreplied" for those without an answer yet, "snat" for any whose reply is not
    addressed to the flow's own source (the backend sees the client unchanged)."""
    out: Counter[str] = Counter()
    names = {pod.ip: pod.name for pod in backends}
    for e in conntrack.entries(client.netns):
        if (e.dst, e.dport) != (VIP, L4_OUTBOUND_PORT):
            continue
        out[names.get(e.reply_src, e.reply_src) if e.replied else "unreplied"] += 1
        out["snat"] += (e.reply_dst, e.reply_dport) != (e.src, e.sport)
    return out


def _lines(procs: list[subprocess.Popen[str]]) -> dict[str, Any]:
    """The next JSON line of every flows process, summed (numbers added, backends' tallies merged)."""
    total: dict[str, Any] = {"backends": {}}
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"udp_flows ended early (rc {proc.poll()})"
        got = json.loads(line)
        for key, value in got.items():
            if key == "backends":
                for name, n in value.items():
                    total["backends"][name] = total["backends"].get(name, 0) + n
            elif key == "unanswered":
                total[key] = total.get(key, []) + value
            elif isinstance(value, (int, float)):
                total[key] = max(total.get(key, 0), value) if key == "seconds" else total.get(key, 0) + value
    print(f"{got['phase']}: {total}")
    return total


def _spawn_flows(lab: Lab, client: Pod) -> list[subprocess.Popen[str]]:
    argv = [sys.executable, "-m", "aether.testing.udp_flows", "--vip", VIP, "--port", str(L4_OUTBOUND_PORT)]
    argv += ["--inflight", str(INFLIGHT), "--tries", "5"]
    step = (PORTS[1] - PORTS[0] + 1) // WORKERS_PER_SOURCE
    procs = []
    for addr in SOURCES:
        for w in range(WORKERS_PER_SOURCE):
            low = PORTS[0] + w * step
            src = ["--source", f"{addr}:{low}-{low + step - 1}"]
            proc = lab.spawn(client.netns, [*argv, *src], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            procs.append(cast("subprocess.Popen[str]", proc))  # text=True: str pipes (spawn is typed for bytes)
    return procs


def _client(lab: Lab) -> tuple[Pod, Pod, Pod]:
    node = lab.add_node("n")
    client = lab.add_pod(node, "c", "10.29.0.2")
    b1, b2 = lab.add_pod(node, "b1", "10.29.0.3"), lab.add_pod(node, "b2", "10.29.0.4")
    for addr in SOURCES:
        sh("ip", "addr", "add", f"{addr}/32", "dev", "eth0", netns=client.netns)
        sh("ip", "route", "add", f"{addr}/32", "dev", client.host_if, netns=node.netns)
    for pod in (b1, b2):
        lab.spawn(pod.netns, [sys.executable, "-m", "aether.testing.udp_echo", pod.name, str(NAMED)])
    install_capture(client.path, CaptureMode.TPROXY, inbound=InboundPolicy(InboundMode.STRICT, (GATEWAY_LL,)))
    arm = KernelArm(VIP, (KernelBackend(b1.ip, NAMED, 70), KernelBackend(b2.ip, NAMED, 30)))
    program_kernel_udp(client.path, [arm])
    sh("sysctl", "-qw", f"net.netfilter.nf_conntrack_udp_timeout={CT_UDP_TIMEOUT}", netns=client.netns)
    names: set[str] = set()

    def both_answer() -> bool:  # the real signal: both backend programs answer through the kernel rules
        s = pod_socket(client.path, 0.5)  # a fresh port of the pod's own address: not one of the flows' sources
        try:
            names.add(ask(s, VIP, b"up").backend or "")
        finally:
            s.close()
        return {"b1", "b2"} <= names

    wait_for(both_answer, timeout=30, what="both backends answering through the kernel rules")
    return client, b1, b2


def test_100000_concurrent_flows(lab: Lab) -> None:
    client, *backends = _client(lab)
    ct_max = _sysctl(client.netns, "net.netfilter.nf_conntrack_max")
    assert ct_max >= FLOWS + 1000, f"nf_conntrack_max {ct_max} (the initial netns's) cannot hold {FLOWS} flows"
    before = _conntrack_picks(client, tuple(backends))  # the readiness probes' flows
    procs = _spawn_flows(lab, client)
    assert _lines(procs)["flows"] == FLOWS
    first = _lines(procs)
    held = _sysctl(client.netns, "net.netfilter.nf_conntrack_count")
    picks = _conntrack_picks(client, tuple(backends))
    new = {name: picks[name] - before[name] for name in ("b1", "b2", "unreplied", "snat")}
    print(f"conntrack entries in the client netns: {held}; flows to the VIP there, by who answered: {new}")
    assert first["answered"] == FLOWS and first["from_vip"] == FLOWS, first
    assert held >= FLOWS, f"the conntrack table holds {held} entries, not the {FLOWS} flows alive"
    # one entry per flow, with the backend that answered it; the backend saw the client's own address and port
    assert new == {"b1": first["backends"]["b1"], "b2": first["backends"]["b2"], "unreplied": 0, "snat": 0}, new
    # binomial(100,000, 0.7): sd = sqrt(100,000 * 0.7 * 0.3) = 144.9; 5 sigma = 725
    assert abs(first["backends"]["b1"] - 70_000) <= 725, first
    for proc in procs:  # pass 2 in every process at once, each flow's socket still open
        assert proc.stdin is not None
        proc.stdin.write("again\n")
        proc.stdin.flush()
    again = _lines(procs)
    assert again["answered"] == FLOWS and again["from_vip"] == FLOWS, again
    assert again["same_backend"] == FLOWS, again  # conntrack kept every flow on its first pick
    assert _conntrack_picks(client, tuple(backends)) == picks  # and no flow got a second entry
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(60)
