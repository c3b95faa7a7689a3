"""`aether demo --clusters 2`: one mesh over two clusters on this machine (e2e/clusters.py: two real control
planes, both operators, A's gateway node the only address B reaches) and the cross-cluster table: who called,
the callee's cluster, the transport the request took, and what the app received."""

from __future__ import annotations

import errno
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass

from aether.api.naming import spiffe_id
from aether.e2e.clusters import H2_ONLY, H2_PEER, NS, PEER, TwoClusters, two_clusters
from aether.testing.probe import HttpAnswer

Say = Callable[[str], None]
TWIN_H3 = "cluster.quic_shop/web@client.upstream_rq_total"  # client-0's own HTTP/3 twin, through UDP 18009
GATEWAY_H2 = "tcp.east_west_gateway.downstream_cx_total"  # A's gateway's TCP 18009 passthrough
H2 = "h2 via TCP 18009"


@dataclass(frozen=True)
class Row:
    caller: str
    callee: str
    transport: str
    received: str
    expected: bool

    def line(self) -> str:
        verdict = "as expected" if self.expected else "UNEXPECTED"
        return f"  {self.caller:<30} {self.callee:<48} {self.transport:<44} {self.received:<58} {verdict}"


def _transport(tc: TwoClusters, call: Callable[[], HttpAnswer]) -> tuple[HttpAnswer, str]:
    """Make the call and say which way it went, from the counters it moved."""
    b = tc.b.nodes["b-client"]
    h3, h2 = b.stat(TWIN_H3), tc.gateway_stat(GATEWAY_H2)
    got = call()
    if b.stat(TWIN_H3) > h3:
        return got, f"HTTP/3, quic:{NS}/web@client via UDP 18009"
    if tc.gateway_stat(GATEWAY_H2) > h2:
        return got, H2
    return got, "-"


def _received(got: HttpAnswer) -> str:
    if got.status == 200:
        return f"{got.backend} (200), XFCC {got.spiffe_id}"
    return f"{got.status}" if got.status is not None else "no answer"


def _uri(xfcc: str) -> str:
    return xfcc.rpartition("URI=")[2].split(";")[0] or "-"


def _direct(tc: TwoClusters) -> Row:
    """client-0 straight to web-0's address: no route between the clusters' pods."""
    web0, code = tc.a.pods["web-0"].ip, tc.direct_to_web0()
    got = "no route (ENETUNREACH)" if code == errno.ENETUNREACH else f"errno {code}"
    return Row(f"B {NS}/client-0", f"{web0}:8080 directly ({PEER})", "- (pod to pod)", got, code == errno.ENETUNREACH)


def table(tc: TwoClusters) -> list[Row]:
    client = spiffe_id(NS, "client")
    caller, callee = f"B {NS}/client-0", f"{NS}/web in {PEER} ({tc.gateway})"
    got, how = _transport(tc, lambda: tc.b_get("client-0", timeout=60))
    rows = [Row(caller, callee, how, _received(got), got == HttpAnswer(200, "web-0", client))]
    tc.a.kube.authorization_policy(NS, "web-callers", "web", [spiffe_id(NS, "someone-else")])
    try:
        got, how = _transport(tc, lambda: tc.b_get("client-0", want=403, timeout=60))
        rows.append(Row(caller, f"{callee}, policy in A", how, f"{_received(got)} (RBAC in {PEER})", got.status == 403))
    finally:
        tc.api_a.delete("mesh.aether.dev/v1alpha1", "MeshAuthorizationPolicy", "web-callers", NS)
    tc.b_get("client-0", timeout=60)  # the policy's removal has reached A's inbound (200 again) before the next row
    status, body = tc.h2_via_tcp()
    seen = f"{body.get('backend')} ({status}), XFCC {_uri(body.get('xfcc', ''))}" if status == 200 else str(status)
    h2_ok = status == 200 and f"URI={client}" in body.get("xfcc", "")
    rows.append(Row(f"B {NS}/client-0's SVID (curl)", callee, H2, seen, h2_ok))
    got, how = _transport(tc, lambda: tc.b_get("client-0", service=H2_ONLY, timeout=60))
    h2_only = f"{NS}/{H2_ONLY} in {H2_PEER} (transports: [h2])"
    rows.append(Row(caller, h2_only, how, _received(got), got == HttpAnswer(200, "web-0", client) and how == H2))
    rows.append(_direct(tc))
    return rows


def run(say: Say, kind: str = "real", keep: bool = False) -> int:
    """The two-cluster demo; 1 with a message when it cannot run here (it needs the real control plane)."""
    if kind != "real" or keep:
        print("aether demo: --clusters 2 runs two real control planes (make k8s) and has no --keep", file=sys.stderr)
        return 1
    tags = ("ae" + secrets.token_hex(3), "ae" + secrets.token_hex(3))
    print(f"aether demo: two clusters, lab tags {tags[0]} {tags[1]}", flush=True)
    with two_clusters(say, tags) as tc:
        print(f"aether demo: working directories {tc.a.dir} {tc.b.dir}", flush=True)
        say(
            f"A exports {NS}/web (ServiceExport; a-gw labelled the gateway), B imports it (MeshPeer {PEER}, ServiceImport)"
        )
        rows = table(tc)
        print("\nCross-cluster calls (B -> A, only A's gateway address routes between them):")
        print(f"  {'caller':<30} {'callee (cluster)':<48} {'transport':<44} {'the app received':<58} verdict")
        for r in rows:
            print(r.line())
        ok = all(r.expected for r in rows)
        good = "the caller's own SPIFFE ID crossed the gateway; A's policy applied across; no pod route between"
        print(f"\nresult: {good if ok else 'SOMETHING UNEXPECTED (see above)'}", flush=True)
    return 0 if ok else 1
