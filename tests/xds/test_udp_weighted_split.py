"""A weighted UDP arm on the real data path (one node, real Envoy, the real capture; the MeshNode written by hand):
the split cluster's localities spread new sessions by weight, a locality without weight (weight 0) takes none while
its sessions finish, an invalid backendRef's share is dropped (its locality's endpoint answers nothing), a draining
endpoint takes no new session without moving its backend's share, and a changed weight moves new sessions only. The operator side and both API versions: tests/e2e/test_e2e_udp_weights.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from aether.api.meshnode import ArmBackend, Endpoint, MeshNode, ServiceArm
from aether.api.naming import udp_split_cluster
from aether.netns.contract import L4_OUTBOUND_PORT
from aether.testing.netlab import Lab, Pod
from aether.testing.nodebed import NodeBed, udp_socket_in, wait_reply
from aether.testing.split_probe import NO_REPLY, locality_weights, probe_split, sticky_backends
from aether.testing.wait import wait_for

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]

SPLIT_VIP = "10.96.10.1"
CLUSTER = udp_split_cluster("default", "split")
PORT = 5353


@dataclass
class Bed:
    node: NodeBed
    client: Pod

    def set_split(self, weights: dict[str, int], invalid: dict[str, int] | None = None) -> None:
        """The split arm with these weights (backend name -> weight) plus invalid backendRefs with theirs."""
        total = sum(weights.values()) + sum((invalid or {}).values())
        backends = [
            ArmBackend(
                backend=f"default/{name}",
                weight=w,
                share=round(100.0 * w / total, 2) if total else 0.0,
                endpoints=[Endpoint(ip=self.node.services[name].backend.ip, port=PORT)],
                reason="Drained" if w == 0 else None,
            )
            for name, w in weights.items()
        ]
        backends += [
            ArmBackend(backend=f"default/{name}", weight=w, share=round(100.0 * w / total, 2), reason="BackendNotFound")
            for name, w in (invalid or {}).items()
        ]
        arm = ServiceArm(service="default/split", vip=SPLIT_VIP, cluster=CLUSTER, route="default/r", backends=backends)
        node: MeshNode = self.node.meshnode(extra_arms=[arm])
        self.node.write_state(node)
        want = {b.backend: b.weight for b in backends}

        def programmed() -> bool:
            return locality_weights(json.loads(self.node.admin("/config_dump?include_eds")), CLUSTER) == want

        wait_for(programmed, timeout=30, what=f"weights {want} in Envoy's EDS")


def _draining(nb: NodeBed) -> set[str]:
    """The split cluster's hosts Envoy holds as draining (their EDS health status in `/clusters`)."""
    return {ip for ip, status in nb.running_envoy().host_health(CLUSTER).items() if status == "draining"}


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    lab = Lab()
    try:
        nb = NodeBed(lab, tmp_path_factory.mktemp("udp-split"))
        client = nb.add_client("client-0")
        for name in ("a", "b", "c"):
            nb.add_service(name, f"10.96.10.{10 + ord(name) - ord('a')}", PORT)
        nb.write_state(nb.meshnode())
        nb.start_sidecar()
        nb.start_envoy()
        nb.wait_programmed()
        b = Bed(nb, client)
        b.set_split({"a": 70, "b": 30, "c": 0})
        sock = udp_socket_in(client.path)
        try:
            wait_reply(sock, SPLIT_VIP, b"")
        finally:
            sock.close()
        yield b
    finally:
        lab.close()


def test_new_sessions_split_by_weight_and_weight_zero_gets_none(bed: Bed) -> None:
    bed.set_split({"a": 70, "b": 30, "c": 0})
    split = probe_split(bed.client.path, SPLIT_VIP, L4_OUTBOUND_PORT, 500)
    print(f"\n70/30/0, 500 fresh sessions:\n{split.table()}")
    assert abs(split.share("a") - 70) <= 5 and abs(split.share("b") - 30) <= 5, split.table()
    assert split.by_backend["c"] == 0 and split.by_backend[NO_REPLY] == 0, split.table()


def test_a_session_sticks_and_changing_weights_moves_new_sessions_only(bed: Bed) -> None:
    bed.set_split({"a": 50, "b": 50, "c": 0})
    socks = [udp_socket_in(bed.client.path) for _ in range(20)]
    try:
        first = [sticky_backends(s, SPLIT_VIP, L4_OUTBOUND_PORT, 5) for s in socks]
        assert all(len(seen) == 1 and NO_REPLY not in seen for seen in first), first
        owner = [next(iter(seen)) for seen in first]
        assert {"a", "b"} <= set(owner), owner
        # every new session to c now; the open ones keep their backend (same cluster, same hosts: no session ends)
        bed.set_split({"a": 0, "b": 0, "c": 100})
        again = [sticky_backends(s, SPLIT_VIP, L4_OUTBOUND_PORT, 3) for s in socks]
        assert [next(iter(seen)) for seen in again] == owner and all(len(s) == 1 for s in again), again
        fresh = probe_split(bed.client.path, SPLIT_VIP, L4_OUTBOUND_PORT, 50)
        assert fresh.by_backend == {"c": 50}, fresh.table()
    finally:
        for s in socks:
            s.close()


def test_an_invalid_backends_share_is_dropped(bed: Bed) -> None:
    bed.set_split({"a": 20}, invalid={"missing": 80})
    split = probe_split(bed.client.path, SPLIT_VIP, L4_OUTBOUND_PORT, 200, timeout=0.5)
    print(f"\n80 (missing) / 20 (a), 200 fresh sessions:\n{split.table()}")
    assert abs(split.share(NO_REPLY) - 80) <= 5 and abs(split.share("a") - 20) <= 5, split.table()
    assert set(split.by_backend) == {"a", NO_REPLY}


def test_all_weights_zero_takes_no_new_session_and_drained_sessions_finish(bed: Bed) -> None:
    """Negative control seen red: without the weight-1 drop locality Envoy fell back to all hosts (10/10/10)."""
    bed.set_split({"a": 100, "b": 0, "c": 0})
    sock = udp_socket_in(bed.client.path)
    try:
        assert sticky_backends(sock, SPLIT_VIP, L4_OUTBOUND_PORT, 2) == {"a": 2}
        bed.set_split({"a": 0, "b": 0, "c": 0})
        split = probe_split(bed.client.path, SPLIT_VIP, L4_OUTBOUND_PORT, 30, timeout=0.5)
        assert split.by_backend == {NO_REPLY: 30}, split.table()
        assert sticky_backends(sock, SPLIT_VIP, L4_OUTBOUND_PORT, 2) == {"a": 2}  # the open session finishes
    finally:
        sock.close()


def test_a_valid_backend_without_endpoints_loses_its_share_instead_of_handing_it_on(bed: Bed) -> None:
    """b has weight but no ready endpoint: its share is dropped (a locality without hosts would leave the schedule
    and, with nothing else weighted, Envoy would fall back to the drained a)."""
    backends = [
        ArmBackend(
            backend="default/a",
            weight=0,
            share=0,
            endpoints=[Endpoint(ip=bed.node.services["a"].backend.ip, port=PORT)],
            reason="Drained",
        ),
        ArmBackend(backend="default/b", weight=100, share=100.0),
    ]
    arm = ServiceArm(service="default/split", vip=SPLIT_VIP, cluster=CLUSTER, route="default/r", backends=backends)
    bed.node.write_state(bed.node.meshnode(extra_arms=[arm]))
    wait_for(
        lambda: '"port_value": 0' in bed.node.admin("/config_dump?include_eds").replace("portValue", "port_value"),
        timeout=30,
        what="the drop endpoint in EDS",
    )
    split = probe_split(bed.client.path, SPLIT_VIP, L4_OUTBOUND_PORT, 30, timeout=0.5)
    assert split.by_backend == {NO_REPLY: 30}, split.table()


def test_a_backends_endpoint_count_does_not_move_its_share(bed: Bed) -> None:
    """Backend a with two endpoints (the a and c pods) and b with one, weights 50/50: half the new sessions reach
    a's pods (split between them), half reach b: Envoy picks the locality by weight, then a host inside it."""
    nb = bed.node
    backends = [
        ArmBackend(
            backend="default/a",
            weight=50,
            share=50.0,
            endpoints=[Endpoint(ip=nb.services[n].backend.ip, port=PORT) for n in ("a", "c")],
        ),
        ArmBackend(
            backend="default/b", weight=50, share=50.0, endpoints=[Endpoint(ip=nb.services["b"].backend.ip, port=PORT)]
        ),
    ]
    arm = ServiceArm(service="default/split", vip=SPLIT_VIP, cluster=CLUSTER, route="default/r", backends=backends)
    nb.write_state(nb.meshnode(extra_arms=[arm]))
    wait_for(
        lambda: json.loads(nb.admin("/config_dump?include_eds")).__str__().count(nb.services["c"].backend.ip) == 1,
        timeout=30,
        what="a's second endpoint in EDS",
    )
    split = probe_split(bed.client.path, SPLIT_VIP, L4_OUTBOUND_PORT, 200)
    print(f"\n50/50, a with two endpoints, 200 fresh sessions:\n{split.table()}")
    a_side = split.by_backend["a"] + split.by_backend["c"]
    assert abs(100.0 * a_side / 200 - 50) <= 5 and abs(split.share("b") - 50) <= 5, split.table()
    assert split.by_backend["a"] > 0 and split.by_backend["c"] > 0, split.table()


def test_a_draining_endpoint_takes_no_new_session_and_its_backend_keeps_its_share(bed: Bed) -> None:
    """Backend a with one ready endpoint (the a pod) and one draining (the c pod: terminating, still serving), b
    with one, weights 50/50: a's half goes to its ready pod alone. Envoy scales a locality's weight by its healthy
    fraction; were the draining host counted as an unhealthy one, a would drop to 35/85 of new sessions (Envoy's
    overprovisioning factor is 1.4); it is excluded from load balancing instead, so a keeps its half."""
    nb = bed.node
    ip = {n: nb.services[n].backend.ip for n in ("a", "b", "c")}
    backends = [
        ArmBackend(
            backend="default/a",
            weight=50,
            share=50.0,
            endpoints=[Endpoint(ip=ip["a"], port=PORT), Endpoint(ip=ip["c"], port=PORT, draining=True)],
        ),
        ArmBackend(backend="default/b", weight=50, share=50.0, endpoints=[Endpoint(ip=ip["b"], port=PORT)]),
    ]
    arm = ServiceArm(service="default/split", vip=SPLIT_VIP, cluster=CLUSTER, route="default/r", backends=backends)
    nb.write_state(nb.meshnode(extra_arms=[arm]))
    wait_for(lambda: _draining(nb) == {ip["c"]}, timeout=30, what="c draining in Envoy's cluster")
    split = probe_split(bed.client.path, SPLIT_VIP, L4_OUTBOUND_PORT, 200)
    print(f"\n50/50, a with a ready and a draining endpoint, 200 fresh sessions:\n{split.table()}")
    assert split.by_backend["c"] == 0 and split.by_backend[NO_REPLY] == 0, split.table()
    assert abs(split.share("a") - 50) <= 5 and abs(split.share("b") - 50) <= 5, split.table()


def test_most_endpoints_draining_leave_new_sessions_on_the_ready_one(bed: Bed) -> None:
    """One ready endpoint and two draining (a rolling update stopping two of three pods at once): every new session
    goes to the ready one. Envoy enters panic mode (every host, healthy or not) below 50% healthy hosts; draining
    hosts are excluded from that count, so the default threshold needs no change."""
    nb = bed.node
    ip = {n: nb.services[n].backend.ip for n in ("a", "b", "c")}
    eps = [Endpoint(ip=ip["a"], port=PORT), *(Endpoint(ip=ip[n], port=PORT, draining=True) for n in ("b", "c"))]
    backends = [ArmBackend(backend="default/a", weight=100, share=100.0, endpoints=eps)]
    arm = ServiceArm(service="default/split", vip=SPLIT_VIP, cluster=CLUSTER, route="default/r", backends=backends)
    nb.write_state(nb.meshnode(extra_arms=[arm]))
    wait_for(lambda: _draining(nb) == {ip["b"], ip["c"]}, timeout=30, what="b and c draining in Envoy's cluster")
    split = probe_split(bed.client.path, SPLIT_VIP, L4_OUTBOUND_PORT, 100)
    assert split.by_backend == {"a": 100}, split.table()


def test_going_from_one_backend_to_a_split_restarts_open_sessions(bed: Bed) -> None:
    """What docs/operator.md says about a route changing shape: the arm's cluster changes (udp:<backend> ->
    udp-split:<parent>), so the pods' capture listeners are rebuilt and an open session starts over on its next
    datagram, picked by the new weights (here: every new session to b)."""
    nb = bed.node
    plain = ServiceArm(
        service="default/split",
        vip=SPLIT_VIP,
        cluster="udp:default/a",
        backend="default/a",
        route="default/r",
        endpoints=[Endpoint(ip=nb.services["a"].backend.ip, port=PORT)],
    )
    nb.write_state(nb.meshnode(extra_arms=[plain]))
    # the plain arm in Envoy's active listeners first (an answer from a alone could still come from the old split,
    # and two state writes close together reach Envoy as one)
    wait_for(
        lambda: (
            CLUSTER not in (text := nb.running_envoy().active_config("dynamic_listeners")) and "udp:default/a" in text
        ),
        timeout=30,
        what="the listeners routing the VIP to udp:default/a",
    )
    sock = udp_socket_in(bed.client.path)
    try:
        wait_for(lambda: sticky_backends(sock, SPLIT_VIP, L4_OUTBOUND_PORT, 1) == {"a": 1}, timeout=30, what="a")
        bed.set_split({"a": 0, "b": 100})
        wait_for(
            lambda: sticky_backends(sock, SPLIT_VIP, L4_OUTBOUND_PORT, 1) == {"b": 1},
            timeout=30,
            what="the open socket's next datagram on b (a new session)",
        )
    finally:
        sock.close()
