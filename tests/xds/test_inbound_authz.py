"""Authorization by identity on the real data path (the rig: `aether.testing.quic_mesh`): node B's inbound for web-0
enforces MeshAuthorizationPolicies with Envoy's RBAC HTTP filter, over HTTP/3 (twins) and h2 alike. client-0 runs as
spiffe://cluster.local/ns/default/sa/client, other-0 as .../ns/team-b/sa/client.

- allowed 200 (the app sees the caller), denied 403 (the app sees nothing), both protocols, each in the JSON access
  log with the RBAC verdict and the policy that allowed it;
- no policy: any identity of the trust domain (today's behaviour); an invalid policy fails closed on its Service;
- a policy change while client-0's traffic flows on one connection: every request answers 200, no listener is
  modified and node A opens no new upstream connection (the change is a route update over RDS);
- without the RBAC filter Envoy accepts the rules on the routes and ignores them (the `rbac-enforced` gate's negative
  control: red on the data path, refused by the gate);
- the real Envoy accepts the RBAC it is given (`--mode validate` on the TCP inbound with its routes inline, and the
  ACKed snapshots above, the QUIC listener included).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aether.testing.eastwest_lab import client_result, start_client, xfcc_uri
from aether.testing.envoy import Envoy, validate
from aether.testing.quic_mesh import CLIENT, HOST, OTHER, TWIN, VIP, Mesh, quic_mesh, wait_in_place, without_rbac
from aether.testing.wait import wait_for
from aether.xds.gates.authz import rbac_enforced
from aether.xds.resources import CLUSTER, LISTENER, ROUTE, Resources
from aether.xds.sidecar.bootstrap import static_bootstrap
from aether.xds.translate.eastwest.rbac import POLICY_DENY

pytestmark = [pytest.mark.privileged, pytest.mark.envoy, pytest.mark.slow]
TD = "cluster.local"


def policy(name: str, sources: list[str], ports: list[int] | None = None, target: str = "web") -> dict[str, Any]:
    rule: dict[str, Any] = {"from": sources}
    if ports is not None:
        rule["ports"] = ports
    return {
        "apiVersion": "mesh.aether.dev/v1alpha1",
        "kind": "MeshAuthorizationPolicy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"targetRefs": [{"kind": "Service", "name": target}], "rules": [rule]},
    }


ONLY_CLIENT = [policy("web-callers", [CLIENT], [8080])]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with quic_mesh(tmp_path_factory.mktemp("authz")) as m:
        yield m


def json_lines(node: Envoy) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in node.log_path.read_text(errors="replace").splitlines()
        if line.startswith("{") and '"aether-inbound"' in line
    ]


def serve_b_synced(mesh: Mesh, policies: list[dict[str, Any]] | None) -> None:
    """Serve node B `policies` and wait until its Envoy runs the snapshot, its inbound routes (RDS) included."""
    mesh.serve_b(policies=policies)
    mesh.wait_synced(mesh.b)
    snap = mesh.ads.cache.get("node-b")
    assert snap is not None
    want = {n: v for n, v in snap.versions.get(ROUTE, {}).items() if n.startswith("inbound:")}

    def active() -> dict[str, str]:
        dump = mesh.b.config_dump("dynamic_route_configs").get("configs", [])
        return {c["route_config"]["name"]: c["version_info"] for c in dump if "route_config" in c}

    wait_for(
        lambda: all(active().get(n) == v for n, v in want.items()),
        30,
        "node B's inbound routes at the snapshot's versions",
        diagnose=lambda: f"want {want}, active {active()}",
    )


def status_and_seen(mesh: Mesh, pod: Any) -> tuple[int, str | None]:
    ((status, body),) = mesh.get(pod)
    return status, (xfcc_uri(body) if status == 200 else None)


def check_allowed_and_denied(mesh: Mesh, protocol: str) -> None:
    mesh.until_200(mesh.client)
    before = len(json_lines(mesh.b))
    hits = mesh.app_hits()
    assert status_and_seen(mesh, mesh.client) == (200, CLIENT)
    assert mesh.app_hits() == hits + 1
    ((status, body),) = mesh.get(mesh.other)
    assert status == 403 and "RBAC" in body, (status, body)
    assert mesh.app_hits() == hits + 1  # the denied request never reached the app

    # Envoy's stdout is flushed on its own schedule: an earlier request's line may come after `before`
    def pair() -> tuple[dict[str, Any], dict[str, Any]] | None:
        lines = json_lines(mesh.b)[before:]
        denied = [i for i, line in enumerate(lines) if line["source"] == OTHER]
        allowed = [line for line in lines[: denied[-1]] if line["source"] == CLIENT] if denied else []
        return (allowed[-1], lines[denied[-1]]) if allowed else None

    allowed, denied = wait_for(pair, 10, "client-0's and other-0's lines in node B's stdout")
    assert (allowed["source"], allowed["protocol"], allowed["status"]) == (CLIENT, protocol, 200), allowed
    assert (allowed["rbac"], allowed["rbacPolicy"]) == ("allowed", "default/web-callers"), allowed
    assert (denied["source"], denied["protocol"], denied["status"]) == (OTHER, protocol, 403), denied
    assert (denied["rbac"], denied["rbacPolicy"], denied["identity"]) == ("denied", POLICY_DENY, "allowed"), denied
    assert denied["responseCodeDetails"] == f"rbac_access_denied_matched_policy[{POLICY_DENY}]", denied


def test_allowed_200_denied_403_over_http3_and_h2(mesh: Mesh) -> None:
    serve_b_synced(mesh, ONLY_CLIENT)
    try:
        check_allowed_and_denied(mesh, "HTTP/3")
        mesh.serve_a(mesh.resources_a(quic=False))
        wait_for(lambda: TWIN not in mesh.a.admin("/clusters"), 30, "twins gone")
        check_allowed_and_denied(mesh, "HTTP/2")
    finally:
        mesh.serve_a()
        mesh.wait_applied(mesh.a, TWIN)


def test_no_policy_admits_the_trust_domain_and_an_invalid_one_fails_closed(mesh: Mesh) -> None:
    serve_b_synced(mesh, [])  # web known, no policy: any identity of the trust domain
    mesh.until_200(mesh.other)
    before = len(json_lines(mesh.b))
    assert status_and_seen(mesh, mesh.client) == (200, CLIENT)
    assert status_and_seen(mesh, mesh.other) == (200, OTHER)

    def others_line() -> dict[str, Any] | None:  # lines come as Envoy flushes them, not always in request order
        found = [line for line in json_lines(mesh.b)[before:] if line["source"] == OTHER]
        return found[-1] if found else None

    line = wait_for(others_line, 10, "other-0's line in node B's stdout")
    assert line["status"] == 200, line
    assert line["rbac"] is None and line["rbacPolicy"] is None, line  # no policy guards the port: no verdict
    assert line["identity"] == "allowed", line  # but the one-SPIFFE-ID check ran
    serve_b_synced(mesh, [policy("open-to-all", ["*"])])  # not Accepted: allows nothing, still closes web
    assert mesh.get(mesh.client)[0][0] == 403
    assert mesh.get(mesh.other)[0][0] == 403
    serve_b_synced(mesh, [policy("ghost", [CLIENT], target="no-such-service")])  # targets nothing here
    assert mesh.get(mesh.other)[0][0] == 200


def test_a_policy_change_while_traffic_flows_keeps_allowed_connections(mesh: Mesh) -> None:
    serve_b_synced(mesh, ONLY_CLIENT)
    mesh.until_200(mesh.client)
    assert mesh.get(mesh.other)[0][0] == 403
    modified = mesh.b.stat("listener_manager.listener_modified")
    upstream = mesh.a.stat_sum(r"^cluster\.quic_default/web@client\.upstream_cx_total$")
    traffic = start_client(mesh.lab, mesh.client.netns, HOST, n=150, ip=VIP, pause=0.02)
    try:
        serve_b_synced(mesh, [*ONLY_CLIENT, policy("team-b", [f"spiffe://{TD}/ns/team-b/sa/*"])])
        wait_for(lambda: mesh.get(mesh.other)[0][0] == 200, 30, "other-0 allowed by the new policy")
        serve_b_synced(mesh, ONLY_CLIENT)
        wait_for(lambda: mesh.get(mesh.other)[0][0] == 403, 30, "other-0 denied again")
    finally:
        results = client_result(traffic)
    assert [s for s, _ in results] == [200] * 150, [r for r in results if r[0] != 200][:3]
    assert {xfcc_uri(b) for _, b in results} == {CLIENT}
    assert mesh.b.stat("listener_manager.listener_modified") == modified  # routes changed, no listener
    assert mesh.a.stat_sum(r"^cluster\.quic_default/web@client\.upstream_cx_total$") == upstream  # no reconnect


def test_without_the_filter_the_rules_are_silently_ignored_and_the_gate_refuses(mesh: Mesh) -> None:
    """The `rbac-enforced` gate's negative control: node B's inbound with the policy's rules on its routes but no
    RBAC filter in its HCMs is accepted by Envoy and lets the denied source in (red); the gate refuses that state."""
    serve_b_synced(mesh, ONLY_CLIENT)
    assert mesh.get(mesh.other)[0][0] == 403
    good = mesh.resources_b(ONLY_CLIENT)
    assert rbac_enforced(good) == []
    broken = without_rbac(good)
    assert [f.gate for f in rbac_enforced(broken)] == ["rbac-enforced"] * 6  # 3 chains x 2 inbound listeners
    updates = mesh.b.stat("listener_manager.listener_in_place_updated")
    try:
        mesh.serve_b(res=broken)
        wait_in_place(mesh.b, updates)
        wait_for(lambda: mesh.get(mesh.other)[0][0] == 200, 30, "the denied source let in (the silent failure)")
    finally:
        updates = mesh.b.stat("listener_manager.listener_in_place_updated")
        mesh.serve_b(policies=ONLY_CLIENT)
        wait_in_place(mesh.b, updates)
    wait_for(lambda: mesh.get(mesh.other)[0][0] == 403, 30, "denied again with the filter back")


def inline_tcp_inbound(res: Resources) -> dict[str, Any]:
    """Node B's TCP inbound as a static bootstrap: its routes inline (no RDS), no TLS (its SDS secrets come over
    ADS), the app clusters; what `--mode validate` can load."""
    listeners = []
    for name, lst in res[LISTENER].items():
        if not name.startswith("inbound-h2:"):
            continue
        lst = copy.deepcopy(lst)
        lst["address"]["socketAddress"].pop("networkNamespaceFilepath")
        for chain in lst["filterChains"]:
            chain.pop("transportSocket")
            hcm = chain["filters"][0]["typedConfig"]
            hcm["routeConfig"] = res[ROUTE][hcm.pop("rds")["routeConfigName"]]
        listeners.append(lst)
    clusters = {k: v for k, v in res[CLUSTER].items() if k.startswith("inbound:")}
    return static_bootstrap("node-b", {LISTENER: {lst["name"]: lst for lst in listeners}, CLUSTER: clusters})


def test_envoy_validates_the_rbac_it_is_given(mesh: Mesh, tmp_path: Path) -> None:
    big = policy("big", [f"spiffe://{TD}/ns/ns{i}/sa/sa{j}" for i in range(8) for j in range(8)])
    big["spec"]["rules"] *= 64  # 64 rules x 64 sources: the most a policy may hold
    res = mesh.resources_b([*ONLY_CLIENT, policy("team", [f"spiffe://{TD}/ns/team-b/sa/*"], [9090]), big])
    out = validate(inline_tcp_inbound(res))
    assert out.returncode == 0, out.stdout + out.stderr
    broken = copy.deepcopy(res)
    route = broken[ROUTE]["inbound:default/web-0:8080"]["virtualHosts"][0]["routes"][0]
    no_match = route["typedPerFilterConfig"]["envoy.filters.http.rbac"]["rbac"]["matcher"]["onNoMatch"]
    no_match["action"]["typedConfig"]["action"] = "PERMIT"
    out = validate(inline_tcp_inbound(broken))
    assert out.returncode != 0 and "PERMIT" in out.stdout + out.stderr  # validation is not silently green
