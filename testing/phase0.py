"""The Phase-0 rig: does a transparent socket in the pod netns see the VIP the pod dialled?

Four cases over one pod netns (eth0 with a default route) and a VIP that exists nowhere:

- C1 divert: the tproxy capture; a transparent socket on 0.0.0.0:<port>, created and read inside the netns, must
  see the VIP in ipi_addr, and the connected client must get the reply from VIP:<port>.
- C2 REDIRECT (the load-bearing control): the socket sees 127.0.0.1. No delivery here means the control did not
  run (the classic cause: a statement after `redirect` made nft load nothing) -> BrokenRig, never a pass.
- C3 no rule: nothing is delivered.
- MAIN: the socket is created inside the pod netns on a setns'd thread, but read (and answered) from the calling
  thread, which is in another netns -> still the VIP.

An IPv6 VIP runs the same cases over IPv6 (the socket on `::`; REDIRECT shows `::1`).

Every ruleset is built by `rules.build_ruleset` and installed by `install.install_capture`; before measuring, the
rig checks what is installed (`check_capture`) and raises BrokenRig if it is not what the case needs.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable
from typing import NamedTuple

from aether.netns.contract import L4_OUTBOUND_PORT, CaptureMode
from aether.netns.install import CaptureError, capture_state, check_capture, install_capture, remove_capture
from aether.netns.nsthread import run_in_netns
from aether.testing.tproxy_socket import Datagram, recv_pktinfo, send_from, transparent_udp_socket

Installer = Callable[[str, CaptureMode], None]
Checker = Callable[[str, CaptureMode], None]


class BrokenRig(RuntimeError):
    """The rig could not produce a trustworthy measurement: fail the run, never read it as a result."""


class CaseResult(NamedTuple):
    case: str
    delivered_dst: str | None  # ipi_addr the server socket saw (None: nothing delivered)
    reply_from: tuple[str, int] | None  # where the client's reply came from (None: no reply)
    reader_netns_ino: int  # netns inode of the thread that read the server socket
    pod_netns_ino: int


class RigReport(NamedTuple):
    c1: CaseResult
    c2: CaseResult
    c3: CaseResult
    main: CaseResult


def _thread_netns_ino() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


def _client(pod: str, vip: str, port: int) -> socket.socket:
    def make() -> socket.socket:
        sock = socket.socket(socket.AF_INET6 if ":" in vip else socket.AF_INET, socket.SOCK_DGRAM)
        sock.connect((vip, port))
        return sock

    return run_in_netns(pod, make)


def _serve_once(server: socket.socket, wait: float) -> Datagram | None:
    server.settimeout(wait)
    try:
        dgram = recv_pktinfo(server)
    except TimeoutError:
        return None
    # answer from the address the header carried: the VIP under divert, 127.0.0.1 under REDIRECT
    send_from(server, b"pong:" + dgram.data, dgram.source, dgram.dst)
    return dgram


def _exchange(client: socket.socket, nonce: bytes, wait: float) -> tuple[str, int] | None:
    client.settimeout(wait)
    try:
        data, source = client.recvfrom(65535)
    except (TimeoutError, ConnectionRefusedError, OSError):
        return None
    return (str(source[0]), int(source[1])) if data == b"pong:" + nonce else None


def measure(
    pod: str, vip: str, port: int, *, read_in_netns: bool, wait: float
) -> tuple[str | None, tuple[str, int] | None, int]:
    """Send one datagram from the pod to vip:port; return (ipi_addr seen, reply source, reader netns inode)."""
    host = "::" if ":" in vip else "0.0.0.0"
    server = run_in_netns(pod, lambda: transparent_udp_socket(port, host))
    client = _client(pod, vip, port)
    nonce = secrets.token_hex(8).encode()
    try:
        client.send(nonce)
        if read_in_netns:
            dgram, ino = run_in_netns(pod, lambda: (_serve_once(server, wait), _thread_netns_ino()))
        else:
            dgram, ino = _serve_once(server, wait), _thread_netns_ino()
        if dgram is not None and dgram.data != nonce:
            raise BrokenRig(f"the server read a datagram that is not this case's ({dgram.data!r})")
        reply = _exchange(client, nonce, wait) if dgram is not None else None
        return (dgram.dst if dgram else None), reply, ino
    finally:
        server.close()
        client.close()


def _prepare(pod: str, mode: CaptureMode | None, installer: Installer, checker: Checker, case: str) -> None:
    try:
        if mode is None:
            remove_capture(pod)
            state = capture_state(pod)
            if state.table["tables"] or state.rules or state.routes:
                raise BrokenRig(f"{case}: the capture is still installed after removal: {state}")
            return
        installer(pod, mode)
        checker(pod, mode)
    except CaptureError as exc:
        raise BrokenRig(
            f"{case}: the {mode.value if mode else 'empty'} capture is not what the case needs: {exc}"
        ) from exc


def run_rig(
    pod_netns: str,
    vip: str,
    port: int = L4_OUTBOUND_PORT,
    *,
    installer: Installer = install_capture,
    checker: Checker = check_capture,
    wait: float = 2.0,
    quiet_wait: float = 0.5,
) -> RigReport:
    """Run C1, C2, C3 and MAIN in that order; raise BrokenRig when a control cannot be trusted."""
    pod_ino = os.stat(pod_netns).st_ino

    def case(name: str, mode: CaptureMode | None, read_in_netns: bool, timeout: float) -> CaseResult:
        _prepare(pod_netns, mode, installer, checker, name)
        dst, reply, ino = measure(pod_netns, vip, port, read_in_netns=read_in_netns, wait=timeout)
        return CaseResult(name, dst, reply, ino, pod_ino)

    c1 = case("C1", CaptureMode.TPROXY, True, wait)
    c2 = case("C2", CaptureMode.REDIRECT, True, wait)
    if c2.delivered_dst is None:
        raise BrokenRig(
            "C2 (REDIRECT) delivered nothing: the control did not run (did the redirect rule load?), so no other "
            "case can be trusted"
        )
    c3 = case("C3", None, True, quiet_wait)
    main = case("MAIN", CaptureMode.TPROXY, False, wait)
    if main.reader_netns_ino == pod_ino:
        raise BrokenRig("MAIN read the socket from inside the pod netns: it must read from another netns")
    return RigReport(c1, c2, c3, main)
