"""The sidecar's in-kernel UDP path without privileges: which arms select it (pure plan), the worker that programs
each meshed pod's netns (a recording `program` in place of `program_kernel_udp`), and the Programmed condition
naming a pod netns whose rules failed, then recovering."""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aether.api.meshnode import Condition, ServiceArm, UdpDataplane
from aether.netns.kernel_udp import KernelArm, KernelBackend
from aether.netns.kernel_udp_install import KernelUdpError, apply_kernel_udp
from aether.testing.kernel_udp_effects import RecordingKernelUdp
from aether.testing.samples import node_with, records_for
from aether.testing.wait import wait_for
from aether.xds.ads.cache import SnapshotCache
from aether.xds.resources import TranslateOptions
from aether.xds.sidecar.kernel_path import KernelUdpPath, changes, kernel_plan
from aether.xds.sidecar.loop import Sidecar

L4 = TranslateOptions(areas=("udp", "tcp-floor"))
REFUSED = "Error: Could not process rule: Operation not supported"


@dataclass
class Netns:
    """One recorded netns per path: what it holds and every program call (netns, VIPs, previous VIPs)."""

    held: dict[str, tuple[KernelArm, ...]] = field(default_factory=dict)
    calls: list[tuple[str, list[str], list[str]]] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)
    idle: float | None = None  # the last call's default_idle_timeout_s

    def program(
        self,
        netns_path: str,
        arms: Sequence[KernelArm],
        *,
        previous: Sequence[KernelArm] = (),
        default_idle_timeout_s: float | None = None,
    ) -> int:
        self.idle = default_idle_timeout_s
        self.calls.append((netns_path, [a.vip for a in arms], [a.vip for a in previous]))
        if netns_path in self.refuse:
            raise KernelUdpError(
                f"nft refused the kernel UDP rules for {netns_path} (the previous rules stay): {REFUSED}"
            )
        self.held[netns_path] = tuple(arms)
        return 0


def kpath(default: UdpDataplane, **kw: Any) -> KernelUdpPath:
    """A KernelUdpPath whose netns paths all exist (the recorded ones are not files)."""
    return KernelUdpPath(default, **({"path_exists": lambda _: True} | kw))


def kernel(arm: ServiceArm, plane: str | None = "kernel") -> ServiceArm:
    return arm.model_copy(update={"dataplane": plane})


def test_the_plan_takes_the_arms_that_select_kernel_and_the_pods_with_a_record() -> None:
    node = node_with(4, 3)
    arms = node.status.udp.services
    arms[0] = kernel(arms[0])
    arms[1] = kernel(arms[1], "envoy")
    six = "fd00:96:0::000a"  # not compressed: the counters name it fd00:96::a
    arms[2] = kernel(
        arms[2].model_copy(update={"vip": six, "cluster": "udp:default/svc-2@ipv6", "idle_timeout_seconds": 5.0})
    )
    arms[3] = kernel(arms[3].model_copy(update={"cluster": "tcp:default/svc-3"}))
    records = records_for(node)
    del records["u2"]  # no CNI record yet: not programmed
    plan = kernel_plan(node, records, "envoy")
    first = KernelArm(arms[0].vip, (KernelBackend(arms[0].endpoints[0].ip, 5353, 1),))
    assert plan.arms == (first, KernelArm(six, (KernelBackend(arms[2].endpoints[0].ip, 5353, 1),), 5.0))
    assert plan.services == {arms[0].vip: "default/svc-0", "fd00:96::a": "default/svc-2"}  # as counters name it
    assert {uid: t.name for uid, t in plan.pods.items()} == {"u0": "default/client-0", "u1": "default/client-1"}
    assert plan.selected
    everything = kernel_plan(node, records, "kernel")  # the node's default: every plaintext UDP arm but 1's
    assert [a.vip for a in everything.arms] == [arms[0].vip, six]
    arms[1] = kernel(arms[1], None)
    assert [a.vip for a in kernel_plan(node, records, "kernel").arms] == [arms[0].vip, arms[1].vip, six]
    assert not kernel_plan(node_with(2, 1), records, "envoy").selected


def test_each_pod_gets_the_arms_then_only_changes_with_what_it_last_got() -> None:
    ns = Netns()
    path = kpath("kernel", program=ns.program, idle_timeout_s=60.0)
    node = node_with(2, 2)
    records = records_for(node)
    path.apply(kernel_plan(node, records, path.default))
    assert ns.idle == 60.0  # the node's --udp-idle-timeout, for arms without their own
    v0, v1 = (a.vip for a in node.status.udp.services)
    assert ns.calls == [("/run/netns/test-client-0", [v0, v1], []), ("/run/netns/test-client-1", [v0, v1], [])]
    path.apply(kernel_plan(node, records, path.default))
    assert len(ns.calls) == 2  # nothing changed: no nft call
    node.status.udp.services[1] = kernel(node.status.udp.services[1], "envoy")
    path.apply(kernel_plan(node, records, path.default))
    assert ns.calls[2:] == [("/run/netns/test-client-0", [v0], [v0, v1]), ("/run/netns/test-client-1", [v0], [v0, v1])]
    node.status.pods = node.status.pods[:1]  # client-1 left: forgotten, its netns untouched
    node.status.udp.services = [kernel(a, "envoy") for a in node.status.udp.services]
    path.apply(kernel_plan(node, records, path.default))
    assert ns.calls[4:] == [("/run/netns/test-client-0", [], [v0])]  # no arm selects kernel: an empty table
    assert set(path.applied) == {"u0"}


def test_a_node_that_never_selected_kernel_only_clears_leftovers_once_at_start() -> None:
    ns = Netns()
    removed: list[str] = []

    def remove(netns: str) -> None:
        removed.append(netns)
        if netns.endswith("client-1"):
            raise KernelUdpError("setns: Operation not permitted")  # a sidecar without the privileges

    path = kpath("envoy", program=ns.program, remove=remove)
    node = node_with(3, 2)
    records = records_for(node)
    path.apply(kernel_plan(node, records, path.default))
    assert removed == ["/run/netns/test-client-0", "/run/netns/test-client-1"] and ns.calls == []
    assert {u: a.arms for u, a in path.applied.items()} == {"u0": ()} and path.failures == {}
    node.status.pods.append(node_with(1, 3).status.pods[2])
    path.apply(kernel_plan(node, records_for(node), path.default))
    assert len(removed) == 2 and ns.calls == []  # a later pod never had a table: nothing to do


def test_a_refused_netns_is_reported_keeps_its_rules_and_recovers() -> None:
    ns = Netns()
    seen: list[tuple[str, ...]] = []
    path = kpath("kernel", program=ns.program, on_problems=seen.append)
    node = node_with(1, 2)
    records = records_for(node)
    path.apply(kernel_plan(node, records, path.default))
    first = ns.held["/run/netns/test-client-1"]
    ns.refuse.add("/run/netns/test-client-1")
    node.status.udp.services.append(kernel(node_with(2, 0).status.udp.services[1]))
    path.apply(kernel_plan(node, records, path.default))
    (problem,) = seen[-1]
    assert "pod default/client-1" in problem and REFUSED in problem and "previous rules stay" in problem
    assert ns.held["/run/netns/test-client-1"] == first  # what it held before (the installer keeps it)
    assert path.applied["u1"].arms == first  # and the next try's `previous` is still that
    assert len(ns.held["/run/netns/test-client-0"]) == 2  # the other pod got the change
    ns.refuse.clear()
    path.apply(kernel_plan(node, records, path.default))  # a retry (the worker's RETRY_S, or the next change)
    assert seen[-1] == () and len(ns.held["/run/netns/test-client-1"]) == 2
    assert ns.calls[-1] == (
        "/run/netns/test-client-1",
        [a.vip for a in ns.held["/run/netns/test-client-0"]],
        [first[0].vip],
    )


class Sink:
    def __init__(self) -> None:
        self.seen: list[Condition] = []

    def publish(self, node_name: str, conditions: list[Condition]) -> None:
        self.seen.append(conditions[0])


def test_programmed_names_the_failed_pod_netns_and_recovers() -> None:
    ns = Netns(refuse={"/run/netns/test-client-1"})
    path = kpath("kernel", program=ns.program, retry_s=0.05)
    sc = Sidecar("node-a", SnapshotCache(), Sink(), options=L4, path_exists=lambda _: True, kernel=path)
    node = node_with(2, 2)
    sc.on_records(records_for(node))
    sc.on_state(node)
    assert path.wait_idle(10)
    assert sc.served_version is not None
    sc.on_ack("node-a", "type.googleapis.com/envoy.config.listener.v3.Listener", sc.served_version)
    cond = sc.condition
    assert cond is not None and (cond.status, cond.reason) == ("False", "KernelRulesFailed"), cond
    assert f"Envoy accepted version {sc.served_version}" in cond.message
    assert "pod default/client-1" in cond.message and REFUSED in cond.message
    ns.refuse.clear()  # the worker retries on its own
    wait_for(lambda: sc.condition is not None and sc.condition.status == "True", 10, "Programmed back to True")
    assert sc.condition is not None and sc.condition.reason == "Accepted"
    assert len(ns.held["/run/netns/test-client-1"]) == 2
    path.close()


def test_with_the_recording_effects_a_refused_transaction_keeps_the_table_and_is_reported() -> None:
    """The installer's own logic (apply_kernel_udp) on a recorded netns per pod: nft refuses client-1's update, its
    table stays what it held, Programmed's input names it with nft's error; the next apply recovers."""
    fx = {p: RecordingKernelUdp() for p in ("/run/netns/test-client-0", "/run/netns/test-client-1")}

    def program(
        netns_path: str,
        arms: Sequence[KernelArm],
        *,
        previous: Sequence[KernelArm] = (),
        default_idle_timeout_s: float | None = None,
    ) -> int:
        return apply_kernel_udp(
            fx[netns_path], netns_path, arms, previous, default_idle_timeout_s=default_idle_timeout_s
        )

    seen: list[tuple[str, ...]] = []
    path = kpath("kernel", program=program, on_problems=seen.append, idle_timeout_s=60.0)
    node = node_with(1, 2)
    records = records_for(node)
    path.apply(kernel_plan(node, records, path.default))
    held = copy.deepcopy(fx["/run/netns/test-client-1"].tables)
    fx["/run/netns/test-client-1"].refuse = True
    node.status.udp.services.append(node_with(2, 0).status.udp.services[1])
    path.apply(kernel_plan(node, records, path.default))
    (problem,) = seen[-1]
    assert "pod default/client-1" in problem and "Operation not supported" in problem, problem
    assert fx["/run/netns/test-client-1"].tables == held  # all or nothing: the previous rules stay
    assert fx["/run/netns/test-client-0"].tables != held  # the other pod took the change
    fx["/run/netns/test-client-1"].refuse = False
    path.apply(kernel_plan(node, records, path.default))
    assert seen[-1] == () and fx["/run/netns/test-client-1"].tables == fx["/run/netns/test-client-0"].tables


def test_programmed_names_a_few_failed_pods_and_counts_the_rest() -> None:
    ns = Netns(refuse={f"/run/netns/test-client-{i}" for i in range(8)})
    seen: list[tuple[str, ...]] = []
    path = kpath("kernel", program=ns.program, on_problems=seen.append)
    node = node_with(1, 8)
    path.apply(kernel_plan(node, records_for(node), path.default))
    assert len(seen[-1]) == 6 and all("kernel UDP rules not applied in pod" in p for p in seen[-1][:5])
    assert seen[-1][5] == "and 3 more pod netns (the sidecar's log names each)"


def test_an_ipv6_arm_is_programmed_and_a_failed_pod_settles_when_kernel_is_no_longer_selected() -> None:
    ns = Netns(refuse={"/run/netns/test-client-0"})
    seen: list[tuple[str, ...]] = []
    path = kpath("envoy", program=ns.program, remove=lambda _: None, on_problems=seen.append)
    node = node_with(1, 1)
    six = "fd00:96:0::000a"  # not compressed: the log line and the metrics look it up as fd00:96::a
    node.status.udp.services[0] = kernel(node.status.udp.services[0].model_copy(update={"vip": six}))
    records = records_for(node)
    path.apply(kernel_plan(node, records, path.default))
    assert [len(p) for p in seen] == [1]  # refused
    ns.refuse.clear()
    node.status.udp.services[0] = kernel(node.status.udp.services[0], None)  # back to the node's default: envoy
    path.apply(kernel_plan(node, records, path.default))
    assert seen[-1] == () and ns.calls[-1] == ("/run/netns/test-client-0", [], [])  # settled with an empty table
    node.status.udp.services[0] = kernel(node.status.udp.services[0])
    path.apply(kernel_plan(node, records, path.default))
    assert ns.calls[-1] == ("/run/netns/test-client-0", [six], [])


def test_a_pod_whose_netns_is_gone_is_not_a_failure() -> None:
    """A pod being deleted: its netns went before its record and the MeshNode's entry; Programmed must not flap."""
    ns = Netns(refuse={"/run/netns/test-client-1"})
    seen: list[tuple[str, ...]] = []
    gone = {"/run/netns/test-client-1"}
    path = kpath("kernel", program=ns.program, on_problems=seen.append, path_exists=lambda p: p not in gone)
    node = node_with(1, 2)
    path.apply(kernel_plan(node, records_for(node), path.default))
    assert seen == [] and path.failures == {} and set(path.applied) == {"u0"}
    gone.clear()  # a netns that exists and refuses is a failure
    path.apply(kernel_plan(node, records_for(node), path.default))
    assert len(seen) == 1 and "pod default/client-1" in seen[0][0]


def test_a_kernel_failure_joins_a_slices_incomplete_message_at_once() -> None:
    from aether.xds.sidecar.programmed import Programmed

    p = Programmed("node-a", None)
    p.new_state(("MeshServiceSlice default.1 is missing",))
    p.serving("v1", {})
    p.acked("v1")
    assert p.condition is not None and p.condition.reason == "SlicesIncomplete"
    p.kernel_rules(("kernel UDP rules not applied in pod default/client-0: nft said no",))
    assert p.condition is not None and "pod default/client-0" in p.condition.message
    p.new_state(())
    p.serving("v1", {})
    assert p.condition is not None and (p.condition.status, p.condition.reason) == ("False", "KernelRulesFailed")
    p.kernel_rules(())
    assert p.condition is not None and (p.condition.status, p.condition.reason) == ("True", "Accepted")


def test_the_log_line_names_what_changed() -> None:
    a = KernelArm("10.96.0.10", (KernelBackend("10.1.0.1", 53, 1),))
    b = KernelArm("10.96.0.11", (KernelBackend("10.1.0.2", 53, 70), KernelBackend("0.0.0.0", 1, 30, valid=False)))
    names = {"10.96.0.10": "app/a", "10.96.0.11": "app/b"}
    assert changes((), [a, b], names) == (
        "changed: app/a 10.96.0.10 [10.1.0.1:53], app/b 10.96.0.11 [10.1.0.2:53 w70, 1 dropped]"
    )
    assert changes([a, b], [a._replace(backends=())], names) == "changed: app/a 10.96.0.10 []; removed: 10.96.0.11"
    assert changes([a], [a], names) == "nothing changed"


def test_programmed_waits_for_the_kernel_worker_before_turning_true() -> None:
    """An ACK of the served version leaves Programmed Pending while the worker has not applied that state to the
    pod netns; it turns True when the worker reports the latest submission applied (a stale report changes
    nothing). A node that never used the kernel path is not held back."""
    release = threading.Event()
    ns = Netns()

    def slow(netns_path: str, arms: Sequence[KernelArm], **kw: Any) -> int:
        release.wait(10)
        return ns.program(netns_path, arms, **kw)

    path = kpath("kernel", program=slow)
    sc = Sidecar("node-a", SnapshotCache(), Sink(), options=L4, path_exists=lambda _: True, kernel=path)
    node = node_with(2, 1)
    sc.on_records(records_for(node))
    sc.on_state(node)
    assert sc.served_version is not None
    sc.on_ack("node-a", "type.googleapis.com/envoy.config.listener.v3.Listener", sc.served_version)
    cond = sc.condition
    assert cond is not None and (cond.status, cond.reason) == ("Unknown", "Pending"), cond
    assert "kernel UDP rules are still being applied" in cond.message
    sc._kernel_idle(path.submitted - 1)  # a report about an older submission
    assert sc.condition is not None and sc.condition.status == "Unknown"
    release.set()
    wait_for(lambda: sc.condition is not None and sc.condition.status == "True", 10, "Programmed True once applied")
    assert len(ns.held["/run/netns/test-client-0"]) == 2
    path.close()
    plain = Sidecar("node-a", SnapshotCache(), Sink(), options=L4, path_exists=lambda _: True, kernel=kpath("envoy"))
    plain.on_records(records_for(node))
    plain.on_state(node)
    assert plain.served_version is not None
    plain.on_ack("node-a", "type.googleapis.com/envoy.config.listener.v3.Listener", plain.served_version)
    assert plain.condition is not None and plain.condition.status == "True"  # no kernel: True at the ACK
