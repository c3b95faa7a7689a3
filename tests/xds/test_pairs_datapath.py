"""A refused twin name with a real Envoy: node A's proxy is served by the sidecar itself (its pair machine on the
ADS server's hooks), node B by the rig (`aether.testing.quic_mesh`). Node A's MeshNode lists two destinations,
default/web and default/web2 (same pod and ServiceAccount behind both), and also lists default/web as ineligible:
the routes still name web's twins (the destinations build them), so a request to web makes Envoy fetch a twin
name the check refuses (DestinationIneligible). That is the only way a real Envoy asks for a name that fails the
check (its routes name valid twins only): here it stands for any refused name.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from aether.api.meshnode import Condition, IneligibleDestination, QuicPair
from aether.metrics import REGISTRY
from aether.testing.eastwest_lab import http_in_netns, xfcc_uri
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.quic_mesh import CLIENT, MD, OPTS, VIP, Mesh, quic_mesh
from aether.testing.wait import wait_for
from aether.xds.sidecar.loop import Sidecar
from aether.xds.sidecar.secrets import SecretKeeper

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

REFUSED = "quic:default/web@client"
GOOD = "quic:default/web2@client"
UNANNOUNCED = "quic:default/web3@client"


class Sink:
    def __init__(self) -> None:
        self.pairs: list[list[QuicPair]] = []

    def publish(self, node_name: str, conditions: list[Condition]) -> None:
        pass

    def publish_pairs(self, node_name: str, pairs: list[QuicPair], dormant: list[QuicPair]) -> None:
        self.pairs.append(pairs)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mesh, Sidecar, Sink]]:
    with quic_mesh(tmp_path_factory.mktemp("pairs")) as mesh:
        node, records = sample_node(
            "node-a",
            [SamplePod("u-client", "client-0", mesh.client.ip, "client", mesh.client.path)],
            [
                SampleDestination("default/web", "web-sa", (8080,), (mesh.web.ip,), vip=VIP),
                SampleDestination("default/web2", "web-sa", (8080,), (mesh.web.ip,)),
                SampleDestination("default/web3", "web-sa", (8080,), (mesh.web.ip,)),
            ],
            dialled=False,
        )
        node.status.quic.ineligible = [IneligibleDestination(service="default/web", reason="NoReadyEndpoints")]
        sink = Sink()
        sidecar = Sidecar("node-a", mesh.ads.cache, sink, options=OPTS, secrets=SecretKeeper(mesh.ca))
        mesh.ads.servicer.events = sidecar
        mesh.ads.servicer.on_demand = sidecar.on_demand
        sidecar.on_records(records)
        sidecar.on_state(node)
        # the rig's up-front twins leave node A's Envoy (they were held through the wildcard only)
        wait_for(lambda: "quic:default/web@" not in mesh.a.admin("/clusters"), 30, "the rig's twins gone")
        try:
            yield mesh, sidecar, sink
        finally:
            if sidecar.pair_writer is not None:
                sidecar.pair_writer.close()


def _eds_updates(mesh: Mesh, twin: str) -> tuple[int, int]:
    """(update_success, update_no_rebuild) of a twin's EDS subscription in node A's Envoy."""
    stats = mesh.a.stats("quic_default")
    key = f"cluster.{twin.replace(':', '_')}"
    return stats.get(f"{key}.update_success", 0), stats.get(f"{key}.update_no_rebuild", 0)


def _refusals() -> float:
    return REGISTRY.get_sample_value("aether_quic_pair_refusals_total", {"reason": "DestinationIneligible"}) or 0.0


def test_a_refused_twin_is_a_fast_503_and_other_pairs_are_unaffected(served: tuple[Mesh, Sidecar, Sink]) -> None:
    mesh, sidecar, sink = served
    before = _refusals()
    t0 = time.monotonic()
    (status, _), *_ = http_in_netns(mesh.client.netns, f"web.default.{MD}", ip=VIP)
    took = time.monotonic() - t0
    assert status == 503 and _refusals() == before + 1
    assert took < 1.0, f"{took:.2f} s: answered absent at once, not after the 2 s on-demand timeout"
    # another pair of the same source: fetched, admitted, 200 over HTTP/3 with its SPIFFE ID
    (status, body), *_ = http_in_netns(mesh.client.netns, f"web2.default.{MD}", ip="127.0.0.1")
    assert (status, xfcc_uri(body)) == (200, CLIENT)
    stats = mesh.a.stats("quic_default")
    assert stats.get(f"cluster.{GOOD.replace(':', '_')}.upstream_cx_http3_total", 0) >= 1, stats
    assert sidecar.pairs.state is not None
    assert GOOD in sidecar.pairs.state.twins() and REFUSED not in sidecar.pairs.state.twins()
    wait_for(lambda: sink.pairs and [p.twin for p in sink.pairs[-1]] == [GOOD], 10, "only the good pair persisted")
    # the twin warmed from its announced load assignment (sent right after the twin, before Envoy subscribed):
    # Envoy took it, then the copy answering its subscription, which changed nothing
    assert _eds_updates(mesh, GOOD) == (2, 1)


def test_without_the_announce_the_twin_takes_one_load_assignment(served: tuple[Mesh, Sidecar, Sink]) -> None:
    """The negative control of the check above (`--announce off`): the twin's load assignment goes out only when
    Envoy asks, so its EDS subscription sees one update, and the first use is still 200 over HTTP/3."""
    mesh, _, _ = served
    mesh.ads.servicer.announce = False
    try:
        (status, body), *_ = http_in_netns(mesh.client.netns, f"web3.default.{MD}", ip="127.0.0.1")
    finally:
        mesh.ads.servicer.announce = True
    assert (status, xfcc_uri(body)) == (200, CLIENT)
    assert _eds_updates(mesh, UNANNOUNCED) == (1, 0)


def test_a_refused_name_is_never_asked_again_and_is_published_once_it_passes(
    served: tuple[Mesh, Sidecar, Sink],
) -> None:
    """Envoy 1.40 keeps its subscription to a name answered absent and never asks again: the next request to it
    waits the whole on-demand timeout (2 s) and 503s (the edge the lifecycle exists for; seen here). When the
    name passes the check later, the sidecar admits it on the fetch that subscribed it and pushes the twin with
    no new request: Envoy takes it, and the next request is 200 over HTTP/3."""
    mesh, sidecar, _ = served
    t0 = time.monotonic()
    (status, _), *_ = http_in_netns(mesh.client.netns, f"web.default.{MD}", ip=VIP)
    assert status == 503 and time.monotonic() - t0 >= 1.9  # the on-demand timeout: Envoy did not ask again
    node = sidecar.desired
    assert node is not None
    fixed = node.model_copy(deep=True)
    fixed.status.quic.ineligible = []
    sidecar.on_state(fixed)  # web becomes eligible
    wait_for(lambda: f"{REFUSED}::" in mesh.a.admin("/clusters"), 30, "the refused twin published with no request")
    (status, body), *_ = http_in_netns(mesh.client.netns, f"web.default.{MD}", ip=VIP)
    assert (status, xfcc_uri(body)) == (200, CLIENT)
    stats = mesh.a.stats("quic_default")
    assert stats.get(f"cluster.{REFUSED.replace(':', '_')}.upstream_cx_http3_total", 0) >= 1, stats
