"""The one copy of each test-support helper does what its callers rely on: wait_for, the Envoy base ids, the echo apps."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aether.testing.envoy import BASE_IDS_PER_PROCESS, allocate_base_id
from aether.testing.wait import wait_for


def test_wait_for_returns_the_truthy_value() -> None:
    values = iter([None, 0, "", {"arm": 1}])
    assert wait_for(lambda: next(values), 5, "the arm", interval=0) == {"arm": 1}


def test_wait_for_says_what_and_the_last_value_and_the_diagnosis() -> None:
    with pytest.raises(TimeoutError, match=r"waiting for the arm; last value: \[\]\nlog tail"):
        wait_for(lambda: [], 0.05, "the arm", interval=0.01, diagnose=lambda: "log tail")


def test_wait_for_polls_through_ignored_errors_and_names_the_last_one() -> None:
    with pytest.raises(TimeoutError, match=r"last value: ConnectionRefusedError\('not up'\)"):
        wait_for(_refused, 0.05, "admin", interval=0.01, ignore=(OSError,))


def test_wait_for_lets_other_errors_through_at_once() -> None:
    with pytest.raises(ConnectionRefusedError):
        wait_for(_refused, 30, "admin")


def _refused() -> bool:
    raise ConnectionRefusedError("not up")


def test_base_ids_differ_within_a_process_and_between_processes() -> None:
    mine = [allocate_base_id() for _ in range(10)]
    assert len(set(mine)) == 10
    code = "from aether.testing.envoy import allocate_base_id as a; print(a(), a())"
    theirs = [int(v) for _ in range(2) for v in subprocess.check_output([sys.executable, "-c", code]).split()]
    blocks = {i // BASE_IDS_PER_PROCESS for i in mine} | {i // BASE_IDS_PER_PROCESS for i in theirs}
    assert len(blocks) == 3  # one block per process
    assert all(0 < i < 2**32 for i in mine + theirs)  # Envoy's --base-id is a uint32


def _free_port() -> int:
    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        tcp.bind(("127.0.0.1", 0))
        port: int = tcp.getsockname()[1]
        udp.bind(("127.0.0.1", port))  # free for both
        return port


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    port, hits = _free_port(), tmp_path / "hits.log"
    argv = [sys.executable, "-m", "aether.testing.http_echo", "web-0", str(port), "--hits", str(hits), "--udp"]
    proc = subprocess.Popen([*argv, "--one-write"], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and b"ready" in proc.stdout.readline()
        yield port, hits
    finally:
        proc.kill()
        proc.wait(10)


def test_http_echo_names_itself_the_identity_host_and_port_and_logs_the_hit(echo: tuple[int, Path]) -> None:
    port, hits = echo
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/x", headers={"Host": "web.default", "x-forwarded-client-cert": "URI=spiffe://a/b"})
        resp = conn.getresponse()
        body = json.loads(resp.read())
    finally:
        conn.close()
    assert resp.status == 200 and resp.getheader("Content-Type") == "application/json"
    assert body == {"backend": "web-0", "xfcc": "URI=spiffe://a/b", "host": "web.default", "port": port}
    assert hits.read_text().splitlines() == [f"http {port} /x"]


def test_the_udp_echo_beside_it_answers_with_its_name_and_logs_the_datagram(echo: tuple[int, Path]) -> None:
    port, hits = echo
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(5)
        sock.sendto(b"ping", ("127.0.0.1", port))
        assert sock.recvfrom(100)[0] == b"web-0|ping"
    assert hits.read_text().splitlines() == [f"udp {port} 4"]
