"""`aether operator --metrics HOST:PORT --liveness HOST:PORT`: what /metrics counts after changes made through the
API, /healthz while running and when the reconcile loop is stalled, and bad addresses. Counts only, never timings."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aether.api.client import ApiException
from aether.operator.reconciler import Reconciler
from aether.testing.apitestbed import objects as o
from aether.testing.apitestbed.faults import Faults
from aether.testing.apitestbed.harness import Cluster, InProcessOperator, operator_subprocess, unique, wait
from aether.testing.commands import command
from aether.testing.promtext import Samples, scrape, value

pytestmark = pytest.mark.slow  # subprocesses and an operator of its own: a few seconds each

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


@pytest.fixture
def ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture
def operator_process(api: tuple[str, Faults | None], ports: tuple[int, int]) -> Iterator[subprocess.Popen[str]]:
    metrics, liveness = ports
    with operator_subprocess(
        api[0], "--metrics", f"127.0.0.1:{metrics}", "--liveness", f"127.0.0.1:{liveness}"
    ) as proc:
        yield proc


def test_metrics_count_the_reconcile_and_the_writes_and_healthz_answers(
    api: tuple[str, Faults | None], ports: tuple[int, int], operator_process: subprocess.Popen[str]
) -> None:
    metrics, healthz = f"http://127.0.0.1:{ports[0]}/metrics", f"http://127.0.0.1:{ports[1]}/healthz"
    body = wait(
        "/healthz 200", lambda: next((text for status, text in [get(healthz)] if status == 200), None), timeout=60
    )
    assert "reconciler" in json.loads(body)  # our kopf.on.probe's part
    before = scrape(metrics)
    assert ("aether_operator_pending_keys", ()) in before and ("aether_operator_meshnodes", ()) in before

    k = Cluster(api[0], api[1])
    ns, node = unique("om"), unique("om-node")
    k.apply(o.namespace(ns))
    k.apply(o.node(node))
    k.apply(o.pod(ns, "c", node, "client"), status=o.pod_status("10.9.0.2"))
    k.apply(o.service(ns, "dns", "10.96.9.1", [("dns", 53, "UDP")]))
    k.apply(o.endpoint_slice(ns, "dns", [("dns", 5353, "UDP")], [("10.9.1.1", True, None)]))
    k.apply(o.udproute(ns, "r", "dns", [o.backend("dns", 53)]))
    k.wait("arm from the operator", lambda: k.arm(node, f"{ns}/dns"), timeout=60)
    k.wait("the route's status", lambda: ((k.route(ns, "r") or {}).get("status") or {}).get("parents"), timeout=60)

    # Writes are counted while a pass runs, the pass when it ends: the passes that wrote what we saw (the arm, the
    # route's status) may still be running. The loop runs one pass at a time and a pass takes its batch of changed
    # keys when it starts, so a Node created now is handled by a later pass: once its MeshNode exists, those passes
    # have ended and are counted.
    marker = unique("om-marker")
    k.apply(o.node(marker))
    k.wait("the marker Node's MeshNode", lambda: k.meshnode(marker), timeout=60)

    def operator_samples(samples: Samples) -> Samples:
        return {k: v for k, v in samples.items() if k[0].startswith("aether_operator_")}

    def snapshot() -> Samples | None:
        """Two scrapes in a row that agree: one moment's counters (a pass that ends during the first scrape, between
        two counters it bumps, shows in the second)."""
        first, second = scrape(metrics), scrape(metrics)
        return second if operator_samples(first) == operator_samples(second) else None

    after = wait("two scrapes of /metrics that agree", snapshot, timeout=30)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("aether_operator_udproute_status_writes_total", outcome="patched") >= 1  # our route's status
    passes = delta("aether_operator_reconcile_passes_total")
    assert passes >= 1
    assert delta("aether_operator_reconcile_duration_seconds_count") == passes
    assert delta("aether_operator_meshnode_writes_total", outcome="created") >= 1  # our node's MeshNode
    assert delta("aether_operator_meshnode_writes_total", outcome="patched") >= 1  # and its status
    assert value(after, "aether_operator_meshnodes") >= 1
    assert value(after, "aether_operator_reconcile_errors_total", kind="api_500") == 0
    assert get(healthz)[0] == 200

    operator_process.send_signal(signal.SIGTERM)
    out, _ = operator_process.communicate(timeout=60)
    assert operator_process.returncode == 0, out
    assert "Traceback" not in out, out
    assert get(metrics)[0] == 0 and get(healthz)[0] == 0, "both endpoints close with the operator"


def test_healthz_fails_while_a_pass_is_stalled_and_errors_are_counted(api: tuple[str, Faults | None]) -> None:
    """A MeshNode create that hangs (as an API call without a timeout would) stalls the pass: /healthz turns 500
    after --stall-after, and 200 again once the call returns. A failing create counts a reconcile error."""
    from aether.metrics import REGISTRY

    port = free_port()
    healthz = f"http://127.0.0.1:{port}/healthz"
    op = InProcessOperator(api[0])
    op.config.liveness, op.config.stall_after = ("127.0.0.1", port), 0.5
    op.start()
    try:
        rec: Reconciler = wait(
            "the reconciler", lambda: op.config.reconciler[0] if op.config.reconciler else None, timeout=60
        )
        release, entered, fail_once = threading.Event(), threading.Event(), [True]
        create = rec.writer.create_meshnode

        def stalled_create(name: str, node_uid: str) -> dict[str, Any]:
            if fail_once and fail_once.pop():
                raise ApiException(status=500, reason="injected")
            entered.set()
            release.wait(60)
            return create(name, node_uid)

        rec.writer.create_meshnode = stalled_create  # type: ignore[method-assign]
        errors = REGISTRY.get_sample_value("aether_operator_reconcile_errors_total", {"kind": "api_500"}) or 0.0
        k = Cluster(api[0], api[1])
        node = unique("stall-node")
        k.apply(o.node(node))
        assert entered.wait(60), "the retried pass never reached the create"
        wait("/healthz 500", lambda: get(healthz)[0] == 500, timeout=30)
        assert REGISTRY.get_sample_value("aether_operator_reconcile_errors_total", {"kind": "api_500"}) == errors + 1
        release.set()
        k.wait("the MeshNode after the stall", lambda: k.meshnode(node))
        wait("/healthz 200 again", lambda: get(healthz)[0] == 200, timeout=30)
        assert op.alive()
    finally:
        release.set()
        op.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metrics", "nope"], "argument --metrics: 'nope': expected host:port"),
        (["--metrics", "127.0.0.1:0"], "argument --metrics: '127.0.0.1:0': expected host:port"),
        (["--metrics", "127.0.0.1:99999"], "expected host:port"),
        (["--liveness", "unix:/tmp/x.sock"], "argument --liveness: 'unix:/tmp/x.sock': expected host:port"),
        (["--stall-after", "0"], "--stall-after must be positive"),
        (["--full-gc-every", "-1"], "argument --full-gc-every: '-1': must be 0 (off) or positive seconds"),
    ],
)
def test_bad_addresses_exit_2_with_a_clear_message(
    api: tuple[str, Faults | None], args: list[str], message: str
) -> None:
    r = subprocess.run(
        [*command(), "operator", "--kubeconfig", api[0], *args], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_an_address_in_use_exits_1_naming_it(api: tuple[str, Faults | None]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for flag in ("--metrics", "--liveness"):
            r = subprocess.run(
                [*command(), "operator", "--kubeconfig", api[0], flag, f"127.0.0.1:{port}"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.returncode == 1, r.stderr
            assert f"cannot listen ({flag} 127.0.0.1:{port})" in r.stderr, r.stderr


def test_the_deployment_probes_and_ports_match_its_args() -> None:
    """deploy/operator/deployment.yaml: the args parse, the liveness probe hits --liveness's port at /healthz and
    the container ports name both addresses (the pod's own network: no host port is taken)."""
    import yaml

    from aether.operator.cli import make_parser

    deployment = yaml.safe_load((REPO / "deploy" / "operator" / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = make_parser().parse_args(container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert args.metrics == ("0.0.0.0", ports["metrics"]) and args.liveness == ("0.0.0.0", ports["healthz"])
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and ports[probe["port"]] == args.liveness[1]
    assert "hostNetwork" not in deployment["spec"]["template"]["spec"]
