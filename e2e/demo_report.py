"""What `aether demo` prints (pure: values in, text out)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aether.netns.contract import L4_OUTBOUND_PORT
from aether.testing.probe import Answer, HttpAnswer


@dataclass(frozen=True)
class Row:
    client: str
    service: str
    answer: Answer
    expected: str | None  # the backend that should answer; None: nobody should
    before: str | None = None  # who answered before a change, when this row shows one

    @property
    def ok(self) -> bool:
        if self.expected is None:
            return self.answer.backend is None
        return self.answer.backend == self.expected and self.answer.from_vip


def _reply(a: Answer) -> str:
    return f"{a.source[0]}:{a.source[1]}" if a.source else "-"


def table(rows: Sequence[Row]) -> str:
    head = ("client pod", "dials service", "VIP:port", "answered by", "reply from", "")
    body = []
    for r in rows:
        note = "as expected" if r.ok else "UNEXPECTED"
        if r.before is not None and r.before != r.answer.backend:
            note += f" (was {r.before})"
        body.append(
            (
                r.client,
                r.service,
                f"{r.answer.vip}:{L4_OUTBOUND_PORT}",
                r.answer.backend or "no reply",
                _reply(r.answer),
                note,
            )
        )
    return _render(head, body)


SPLIT_TOLERANCE = 5.0  # percentage points, as the Gateway API conformance suite's weighted-route test allows


def split_ok(weights: dict[str, int], by_backend: dict[str, int], probes: int) -> bool:
    """Every backend's observed share of `probes` fresh sessions within SPLIT_TOLERANCE of its weight's."""
    total = sum(weights.values())
    names = set(weights) | set(by_backend)
    return probes > 0 and all(
        abs(100.0 * by_backend.get(n, 0) / probes - 100.0 * weights.get(n, 0) / total) <= SPLIT_TOLERANCE for n in names
    )


def split_table(weights: dict[str, int], by_backend: dict[str, int], probes: int) -> str:
    """backend | weight | expected share | sessions | observed share | verdict, one row per backend (and no reply)."""
    total = sum(weights.values())
    head = ("backend", "weight", "expected", "sessions", "observed", "")
    body = []
    for name in [*weights, *sorted(set(by_backend) - set(weights))]:
        want = 100.0 * weights.get(name, 0) / total if total else 0.0
        got = 100.0 * by_backend.get(name, 0) / probes if probes else 0.0
        note = "as expected" if abs(got - want) <= SPLIT_TOLERANCE else "UNEXPECTED"
        body.append(
            (name, str(weights.get(name, "-")), f"{want:.0f}%", str(by_backend.get(name, 0)), f"{got:.1f}%", note)
        )
    return _render(head, body)


def _render(head: tuple[str, ...], body: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(str(x[i])) for x in (head, *body)) for i in range(len(head))]
    lines = [
        "  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in (head, *body)
    ]
    lines.insert(1, "  " + "  ".join("-" * w for w in widths[:-1]))
    return "\n".join(lines)


def keep_instructions(
    kubeconfig: str,
    client_netns: str,
    vip: str,
    python: str,
    aether: str,
    web_host: str = "web.demo.mesh.aether.internal",
) -> str:
    send = (
        f'ip netns exec {client_netns} {python} -c "import socket; s=socket.socket(2,2); s.settimeout(2); '
        f"s.sendto(b'hello', ('{vip}', {L4_OUTBOUND_PORT})); print(s.recvfrom(100))\""
    )
    get = (
        f"ip netns exec {client_netns} {python} -c \"import http.client as h; c=h.HTTPConnection('127.0.0.1', 18080); "
        f"c.request('GET', '/', headers={{'Host': '{web_host}'}}); print(c.getresponse().read().decode())\""
    )
    return "\n".join(
        [
            "The mesh keeps running (--keep). Try:",
            f"  export KUBECONFIG={kubeconfig}",
            "  kubectl get meshnodes                     # pods / UDP services / QUIC pairs per node",
            "  kubectl get meshnode node-1 -o yaml       # the operator's desired state for the node",
            "  kubectl get udproutes -n demo -o yaml     # route status written by the operator",
            "  kubectl patch udproute bravo-route -n demo --type merge \\",
            '    -p \'{"spec":{"rules":[{"backendRefs":[{"name":"alpha","port":18082}]}]}}\'',
            "Send a datagram yourself from the client pod (the reply names the backend that answered):",
            f"  {send}",
            f"  ({aether} capture check --netns /run/netns/{client_netns} shows the capture is in place)",
            "Call the HTTP app over the client's HTTP/3 twin (it answers with the SPIFFE ID it received):",
            f"  {get}",
            "Press Ctrl-C to stop: every netns, process and file the demo made is removed.",
        ]
    )


@dataclass(frozen=True)
class IdentityRow:
    client: str
    host: str
    answer: HttpAnswer
    expected_id: str
    twin: str
    over_http3: bool  # the twin's upstream HTTP/3 request counter moved during this request

    @property
    def ok(self) -> bool:
        return self.answer.status == 200 and self.answer.spiffe_id == self.expected_id and self.over_http3


def identity_table(rows: Sequence[IdentityRow]) -> str:
    head = ("client pod", "GET http://<host>:18080/", "answered by", "carried by", "SPIFFE ID the app received", "")
    body = []
    for r in rows:
        status = f"{r.answer.backend} ({r.answer.status})" if r.answer.status is not None else "no answer"
        via = f"{r.twin} HTTP/3" if r.over_http3 else "not the HTTP/3 twin"
        body.append((r.client, r.host, status, via, r.answer.spiffe_id or "-", "as expected" if r.ok else "UNEXPECTED"))
    return _render(head, body)


@dataclass(frozen=True)
class AccessRow:
    """One call to the HTTP app: directly to its pod (around the mesh) or through the mesh, under a policy."""

    client: str
    path: str  # what was called, how
    answer: HttpAnswer
    expected: int | None  # the status it should get; None: no answer at all (dropped)
    why: str  # what decides it

    @property
    def ok(self) -> bool:
        return self.answer.status == self.expected


def access_table(rows: Sequence[AccessRow]) -> str:
    head = ("client pod", "calls", "answer", "because", "")
    body = []
    for r in rows:
        got = "no answer" if r.answer.status is None else f"{r.answer.status}"
        if r.answer.status == 200 and r.answer.spiffe_id:
            got += f" (app saw {r.answer.spiffe_id})"
        body.append((r.client, r.path, got, r.why, "as expected" if r.ok else "UNEXPECTED"))
    return _render(head, body)


@dataclass(frozen=True)
class PairRow:
    """One entry of the MeshNode's status.quic.pairs (or dormantPairs), and whether the demo expects it there."""

    source: str
    destination: str
    twin: str
    evidence: str | None  # what admitted it
    last: str | None  # lastEvidence kind
    expected: bool
    dormant: bool = False

    @property
    def ok(self) -> bool:
        return self.expected and not self.dormant and self.evidence in ("Fetch", "Resubscribe")


def pair_table(rows: Sequence[PairRow]) -> str:
    head = ("source (SPIFFE ID)", "destination", "twin", "evidence", "last evidence", "")
    body = [
        (
            r.source,
            r.destination + (" (dormant)" if r.dormant else ""),
            r.twin,
            r.evidence or "-",
            r.last or "-",
            "as expected" if r.ok else "UNEXPECTED",
        )
        for r in rows
    ]
    return _render(head, body)
