"""Traffic from inside a pod's netns: datagrams to a VIP and who answered (UDP backends reply `<name>|<payload>`);
HTTP through the pod's outbound listener and which backend answered with which source identity."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import time
from dataclasses import dataclass

from aether.netns.contract import HTTP_OUTBOUND_PORT, L4_OUTBOUND_PORT
from aether.netns.nsthread import run_in_netns
from aether.testing.wait import wait_for


@dataclass(frozen=True)
class Answer:
    """One exchange: who answered (None: nobody) and where the reply came from."""

    vip: str
    backend: str | None
    source: tuple[str, int] | None
    # the send itself failed with EPERM: a rule in the pod's own output path dropped the datagram (the in-kernel
    # UDP path's drop of a Service without endpoints, or of an invalid backend's share)
    refused: bool = False

    @property
    def from_vip(self) -> bool:
        return self.source == (self.vip, L4_OUTBOUND_PORT)

    def show(self) -> str:
        if self.refused:
            return "send refused (EPERM: dropped in the pod's own output path)"
        if self.backend is None:
            return "no reply"
        return f"{self.backend} (reply from {self.source[0]}:{self.source[1]})" if self.source else self.backend


def pod_socket(netns_path: str, timeout: float = 0.5, family: socket.AddressFamily = socket.AF_INET) -> socket.socket:
    """A UDP socket made inside the pod netns: what an app in that pod would use (IPv4, or `family`)."""

    def make() -> socket.socket:
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.settimeout(timeout)
        return s

    return run_in_netns(netns_path, make)


def ask(sock: socket.socket, vip: str, payload: bytes, port: int = L4_OUTBOUND_PORT) -> Answer:
    try:
        sock.sendto(payload, (vip, port))
    except PermissionError:
        return Answer(vip, None, None, refused=True)
    deadline = time.monotonic() + (sock.gettimeout() or 0.5)
    while True:
        try:
            data, src = sock.recvfrom(65535)
        except TimeoutError:
            return Answer(vip, None, None)
        name, sep, rest = data.partition(b"|")
        if sep and rest == payload:  # a late reply to an earlier probe is not this one's answer
            return Answer(vip, name.decode(), (src[0], src[1]))
        if time.monotonic() > deadline:
            return Answer(vip, None, None)


def who_answers(netns_path: str, vip: str, tries: int = 3, timeout: float = 0.5) -> Answer:
    """Ask up to `tries` times (UDP may lose the first datagram while a listener is being bound)."""
    sock = pod_socket(netns_path, timeout, socket.AF_INET6 if ":" in vip else socket.AF_INET)
    try:
        answer = Answer(vip, None, None)
        for i in range(tries):
            answer = ask(sock, vip, f"probe-{i}-{time.monotonic_ns()}".encode())
            if answer.backend is not None:
                return answer
        return answer
    finally:
        sock.close()


def wait_answer(netns_path: str, vip: str, want: str, timeout: float = 30.0) -> Answer:
    """Retry until `want` answers for `vip` (config still propagating); returns the last answer either way."""
    last = Answer(vip, None, None)

    def answered() -> Answer | None:
        nonlocal last
        last = who_answers(netns_path, vip, tries=1, timeout=0.3)
        return last if last.backend == want and last.from_vip else None

    with contextlib.suppress(TimeoutError):
        return wait_for(answered, timeout, f"{want} answering {vip}")
    return last


@dataclass(frozen=True)
class HttpAnswer:
    status: int | None  # None: no HTTP answer at all
    backend: str | None
    spiffe_id: str | None  # the URI= part of the x-forwarded-client-cert the app received


def http_get(
    netns_path: str, host: str, port: int = HTTP_OUTBOUND_PORT, timeout: float = 5.0, ip: str = "127.0.0.1"
) -> HttpAnswer:
    """GET http://<ip>:<port>/ with `Host: host` from inside the pod netns (by default the pod's outbound HTTP
    listener; another pod's IP and app port is the direct path, around the mesh)."""

    def get() -> tuple[int, str]:
        conn = http.client.HTTPConnection(ip, port, timeout=timeout)
        try:
            conn.request("GET", "/", headers={"Host": host})
            resp = conn.getresponse()
            return resp.status, resp.read().decode(errors="replace")
        finally:
            conn.close()

    try:
        status, body = run_in_netns(netns_path, get)
    except OSError:
        return HttpAnswer(None, None, None)
    return http_answer(status, body)


def http_answer(status: int, body: str) -> HttpAnswer:
    """The echo app's answer read: which backend, and the SPIFFE ID (URI=) of the XFCC it received."""
    try:
        doc = json.loads(body)
    except ValueError:
        return HttpAnswer(status, None, None)
    m = re.search(r"URI=([^;,\"]+)", doc.get("xfcc") or "")
    return HttpAnswer(status, doc.get("backend"), m.group(1) if m else None)


def wait_http(netns_path: str, host: str, timeout: float = 30.0, want: int = 200) -> HttpAnswer:
    """Retry until a `want` status (secrets, routes, policies still arriving); returns the last answer either way."""
    last = HttpAnswer(None, None, None)

    def ok() -> HttpAnswer | None:
        nonlocal last
        last = http_get(netns_path, host)
        return last if last.status == want else None

    with contextlib.suppress(TimeoutError):
        return wait_for(ok, timeout, f"a {want} from {host}", interval=0.2)
    return last
