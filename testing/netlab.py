"""A lab of network namespaces: nodes, pods behind veths, processes inside them, all cleaned up.

Every netns, link and process a Lab makes carries the Lab's own short tag, so cleanup removes exactly
what this Lab made (by name or by PID), even when the test that made it fails.

Topology: each node is a netns (its "host network": the node's Envoy and sidecar run there); each pod is
a netns whose `eth0` is a veth to its node, with a /32 address and a default route via the node, so a VIP
that exists nowhere still has a route (the capture diverts it before it leaves).

IPv6 beside IPv4, per pod and per node link (`add_pod(..., ip6=...)`, `link_nodes(..., a_ip6=, b_ip6=)`): the pod
gets `ip6/128` on eth0 and `default via fe80::1` (the node side of its veth, `GATEWAY6_LL`), the node a /128 route
to it, linked nodes a /126 and routes to each other's pods. Addresses are ULA (fd00::/8) and skip duplicate
address detection (`nodad`), so they are usable at once. Without `ip6` a pod is IPv4-only, as before.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

NETNS_DIR = Path("/run/netns")
# Every Lab tag this process made: lets a test session check, at its end, that no Lab left a netns behind.
CREATED_TAGS: set[str] = set()
GATEWAY_LL = "169.254.1.1"  # the pod's next hop: the node side of every pod veth
GATEWAY6_LL = "fe80::1"  # the same for IPv6: a link-local address on the node side of every pod veth
# argv prefix: the child gets SIGKILL when the thread that started it dies, however it dies (a test process killed
# with SIGKILL runs no finalizer, and a Lab's processes sit in sessions of their own). util-linux's setpriv sets
# PR_SET_PDEATHSIG and execs: nothing runs in the forked child before exec (subprocess's preexec_fn would force a
# plain fork() and run Python there, next to gRPC's threads). The setting survives exec (`ip netns exec` included).
DIE_WITH_PARENT = ("setpriv", "--pdeathsig", "KILL", "--")


def die_with_parent(argv: Sequence[str]) -> list[str]:
    """`argv` run so that it dies with the thread that starts it (start it from the main thread, as tests do: the
    kernel sends the signal when that *thread* exits, not the process)."""
    return [*DIE_WITH_PARENT, *argv]


def sh(*argv: str, check: bool = True, netns: str | None = None, input: str | None = None) -> str:
    cmd = list(argv)
    if netns is not None:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, input=input)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def is_root() -> bool:
    return os.geteuid() == 0


@dataclass
class Node:
    name: str
    netns: str
    path: str
    ip: str | None = None  # the node's address on the lab's node network, if any
    ip6: str | None = None  # its IPv6 address there, when the link has one


@dataclass
class Pod:
    name: str
    node: Node
    netns: str
    path: str
    ip: str
    host_if: str
    ip6: str | None = None  # the pod's IPv6 address (a ULA /128), when the lab gave it one


@dataclass
class Lab:
    """Network namespaces made by one test (or the demo), removed by `close()`."""

    tag: str = field(default_factory=lambda: "ae" + secrets.token_hex(3))
    nodes: dict[str, Node] = field(default_factory=dict)
    pods: dict[str, Pod] = field(default_factory=dict)
    _netns: list[str] = field(default_factory=list)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _links: int = 0
    _peers: list[tuple[Node, Node, str, str]] = field(default_factory=list)
    _peers6: list[tuple[Node, Node, str, str]] = field(default_factory=list)
    _closed: bool = False

    def __post_init__(self) -> None:
        CREATED_TAGS.add(self.tag)
        atexit.register(self.close)

    # -- namespaces ------------------------------------------------------------------------------
    def _new_netns(self, suffix: str) -> tuple[str, str]:
        name = f"{self.tag}-{suffix}"
        sh("ip", "netns", "add", name)
        self._netns.append(name)
        sh("ip", "link", "set", "lo", "up", netns=name)
        # no duplicate address detection on any link made here later: IPv6 addresses usable at once
        sh("sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0", "net.ipv6.conf.all.accept_dad=0", netns=name)
        return name, str(NETNS_DIR / name)

    def add_node(self, name: str) -> Node:
        ns, path = self._new_netns(name)
        node = Node(name=name, netns=ns, path=path)
        sh("sysctl", "-qw", "net.ipv4.ip_forward=1", netns=ns)
        sh("sysctl", "-qw", "net.ipv6.conf.all.forwarding=1", netns=ns)
        self.nodes[name] = node
        return node

    def _veth_names(self) -> tuple[str, str]:
        self._links += 1
        base = f"{self.tag}{self._links:x}"  # <= 12 chars
        return f"{base}a", f"{base}b"

    def add_pod(self, node: Node, name: str, ip: str, ip6: str | None = None) -> Pod:
        """A pod netns with eth0 = ip/32, default via the node; the node routes ip to the pod. With `ip6`, the same
        for IPv6 (ip6/128, default via fe80::1 on the node side). An IPv6 `ip` (and no `ip6`) makes an IPv6-only
        pod: `ip` and `ip6` are then that address."""
        v6_only = ":" in ip and ip6 is None
        if v6_only:
            ip = ip6 = ipaddress.IPv6Address(ip).compressed
        else:
            ipaddress.IPv4Address(ip)
        if ip6 is not None:
            ip6 = ipaddress.IPv6Address(ip6).compressed
        ns, path = self._new_netns(name)
        host_if, peer = self._veth_names()
        sh("ip", "link", "add", host_if, "netns", node.netns, "type", "veth", "peer", "name", peer, "netns", ns)
        sh("ip", "link", "set", peer, "name", "eth0", netns=ns)
        sh("ip", "link", "set", "eth0", "up", netns=ns)
        sh("ip", "link", "set", host_if, "up", netns=node.netns)
        if not v6_only:
            sh("ip", "addr", "add", f"{ip}/32", "dev", "eth0", netns=ns)
            sh("ip", "route", "add", GATEWAY_LL, "dev", "eth0", "scope", "link", netns=ns)
            sh("ip", "route", "add", "default", "via", GATEWAY_LL, "dev", "eth0", netns=ns)
            sh("ip", "addr", "add", f"{GATEWAY_LL}/32", "dev", host_if, netns=node.netns)
            sh("sysctl", "-qw", f"net.ipv4.conf.{host_if}.proxy_arp=1", netns=node.netns)
            sh("ip", "route", "add", f"{ip}/32", "dev", host_if, netns=node.netns)
        if ip6 is not None:
            self._pod_ip6(node, ns, host_if, ip6)
        pod = Pod(name=name, node=node, netns=ns, path=path, ip=ip, host_if=host_if, ip6=ip6)
        self.pods[name] = pod
        self._route_pods()
        return pod

    @staticmethod
    def _pod_ip6(node: Node, ns: str, host_if: str, ip6: str) -> None:
        sh("ip", "-6", "addr", "add", f"{ip6}/128", "dev", "eth0", "nodad", netns=ns)
        sh("ip", "-6", "route", "add", "default", "via", GATEWAY6_LL, "dev", "eth0", netns=ns)
        sh("ip", "-6", "addr", "add", f"{GATEWAY6_LL}/64", "dev", host_if, "nodad", netns=node.netns)
        sh("ip", "-6", "route", "add", f"{ip6}/128", "dev", host_if, netns=node.netns)

    def link_nodes(
        self, a: Node, b: Node, a_ip: str, b_ip: str, *, a_ip6: str | None = None, b_ip6: str | None = None
    ) -> None:
        """A veth between two nodes, with routes so each node reaches the other's pods (now and later); with
        `a_ip6`/`b_ip6`, an IPv6 /126 on it too and routes to each other's pods' IPv6 addresses."""
        ia, ib = self._veth_names()
        sh("ip", "link", "add", ia, "netns", a.netns, "type", "veth", "peer", "name", ib, "netns", b.netns)
        for node, ifn, ip in ((a, ia, a_ip), (b, ib, b_ip)):
            sh("ip", "addr", "add", f"{ip}/30", "dev", ifn, netns=node.netns)
            node.ip = ip
        if a_ip6 is not None and b_ip6 is not None:
            for node, ifn, ip6 in ((a, ia, a_ip6), (b, ib, b_ip6)):
                sh("ip", "-6", "addr", "add", f"{ip6}/126", "dev", ifn, "nodad", netns=node.netns)
                node.ip6 = ipaddress.IPv6Address(ip6).compressed
            self._peers6.append((a, b, a_ip6, b_ip6))
        for node, ifn in ((a, ia), (b, ib)):
            sh("ip", "link", "set", ifn, "up", netns=node.netns)
        self._peers.append((a, b, a_ip, b_ip))
        self._route_pods()

    def _route_pods(self) -> None:
        for peers, family, full in ((self._peers, "-4", 32), (self._peers6, "-6", 128)):
            for a, b, a_ip, b_ip in peers:
                for pod in self.pods.values():
                    addr = pod.ip if family == "-4" else pod.ip6
                    if addr is None or (family == "-4" and ":" in addr):  # an IPv6-only pod has no IPv4 route
                        continue
                    if pod.node is a:
                        sh("ip", family, "route", "replace", f"{addr}/{full}", "via", a_ip, netns=b.netns)
                    elif pod.node is b:
                        sh("ip", family, "route", "replace", f"{addr}/{full}", "via", b_ip, netns=a.netns)

    # -- processes -------------------------------------------------------------------------------
    def spawn(
        self, netns: str | None, argv: Sequence[str], *, env: dict[str, str] | None = None, **kw: object
    ) -> subprocess.Popen[bytes]:
        """Start a process (in `netns` if given) in its own process group; close() kills it, and it dies with this
        process however this process dies (die_with_parent)."""
        cmd = list(argv) if netns is None else ["ip", "netns", "exec", netns, *argv]
        proc: subprocess.Popen[bytes] = subprocess.Popen(
            die_with_parent(cmd),
            env={**os.environ, **(env or {})},
            start_new_session=True,
            **kw,  # type: ignore[call-overload]
        )
        self._procs.append(proc)
        return proc

    def running(self) -> list[subprocess.Popen[bytes]]:
        """The processes this Lab started that are still running."""
        return [p for p in self._procs if p.poll() is None]

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout)

    def stop_all(self, grace: float = 5.0) -> None:
        """SIGTERM every running process group at once, SIGKILL what is left after `grace` seconds (stopping
        them one by one costs the sum of their shutdowns)."""
        procs = self.running()
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)

    # -- cleanup ---------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in reversed(self._procs):
            with contextlib.suppress(Exception):
                self.stop(proc)
        for ns in reversed(self._netns):
            # killing anything left inside the netns we made, then the netns (its veths go with it)
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._netns.clear()
        atexit.unregister(self.close)

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def leftover_netns(tag_prefix: str = "ae") -> list[str]:
    """Named netns that look like a Lab's (used by tests that check nothing leaked)."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(tag_prefix))


@contextlib.contextmanager
def lab(tag: str | None = None) -> Iterator[Lab]:
    lb = Lab(tag=tag) if tag else Lab()
    try:
        yield lb
    finally:
        lb.close()
