"""The QUIC pair lifecycle through the whole mesh: two nodes in network namespaces, the operator and cluster-mode
sidecars, real Envoys. node-a: client-a (SA alpha) and client-b (SA beta); node-b: web-0 (SA web) behind Service
web. The scenarios run in order on one mesh (each builds on the pair state the last one left), and each asserts
the HTTP status, that the request left node-a's Envoy on the source's own twin over HTTP/3, and the SPIFFE ID the
app received, plus the MeshNode's pair state (and `kubectl get meshnodes`' counts).

Whether a twin was fetched on demand is read from node-a's sidecar (`aether_quic_pair_fetch_seconds_count` on its
`--metrics` endpoint): "no fetch" means that count did not move.

node-a's Envoy also runs a stale listener (`aether.e2e.stale_routes`: config the sidecar did not make, in its
bootstrap from the start) whose routes name twins that fail the sidecar's check; Service `idle` has no ready
endpoints (known to node-a, not QUIC-eligible). Only the bogus-name scenario sends requests there.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from aether.api.meshnode import API_GROUP, API_VERSION, PLURAL
from aether.api.naming import mesh_host, quic_twin, spiffe_id
from aether.e2e.harness import Mesh
from aether.e2e.lifecycle import (
    STREAMS,
    delete_pod,
    pair_state,
    printer_columns,
    restart_envoy,
    restart_sidecar,
    set_http_endpoints,
    start_sidecar,
    stop_sidecar,
    wait_pairs,
)
from aether.e2e.node_proxy import MeshNodeProxy
from aether.e2e.stale_routes import LISTENER, STALE_PORT, Served, odcds_timeouts, served, stale_listener
from aether.testing.probe import HttpAnswer, http_get
from aether.testing.promtext import Samples, by_label, scrape, value
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

NS = "pairs"
ALPHA, BETA = quic_twin(NS, "web", "alpha"), quic_twin(NS, "web", "beta")
HOST = mesh_host(NS, "web")
STALE = {  # Host on node-a's stale listener -> (the cluster its route names, the sidecar's refusal reason)
    "malformed": ("quic:pairs/web", "MalformedName"),
    "source-not-local": (quic_twin(NS, "web", "nobody"), "SourceNotLocal"),
    "not-a-dependency": (quic_twin(NS, "nosuch", "alpha"), "DestinationNotADependency"),
    "ineligible": (quic_twin(NS, "idle", "alpha"), "DestinationIneligible"),
    "not-a-twin": ("h2:pairs/nosuch", None),  # not judged by the pair check: the ADS server answers it absent
}


def _free_port() -> int:
    """A port nobody listens on now (the kernel picks it), so runs beside other tests do not collide."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


METRICS_PORT = _free_port()


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    m = Mesh(namespace=NS, areas="udp,tcp-floor,eastwest", shared_ca=True)
    try:
        a, b = m.add_node("node-a"), m.add_node("node-b")
        a.static_listeners.append(stale_listener({h: c for h, (c, _) in STALE.items()}, a.workdir / "stale.log"))
        m.start_node_proxies()
        m.add_pod(a, "client-a", sa="alpha")
        m.add_pod(a, "client-b", sa="beta")
        m.add_http_backend(b, "web-0", sa="web")
        m.add_http_service("web", ["web-0"])
        m.add_http_service("idle", [])  # no ready endpoints: not QUIC-eligible

        def quic_lists(o: dict[str, Any]) -> bool:
            quic = (o.get("status") or {}).get("quic") or {}
            return bool(quic.get("destinations")) and any(i["service"] == f"{NS}/idle" for i in quic["ineligible"])

        m.kube.wait_meshnode("node-a", quic_lists)
        # node-a's sidecar with its metrics endpoint (both sidecars share the harness's netns: one port)
        m.sidecar_args = ("--metrics", f"127.0.0.1:{METRICS_PORT}")
        restart_sidecar(m, a)
        m.programmed(a)
        m.programmed(b)
        yield m
    finally:
        m.close()


def node_a(mesh: Mesh) -> MeshNodeProxy:
    return mesh.nodes["node-a"]


def metrics() -> Samples:
    return scrape(f"http://127.0.0.1:{METRICS_PORT}/metrics")


def fetches() -> float:
    return value(metrics(), "aether_quic_pair_fetch_seconds_count")


def refusals() -> dict[str, float]:
    """`aether_quic_pair_refusals_total` by reason."""
    return by_label(metrics(), "aether_quic_pair_refusals_total", "reason")


def admitted_on_fetch() -> float:
    """`aether_quic_pair_admissions_total{evidence="Fetch"}`: pairs, where `fetches()` counts on-demand requests
    (Envoy may carry several twin names in one)."""
    return value(metrics(), "aether_quic_pair_admissions_total", evidence="Fetch")


def twin_stat(mesh: Mesh, twin: str, stat: str) -> int:
    return node_a(mesh).stat(f"cluster.{twin.replace(':', '_')}.{stat}")


def envoy_has(mesh: Mesh, twin: str) -> bool:
    return f"{twin}::" in node_a(mesh).admin("/clusters")


def call(mesh: Mesh, pod: str, sa: str, retry: bool = False) -> None:
    """One request (or, with `retry`, until the first 200 on its twin): 200 from web-0 with `sa`'s SPIFFE ID, on
    its twin, over HTTP/3. A new pod's first 200s may come over the h2 cluster, with its own identity too: its
    listener can be in Envoy before the route that maps its SPIFFE ID to its twin (no match is h2)."""
    twin = quic_twin(NS, "web", sa)
    netns = mesh.pods[pod].netns_path
    want = HttpAnswer(200, "web-0", spiffe_id(NS, sa))
    if retry:
        wait_for(lambda: http_get(netns, HOST) == want and twin_stat(mesh, twin, "upstream_rq_200") >= 1, 30, "on twin")
    got = http_get(netns, HOST)
    assert got == want, f"{pod}: {got}\n{mesh.diagnostics()}"
    assert twin_stat(mesh, twin, "upstream_rq_200") >= 1
    assert twin_stat(mesh, twin, "upstream_cx_http3_total") >= 1


def test_first_use_fetches_the_twin_and_records_the_pair(mesh: Mesh) -> None:
    a = node_a(mesh)
    assert not envoy_has(mesh, ALPHA) and not envoy_has(mesh, BETA)  # no twin until a pair dials
    before = fetches()
    call(mesh, "client-a", "alpha")  # the very first request: paused for the fetch, then 200 over HTTP/3
    assert fetches() == before + 1
    wait_pairs(mesh, a, {ALPHA}, set())
    pair = pair_state(mesh, a)[0][ALPHA]
    assert (pair.source, pair.destination, pair.evidence, pair.last_kind) == (
        spiffe_id(NS, "alpha"),
        f"{NS}/web",
        "Fetch",
        "Fetch",
    )
    assert not envoy_has(mesh, BETA)  # beta has not dialled
    cols = printer_columns(mesh, a)
    assert cols is None or (cols["QUIC PAIRS"], cols["DORMANT PAIRS"]) == ("1", "0"), cols


def test_second_use_needs_no_fetch(mesh: Mesh) -> None:
    before = fetches()
    requests = twin_stat(mesh, ALPHA, "upstream_rq_total")
    for _ in range(3):
        call(mesh, "client-a", "alpha")
    assert fetches() == before and twin_stat(mesh, ALPHA, "upstream_rq_total") == requests + 3
    call(mesh, "client-b", "beta")  # beta's first use
    assert fetches() == before + 1
    wait_pairs(mesh, node_a(mesh), {ALPHA, BETA}, set())


def test_source_pod_deleted_goes_dormant_and_its_return_republishes_with_no_fetch(mesh: Mesh) -> None:
    a = node_a(mesh)
    delete_pod(mesh, "client-b")  # beta's only pod leaves the node
    # as a kubelet ends it: the object is gone from the API, not left Terminating for everything that lists pods to
    # hold (the soak's operator and sidecars grew by one pod's state per deleted pod while the harness left them)
    assert not [p.metadata.name for p in mesh.kube.core.list_namespaced_pod(NS).items if p.metadata.name == "client-b"]
    wait_pairs(mesh, a, {ALPHA}, {BETA})
    wait_for(lambda: not envoy_has(mesh, BETA), 30, "beta's twin withdrawn")
    cols = printer_columns(mesh, a)
    assert cols is None or (cols["QUIC PAIRS"], cols["DORMANT PAIRS"]) == ("1", "1"), cols
    call(mesh, "client-a", "alpha")  # the other pair is untouched
    before = fetches()
    mesh.add_pod(a, "client-b2", sa="beta")  # a new pod of the same ServiceAccount (a rollout)
    wait_pairs(mesh, a, {ALPHA, BETA}, set())
    wait_for(lambda: envoy_has(mesh, BETA), 30, "beta's twin republished")
    call(mesh, "client-b2", "beta", retry=True)  # retry: the new pod's own listeners arrive with it
    assert fetches() == before  # the twin came back with the pod: no request asked for it


def test_destination_delisted_and_relisted(mesh: Mesh) -> None:
    a = node_a(mesh)
    set_http_endpoints(mesh, "web", [])  # web loses its ready endpoints: no longer QUIC-eligible
    wait_pairs(mesh, a, set(), {ALPHA, BETA})
    wait_for(lambda: not envoy_has(mesh, ALPHA), 30, "alpha's twin withdrawn")
    before = fetches()
    set_http_endpoints(mesh, "web", ["web-0"])
    wait_pairs(mesh, a, {ALPHA, BETA}, set())
    wait_for(lambda: envoy_has(mesh, ALPHA) and envoy_has(mesh, BETA), 30, "both twins republished")
    call(mesh, "client-a", "alpha", retry=True)  # retry: the route's virtual host comes back with the destination
    call(mesh, "client-b2", "beta")
    assert fetches() == before


def test_sidecar_restart_under_traffic_fails_no_request_of_a_persisted_pair(mesh: Mesh) -> None:
    a = node_a(mesh)
    answers: list[HttpAnswer] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            answers.append(http_get(mesh.pods["client-a"].netns_path, HOST))

    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    try:
        wait_for(lambda: len(answers) >= 5, 30, "traffic before the restart")
        streams = a.stat(STREAMS)
        stop_sidecar(mesh, a)
        during = len(answers)
        wait_for(lambda: len(answers) >= during + 5, 30, "traffic while the sidecar is down")
        start_sidecar(mesh, a, streams)
        after = len(answers)
        wait_for(lambda: len(answers) >= after + 10, 30, "traffic after the restart")
    finally:
        stop.set()
        t.join(10)
    want = HttpAnswer(200, "web-0", spiffe_id(NS, "alpha"))
    assert len(answers) >= 20 and all(x == want for x in answers), [x for x in answers if x != want][:5]
    wait_pairs(mesh, a, {ALPHA, BETA}, set())  # carried over; re-subscribed by the proxy
    wait_for(lambda: pair_state(mesh, a)[0][ALPHA].last_kind == "Resubscribe", 30, "alpha re-subscribed")
    call(mesh, "client-a", "alpha")


def test_proxy_restart_prunes_dormant_pairs_and_every_live_pair_answers(mesh: Mesh) -> None:
    a = node_a(mesh)
    delete_pod(mesh, "client-b2")
    wait_pairs(mesh, a, {ALPHA}, {BETA})
    before = fetches()
    restart_envoy(mesh, a)  # a new generation: holds nothing, re-subscribes nothing
    wait_pairs(mesh, a, {ALPHA}, set())  # beta: pruned (NotResubscribed)
    call(mesh, "client-a", "alpha", retry=True)  # retry: the new Envoy binds its listeners
    assert fetches() == before  # alpha's twin reached the new Envoy with the snapshot (wildcard)


def test_migration_a_held_twin_without_a_stored_pair_is_answered_absent_then_fetched_on_use(mesh: Mesh) -> None:
    """What an earlier sidecar left: Envoy holds alpha's twin (through the wildcard, never subscribed) and the
    MeshNode stores no pair for it. The new sidecar answers it absent; the next request is a first use."""
    a = node_a(mesh)
    streams = a.stat(STREAMS)
    stop_sidecar(mesh, a)
    empty = {"pairs": [], "dormantPairs": [], "pairCount": 0, "dormantPairCount": 0}
    mesh.kube.custom.patch_cluster_custom_object_status(
        API_GROUP, API_VERSION, PLURAL, "node-a", {"status": {"quic": empty}}
    )
    assert envoy_has(mesh, ALPHA)
    start_sidecar(mesh, a, streams)
    wait_for(lambda: not envoy_has(mesh, ALPHA), 30, "alpha's held-only twin answered absent")
    wait_pairs(mesh, a, set(), set())
    before = fetches()
    call(mesh, "client-a", "alpha")
    assert fetches() == before + 1
    wait_pairs(mesh, a, {ALPHA}, set())
    assert pair_state(mesh, a)[0][ALPHA].evidence == "Fetch"


def test_api_down_the_sidecar_admits_from_memory_and_catches_up(mesh: Mesh) -> None:
    """With the API answering 503 to everything, a new pair's first request is still 200 over HTTP/3 (the pair is
    admitted in memory; the write fails and is retried: PairsPersisted=False in the sidecar's log); when the API
    is back the pair lands in the MeshNode and PairsPersisted is True."""
    a = node_a(mesh)
    mesh.add_pod(a, "client-c", sa="gamma")
    gamma = quic_twin(NS, "web", "gamma")
    mesh.kube.wait_meshnode("node-a", lambda o: "client-c" in json.dumps((o.get("status") or {}).get("pods")))
    assert mesh.api is not None
    before = fetches()
    mesh.api.set_down(True)
    try:
        call(mesh, "client-c", "gamma", retry=True)  # retry: the new pod's listeners may still be arriving
        assert fetches() >= before + 1
        log = a.workdir / "sidecar.log"
        wait_for(lambda: "PairsPersisted=False WriteFailed" in log.read_text(), 30, "a failed pair write logged")
        call(mesh, "client-a", "alpha")  # the persisted pair is untouched
    finally:
        mesh.api.set_down(False)
    wait_pairs(mesh, a, {ALPHA, gamma}, set(), timeout=60)
    wait_for(
        lambda: any(
            c.get("type") == "PairsPersisted" and c.get("status") == "True"
            for c in ((mesh.kube.meshnode("node-a") or {}).get("status") or {}).get("conditions") or []
        ),
        60,
        "PairsPersisted=True after the outage",
    )


def test_a_burst_of_first_uses_gets_every_pair_its_own_twin(mesh: Mesh) -> None:
    """An event storm (a rollout): eight new pods, each with its own ServiceAccount, make their first requests at
    the same moment, once each, no retry. Every one is 200 over HTTP/3 on its own twin with its own SPIFFE ID, the
    sidecar admitted exactly eight pairs on fetches (Envoy may ask for several names in one on-demand request), and
    the MeshNode keeps all eight beside the earlier ones."""
    a = node_a(mesh)
    sas = [f"burst-{i}" for i in range(8)]
    for sa in sas:
        mesh.add_pod(a, f"client-{sa}", sa=sa)
    twins = {sa: quic_twin(NS, "web", sa) for sa in sas}
    # every pod's outbound listener and its route arm are in node-a's Envoy (not a fetch: the routes name them all)
    wait_for(
        lambda: (
            all(f"http-outbound:{NS}/client-{sa}" in a.admin("/listeners") for sa in sas)
            and all(t in a.admin("/config_dump?resource=dynamic_route_configs") for t in twins.values())
        ),
        60,
        "the burst pods' listeners and route arms",
    )
    assert not any(envoy_has(mesh, t) for t in twins.values())
    pairs, dormant, _ = pair_state(mesh, a)
    before, admitted = fetches(), admitted_on_fetch()
    start = threading.Barrier(len(sas))
    answers: dict[str, HttpAnswer] = {}
    took: dict[str, float] = {}

    def first(sa: str) -> None:
        start.wait(30)
        t0 = time.monotonic()
        answers[sa] = http_get(mesh.pods[f"client-{sa}"].netns_path, HOST)
        took[sa] = time.monotonic() - t0

    threads = [threading.Thread(target=first, args=(sa,), daemon=True) for sa in sas]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert answers == {sa: HttpAnswer(200, "web-0", spiffe_id(NS, sa)) for sa in sas}, answers
    print(f"burst of {len(sas)} first uses: {min(took.values()) * 1000:.0f}-{max(took.values()) * 1000:.0f} ms")
    for twin in twins.values():
        assert twin_stat(mesh, twin, "upstream_cx_http3_total") == 1 and twin_stat(mesh, twin, "upstream_rq_200") == 1
    requests = fetches() - before
    assert admitted_on_fetch() == admitted + len(sas) and 1 <= requests <= len(sas), (requests, admitted)
    print(f"  {len(sas)} pairs admitted on {requests:.0f} on-demand requests")
    wait_pairs(mesh, a, {*pairs, *twins.values()}, set(dormant))
    cols = printer_columns(mesh, a)
    assert cols is None or cols["QUIC PAIRS"] == str(len(pairs) + len(sas)), cols


def stale_ask(mesh: Mesh, host: str) -> tuple[float, Served]:
    """One request to the stale listener: (seconds it took, its access log line)."""
    a, seen = node_a(mesh), len(served(node_a(mesh).workdir / "stale.log"))
    t0 = time.monotonic()
    got = http_get(a.net.path, host, port=STALE_PORT)
    took = time.monotonic() - t0
    line = wait_for(lambda: served(a.workdir / "stale.log")[seen:], 10, f"{host} in the stale access log")
    assert got.status == 503 and [(x.host, x.status, x.flags) for x in line] == [(host, 503, "NC")], (got, line)
    return took, line[0]


def test_a_bogus_twin_name_is_a_fast_503_and_other_pairs_are_unaffected(mesh: Mesh) -> None:
    """Each name the stale listener routes to (one per refusal reason, and a name that is not a twin): the first
    request is answered absent by the sidecar at once, 503 NC well inside the on-demand timeout, with the refusal
    counted by reason and logged, and no pair. An existing pair and a new pair's first use are 200 over HTTP/3 right
    after. Envoy 1.40 keeps its subscription to a name answered absent and never asks again: a second request to
    it waits the whole timeout, then 503 NC, with nothing new at the sidecar (docs/operations.md#quic-pairs)."""
    a = node_a(mesh)
    timeouts = odcds_timeouts(a.running_envoy())
    timeout = timeouts.pop(LISTENER)
    assert timeouts and set(timeouts.values()) == {timeout}, timeouts  # the sidecar's outbounds: the same timeout
    pairs, dormant, _ = pair_state(mesh, a)
    for host, (name, reason) in STALE.items():
        before, fetched = refusals(), fetches()
        took, line = stale_ask(mesh, host)
        assert took < timeout / 2, f"{host}: {took:.3f} s, on-demand timeout {timeout} s"
        want = {**before, reason: before.get(reason, 0) + 1} if reason else before
        assert (refusals(), fetches()) == (want, fetched + (1 if reason else 0)), host
        why = f"QUIC twin {name} refused (answered absent): {reason}"
        assert (why in (a.workdir / "sidecar.log").read_text()) == bool(reason), why  # logged before the answer
        assert not envoy_has(mesh, name)
        print(f"{host}: {name} -> 503 NC in {took * 1000:.1f} ms (Envoy {line.duration_ms} ms; timeout {timeout} s)")
    call(mesh, "client-a", "alpha")  # an existing pair
    mesh.add_pod(a, "client-d", sa="delta")
    delta = quic_twin(NS, "web", "delta")
    mesh.kube.wait_meshnode("node-a", lambda o: "client-d" in json.dumps((o.get("status") or {}).get("pods")))
    fetched = fetches()
    call(mesh, "client-d", "delta", retry=True)  # a new pair's first use (retry: its listeners may be arriving)
    assert fetches() == fetched + 1
    wait_pairs(mesh, a, {*pairs, delta}, set(dormant))  # written after the refusals: none of them is a pair
    cols = printer_columns(mesh, a)
    assert cols is None or cols["QUIC PAIRS"] == str(len(pairs) + 1), cols
    # the same bogus name again: Envoy does not ask, waits its on-demand timeout, then 503 NC
    before, fetched = refusals(), fetches()
    took, line = stale_ask(mesh, "source-not-local")
    assert took >= timeout * 0.95 and line.duration_ms >= timeout * 1000 * 0.95, (took, line)
    assert (refusals(), fetches()) == (before, fetched)  # the sidecar was not asked
    print(f"source-not-local again: 503 NC in {took * 1000:.1f} ms (Envoy {line.duration_ms} ms)")
    call(mesh, "client-a", "alpha")
