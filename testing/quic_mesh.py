"""The two-node east-west HTTP/3 rig of tests/xds/test_quic_datapath.py: per-source mTLS identity on the real data
path.

Two node netns, each with its own real Envoy 1.40 served over delta ADS by `aether.xds.ads.server`; pods behind veths;
the capture installed in the source pods; the HTTP echo app (`aether.testing.http_echo`, every hit logged) in the
destination pod, returning the XFCC header it got. Node A: pods client-0 (SA client) and other-0 (SA client in
namespace team-b). Node B: pod web-0 (SA web-sa) behind Service default/web, app ports 8080 and 9090.

    with quic_mesh(workdir) as mesh:
        mesh.until_200(mesh.client)
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aether.api.authz import compile_bodies
from aether.api.meshnode import Endpoint, ServiceArm
from aether.netns.contract import CaptureMode, InboundMode, InboundPolicy
from aether.netns.install import install_capture
from aether.testing.eastwest_lab import AdsHarness, http_in_netns, start_echo, start_envoy
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.envoy import Envoy
from aether.testing.netlab import GATEWAY_LL, Lab, Pod, sh
from aether.testing.wait import wait_for
from aether.xds.identity.ca import BuiltinCA
from aether.xds.identity.sds import secrets, svid_secret
from aether.xds.identity.svid import Svid, selector_secret_name, svid_secret_name
from aether.xds.resources import CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, Resources, TranslateOptions, merge
from aether.xds.translate.eastwest.build import EastWestOptions, build
from aether.xds.translate.l4 import udp

TD, MD = "cluster.local", "mesh.example"
OPTS = TranslateOptions(mesh_domain=MD, trust_domain=TD)
CLIENT = f"spiffe://{TD}/ns/default/sa/client"
# the other source: a ServiceAccount with the same name as CLIENT's, in another namespace (`default` in every
# namespace is the common case): its own identity, so its own twin (quic:default/web@team-b/client)
OTHER = f"spiffe://{TD}/ns/team-b/sa/client"
WEB = f"spiffe://{TD}/ns/default/sa/web-sa"
VIP = "10.96.0.20"
VIP_UDP = "10.96.0.30"
HOST = f"web.default.{MD}"
TWIN = "quic:default/web@client"
NODE_A_IP = "10.199.0.1"  # node A's end of the node link: node A's proxy reaches node B's pods from it
QUIC_UPSTREAM_ACTIVE = r"^cluster\.quic_.*\.upstream_cx_active$"  # node A's connections on every twin
# a MeshAuthorizationPolicy on default/web admitting other-0's identity only (client-0 gets 403)
ONLY_OTHER: dict[str, Any] = {
    "apiVersion": "mesh.aether.dev/v1alpha1",
    "kind": "MeshAuthorizationPolicy",
    "metadata": {"name": "web-callers", "namespace": "default"},
    "spec": {"targetRefs": [{"kind": "Service", "name": "web"}], "rules": [{"from": [OTHER], "ports": [8080]}]},
}


@dataclass
class Mesh:
    lab: Lab
    workdir: Path
    ads: AdsHarness
    ca: BuiltinCA
    a: Envoy
    b: Envoy
    client: Pod
    other: Pod
    web: Pod
    hits: Path

    def resources_a(self, *, more_destinations: tuple[str, ...] = (), **kw: Any) -> Resources:
        """Node A's east-west resources; `more_destinations` adds Services (same SA and pod as default/web)."""
        node, records = sample_node(
            "node-a",
            [
                SamplePod("u-client", "client-0", self.client.ip, "client", self.client.path),
                SamplePod("u-other", "other-0", self.other.ip, "client", self.other.path, namespace="team-b"),
            ],
            [
                SampleDestination("default/web", "web-sa", (8080,), (self.web.ip,), vip=VIP),
                *(SampleDestination(f"default/{svc}", "web-sa", (8080,), (self.web.ip,)) for svc in more_destinations),
            ],
        )
        ew = EastWestOptions(access_log_path=str(self.workdir / "access-a.log"), **kw)
        return build(node, records, OPTS, ew)

    def resources_a_with_udp(self) -> Resources:
        """Node A plus the plaintext UDP class (aether.xds.translate.l4.udp): VIP_UDP:18082 -> web-0's app port 8080."""
        node, records = sample_node(
            "node-a",
            [
                SamplePod("u-client", "client-0", self.client.ip, "client", self.client.path),
                SamplePod("u-other", "other-0", self.other.ip, "client", self.other.path, namespace="team-b"),
            ],
            [SampleDestination("default/web", "web-sa", (8080,), (self.web.ip,), vip=VIP)],
        )
        node.status.udp.services = [
            ServiceArm(
                service="default/web-udp",
                vip=VIP_UDP,
                cluster="udp:default/web-udp",
                endpoints=[Endpoint(ip=self.web.ip, port=8080)],
            )
        ]
        return merge(self.resources_a(), udp.build(node, records, OPTS))

    def resources_b(self, policies: Sequence[dict[str, Any]] | None = None) -> Resources:
        """Node B's resources; with `policies` (MeshAuthorizationPolicy bodies, possibly none) node B also knows
        its local Service default/web (8080, 9090 on web-0), the Service policies target."""
        dests = [] if policies is None else [SampleDestination("default/web", "web-sa", (8080, 9090), (self.web.ip,))]
        node, records = sample_node(
            "node-b", [SamplePod("u-web", "web-0", self.web.ip, "web-sa", self.web.path)], dests
        )
        ew = EastWestOptions(access_log_path=str(self.workdir / "access-b.log"), app_ports={"u-web": (8080, 9090)})
        opts = replace(OPTS, authorization=compile_bodies(policies or (), TD))
        return build(node, records, opts, ew)

    def serve_a(self, res: Resources | None = None, secret_overrides: dict[str, dict[str, Any]] | None = None) -> None:
        sec = secrets(self.ca, [CLIENT, OTHER])
        sec[SECRET].update(secret_overrides or {})
        self.ads.set("node-a", res if res is not None else self.resources_a(), sec)

    def serve_b(
        self,
        secret_overrides: dict[str, dict[str, Any]] | None = None,
        res: Resources | None = None,
        policies: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        sec = secrets(self.ca, [WEB])
        sec[SECRET].update(secret_overrides or {})
        self.ads.set("node-b", res if res is not None else self.resources_b(policies), sec)

    def get(
        self, pod: Pod, n: int = 1, via_vip: bool = True, headers: dict[str, str] | None = None
    ) -> list[tuple[int, str]]:
        return http_in_netns(pod.netns, HOST, n=n, ip=VIP if via_vip else "127.0.0.1", headers=headers)

    def access_b(self) -> list[str]:
        path = self.workdir / "access-b.log"
        return path.read_text().splitlines() if path.exists() else []

    def access_b_flushed(self) -> list[str]:
        """Node B's access log once it holds a line for every request node B's inbound listeners completed (the
        file is flushed every 100 ms)."""
        done = self.b.stat_sum(r"^http\.inbound_http[23]\.downstream_rq_completed$")
        wait_for(lambda: len(self.access_b()) >= done, 10, f"{done} lines in node B's access log")
        return self.access_b()

    def app_hits(self) -> int:
        return len(self.hits.read_text().splitlines())

    def app_udp_hits(self) -> int:
        return sum(1 for line in self.hits.read_text().splitlines() if line.startswith("udp 8080"))

    def until_200(self, pod: Pod, timeout: float = 30.0) -> list[tuple[int, str]]:
        """Requests until one answers 200 (after a push, Envoy takes a moment to apply it)."""
        last: list[tuple[int, str]] = []

        def ok() -> list[tuple[int, str]] | None:
            nonlocal last
            last = self.get(pod)
            return last if last[0][0] == 200 else None

        return wait_for(
            ok,
            timeout,
            f"a 200 from {pod.name}",
            interval=0.3,
            diagnose=lambda: f"last answer {last}; node A log: {self.a.log_tail(3000)}",
        )

    def refused(self, why: str) -> None:
        """client-0's requests get no 200, and the app sees none of them."""
        hits = self.app_hits()
        out = self.get(self.client, n=2)
        assert all(s != 200 for s, _ in out), f"{why}: expected refusal, got {out}"
        assert self.app_hits() == hits, f"{why}: the app was reached"

    def with_twin_variant(self, tag: str, change: Callable[[dict[str, Any]], object], **kw: Any) -> Resources:
        """Node A's resources (`kw` as for `resources_a`) where client-0's arm points to a changed copy of its twin
        under a new name (a new name is a fresh EDS subscription: re-pushing a changed twin under its old name warms
        for the 15 s EDS timeout); `change` edits the copy's upstreamTlsContext."""
        res = copy.deepcopy(self.resources_a(**kw))
        name = f"{TWIN}~{tag}"
        twin = copy.deepcopy(res[CLUSTER][TWIN])
        twin["name"] = name
        twin["edsClusterConfig"]["serviceName"] = name
        change(twin["transportSocket"]["typedConfig"]["upstreamTlsContext"])
        res[CLUSTER][name] = twin
        res[ENDPOINT][name] = {**res[ENDPOINT][TWIN], "clusterName": name}
        route = res[ROUTE]["http-outbound"]["virtualHosts"][0]["routes"][0]["route"]
        tree = route["inlineClusterSpecifierPlugin"]["extension"]["typedConfig"]["clusterMatcher"]["matcherTree"]
        tree["exactMatchMap"]["map"][CLIENT]["action"]["typedConfig"]["cluster"] = name
        return res

    # -- inbound enforcement on web-0 ---------------------------------------------------------------------------
    def enforce(self, mode: InboundMode) -> InboundPolicy:
        """web-0's capture with `mode`'s inbound enforcement, the mesh sources a CNI ADD would give it here: its
        gateway (node B itself: kubelet probes, node B's plaintext deliveries; the inbound's hop to the app comes over
        loopback) and node A's address (node A's proxy delivering plaintext UDP)."""
        policy = InboundPolicy(mode, (GATEWAY_LL, NODE_A_IP))
        install_capture(self.web.path, CaptureMode.TPROXY, inbound=policy)
        return policy

    def inbound_counters(self) -> dict[str, int]:
        """web-0's inbound_in counters: `saddr <source>` per mesh source, `drop tcp` / `drop udp` (0 without it)."""
        out: dict[str, int] = {}
        listed = sh("nft", "-j", "list", "table", "inet", "aether", netns=self.web.netns)
        for item in json.loads(listed)["nftables"]:
            rule = item.get("rule")
            if not rule or rule["chain"] != "inbound_in":
                continue
            expr = rule["expr"]
            packets = next((e["counter"]["packets"] for e in expr if "counter" in e), None)
            if packets is None:
                continue
            m = expr[0]["match"]
            if "drop" in expr[-1]:
                out[f"drop {m['right']}"] = packets
            else:
                out[f"saddr {m['right']}"] = packets
        return out

    # -- waiting on Envoy ---------------------------------------------------------------------------------------
    def wait_applied(self, node: Envoy, needle: str, timeout: float = 30.0) -> None:
        wait_for(lambda: needle in node.admin("/config_dump?include_eds"), timeout, f"{needle!r} in {node.node_id}")

    def wait_routed_to(self, cluster: str) -> None:
        wait_for(lambda: cluster in self.a.active_config("dynamic_route_configs"), 30, f"route to {cluster}")

    def wait_synced(self, node: Envoy) -> None:
        """Until `node` runs what the ADS server holds for it: each listener and cluster, and each secret it asked
        for, active at its version (the versions Envoy's config_dump reports are the snapshot's)."""
        snap = self.ads.cache.get(node.node_id)
        assert snap is not None
        want = {t: snap.versions.get(t, {}) for t in (LISTENER, CLUSTER, SECRET)}

        def active() -> dict[str, dict[str, str]]:
            listeners = node.config_dump("dynamic_listeners")["configs"]
            clusters = node.config_dump("dynamic_active_clusters")["configs"]
            secrets_ = node.config_dump("dynamic_active_secrets")["configs"]
            return {
                LISTENER: {c["name"]: c["active_state"]["version_info"] for c in listeners if "active_state" in c},
                CLUSTER: {c["cluster"]["name"]: c["version_info"] for c in clusters},
                SECRET: {c["name"]: c["version_info"] for c in secrets_},
            }

        def missing() -> dict[str, dict[str, str]]:
            have, out = active(), {}
            for t, versions in want.items():
                # secrets come by name, when a listener or cluster asks for one: one never asked for does not count
                stale = {n: v for n, v in versions.items() if have[t].get(n) != v and (t != SECRET or n in have[t])}
                if stale:
                    out[t] = stale
            return out

        wait_for(
            lambda: not missing(),
            30,
            f"{node.node_id} to run the snapshot's versions",
            diagnose=lambda: f"not active at the snapshot's version: {missing()}",
        )

    def bounce_inbound(self, overrides: dict[str, dict[str, Any]] | None = None) -> None:
        """Node B re-binds its inbound QUIC listener (a changed harmless field): the listener drains, the QUIC
        connections from node A close, and the next request needs a new handshake."""
        stamp = 9000 + int(time.monotonic_ns() % 997)
        res = self.resources_b()
        for name, lst in res[LISTENER].items():
            if name.startswith("inbound-h3:"):
                lst["udpListenerConfig"]["downstreamSocketConfig"]["maxRxDatagramSize"] = stamp
        sec = secrets(self.ca, [WEB])
        sec[SECRET].update(overrides or {})
        self.ads.set("node-b", res, sec)
        wait_for(lambda: f"{stamp}" in self.b.active_config("dynamic_listeners"), 30, "B re-bound")
        self.b.wait_drained()  # the old listener is removed after the drain time (2 s), its QUIC connections with it
        wait_for(lambda: self.a.stat_sum(QUIC_UPSTREAM_ACTIVE) == 0, 10, "node A's QUIC connections to B closed")


def two_clusters(mesh: Mesh) -> None:
    """Two clusters' pod networks: no pod route across, only the nodes' link (where a gateway listens) between."""
    sh("ip", "route", "del", f"{mesh.web.ip}/32", netns=mesh.client.node.netns)
    for pod in (mesh.client, mesh.other):
        sh("ip", "route", "del", f"{pod.ip}/32", netns=mesh.web.node.netns)


def without_rbac(res: Resources) -> Resources:
    """`res` with the RBAC filter taken out of every inbound HCM (the inbound as it was before authorization; the
    negative control of the `rbac-enforced` gate, and the bench's baseline)."""
    out = copy.deepcopy(res)
    for name, lst in out[LISTENER].items():
        if not name.startswith("inbound-"):
            continue
        for chain in lst["filterChains"]:
            hcm = chain["filters"][0]["typedConfig"]
            hcm["httpFilters"] = [f for f in hcm["httpFilters"] if f["name"] != "envoy.filters.http.rbac"]
    return out


def wait_in_place(node: Envoy, before: int, listeners: int = 2) -> None:
    """Until `listeners` more in-place listener updates happened on `node` (a filter-chain-only change), drained.
    Envoy 1.40's config_dump keeps reporting such a listener's previous version, so versions cannot say it."""
    wait_for(
        lambda: node.stat("listener_manager.listener_in_place_updated") >= before + listeners,
        30,
        f"{listeners} in-place listener updates on {node.node_id}",
    )
    node.wait_drained()


def as_names(svid: Svid, spiffe_id: str) -> dict[str, dict[str, Any]]:
    """`svid` served under both of `spiffe_id`'s secret names."""
    return {n: svid_secret(svid, n) for n in (svid_secret_name(spiffe_id), selector_secret_name(spiffe_id))}


def quic_chain_counters(node: Envoy) -> int:
    """Connections any QUIC listener of this node accepted (the inbound QUIC chains)."""
    return node.stat_sum(r"^http\.inbound_http3\.downstream_cx_total$") + node.stat_sum(
        r"^listener\.[0-9.]+_18008\.http3\.downstream\.rx\..*"
    )


@contextlib.contextmanager
def quic_mesh(workdir: Path) -> Iterator[Mesh]:
    """The two nodes, their pods, the echo app and both Envoys, LIVE on their first snapshots; all gone on exit."""
    lab = Lab()
    ads = AdsHarness(workdir)
    try:
        na, nb = lab.add_node("qa"), lab.add_node("qb")
        client = lab.add_pod(na, "client-0", "10.200.1.2")
        other = lab.add_pod(na, "other-0", "10.200.1.3")
        web = lab.add_pod(nb, "web-0", "10.200.2.7")
        lab.link_nodes(na, nb, "10.199.0.1", "10.199.0.2")
        for pod in (client, other):
            install_capture(pod.path, CaptureMode.TPROXY)
        hits = workdir / "hits.log"
        start_echo(lab, web, (8080, 9090), hits)
        ca = BuiltinCA(TD, MD)
        a = start_envoy(lab, na.netns, "node-a", workdir, ads)
        b = start_envoy(lab, nb.netns, "node-b", workdir, ads)
        m = Mesh(lab, workdir, ads, ca, a, b, client, other, web, hits)
        m.serve_a()
        m.serve_b()
        a.wait_live()
        b.wait_live()
        yield m
    finally:
        ads.close()
        lab.close()
