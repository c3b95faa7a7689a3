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
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from aether.testing import promtext
from aether.testing.envoy import BASE_IDS_PER_PROCESS, allocate_base_id, parse_host_health, parse_stats
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


def test_promtext_reads_what_prometheus_client_writes() -> None:
    registry = CollectorRegistry()
    refusals = Counter("aether_x_refusals", "refusals", ["reason"], registry=registry)
    refusals.labels("MalformedName").inc(2)
    refusals.labels('odd "quoted" \\ reason').inc()
    Histogram("aether_x_seconds", "a histogram", registry=registry).observe(0.25)
    samples = promtext.parse(generate_latest(registry).decode())
    assert promtext.value(samples, "aether_x_refusals_total", reason="MalformedName") == 2.0
    assert promtext.by_label(samples, "aether_x_refusals_total", "reason") == {
        "MalformedName": 2.0,
        'odd "quoted" \\ reason': 1.0,
    }
    assert promtext.value(samples, "aether_x_seconds_count") == 1.0 and promtext.value(samples, "aether_x_seconds_sum")
    assert promtext.value(samples, "aether_x_refusals_total", reason="absent") == 0.0
    assert set(promtext.named(samples, "aether_x_seconds_bucket")) >= {("aether_x_seconds_bucket", (("le", "+Inf"),))}


def test_envoy_admin_json_readers() -> None:
    """The shapes Envoy 1.40's admin answers with `?format=json` (trimmed from a real one)."""
    stats = {
        "stats": [
            {"name": "cluster_manager.active_clusters", "value": 1},
            {"name": "control_plane.identifier", "value": "a text readout"},
            {"histograms": {"supported_quantiles": [50], "computed_quantiles": []}},
        ]
    }
    assert parse_stats(json.dumps(stats)) == {"cluster_manager.active_clusters": 1}

    def host(ip: str, status: str) -> dict[str, object]:
        return {
            "address": {"socket_address": {"address": ip, "port_value": 53}},
            "health_status": {"eds_health_status": status},
        }

    clusters = {
        "cluster_statuses": [
            {"name": "udp:ns/a", "host_statuses": [host("10.0.0.1", "HEALTHY"), host("10.0.0.2", "DRAINING")]},
            {"name": "udp:ns/b", "host_statuses": [host("10.0.0.3", "HEALTHY")]},
        ]
    }
    assert parse_host_health(json.dumps(clusters), "udp:ns/a") == {"10.0.0.1": "healthy", "10.0.0.2": "draining"}
    assert parse_host_health(json.dumps(clusters), "udp:ns/c") == {}


def test_promtext_names_envoy_counters_with_total() -> None:
    text = '# TYPE envoy_udp_idle_timeout counter\nenvoy_udp_idle_timeout{envoy_udp_prefix="a"} 3\n'
    assert promtext.parse(text) == {("envoy_udp_idle_timeout_total", (("envoy_udp_prefix", "a"),)): 3.0}
