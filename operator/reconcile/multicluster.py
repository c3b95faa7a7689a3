"""Discovery across clusters, pure (docs/architecture.md#discovery-across-clusters): typed views of ServiceExport,
ServiceImport (KEP-1645, mcs-api v1beta1) and our MeshPeer, what an import adds to its namespace's tables (a QUIC
destination reached through the peer's gateways), and the status each export and import should have.

Parsing never raises: what cannot be used becomes a problem, and the object's status says why."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from aether.api import multicluster as mc
from aether.api.meshnode import QuicDestination
from aether.api.naming import ref
from aether.operator.reconcile.views import Raw, ServiceView, _d, _l, _meta, _port, _s

PEERS = "*peers"  # the pseudo-namespace a namespace result "reads" when it looks a MeshPeer up (no namespace has *)


@dataclass(frozen=True, slots=True)
class ExportView:
    namespace: str
    name: str
    generation: int = 0
    uid: str = field(default="", compare=False)
    # compared (not hashed): kopf's index keeps its old value when the new one compares equal, and the status loop
    # compares the stored status with what it computes
    status: Raw | None = field(default=None, hash=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class ImportView:
    namespace: str
    name: str
    peer: str | None
    service_account: str | None
    ports: tuple[int, ...]  # spec.ports with protocol TCP (the default): what the gateway carries
    type: str
    generation: int = 0
    problems: tuple[str, ...] = ()
    uid: str = field(default="", compare=False)
    status: Raw | None = field(default=None, hash=False)  # compared: as ExportView's

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class PeerView:
    name: str
    gateways: tuple[str, ...]
    trust_domain: str | None = None
    problems: tuple[str, ...] = ()
    transports: tuple[str, ...] = mc.TRANSPORTS  # what its gateways offer (spec.transports)


def _transports(value: object) -> tuple[tuple[str, ...], list[str]]:
    """spec.transports (default h3 and h2), and what is wrong with it."""
    if value is None:
        return mc.TRANSPORTS, []
    got = tuple(dict.fromkeys(str(t) for t in _l(value)))
    unknown = [t for t in got if t not in mc.TRANSPORTS]
    if unknown:
        return got, [f"spec.transports: {', '.join(unknown)} is not h3 or h2"]
    if "h2" not in got:
        return got, ["spec.transports must list h2: every east-west gateway serves TCP 18009"]
    return got, []


def _generation(meta: Raw) -> int:
    g = meta.get("generation")
    return g if isinstance(g, int) and not isinstance(g, bool) else 0


def _status(obj: Raw) -> Raw | None:
    st = obj.get("status")
    return dict(st) if isinstance(st, dict) else None


def parse_export(obj: Raw) -> ExportView:
    meta = _meta(obj)
    ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    return ExportView(ns, name, _generation(meta), str(meta.get("uid") or ""), _status(obj))


def parse_import(obj: Raw) -> ImportView:
    meta, spec = _meta(obj), _d(obj.get("spec"))
    notes = _d(meta.get("annotations"))
    problems, ports = [], []
    for i, p in enumerate(_l(spec.get("ports"))):
        p = _d(p)
        port = _port(p.get("port"))
        if port is None:
            problems.append(f"spec.ports[{i}].port {p.get('port')!r} is not a port number")
        elif p.get("protocol", "TCP") == "TCP":
            ports.append(port)
    return ImportView(
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        _s(notes.get(mc.PEER_ANNOTATION)),
        _s(notes.get(mc.SERVICE_ACCOUNT_ANNOTATION)),
        tuple(sorted(set(ports))),
        str(spec.get("type") or ""),
        _generation(meta),
        tuple(problems),
        str(meta.get("uid") or ""),
        _status(obj),
    )


def parse_peer(obj: Raw) -> PeerView:
    meta, spec = _meta(obj), _d(obj.get("spec"))
    gateways, problems = [], []
    for g in _l(spec.get("gateways"))[: mc.MAX_GATEWAYS]:
        try:
            gateways.append(str(ipaddress.ip_address(g)))
        except ValueError:
            problems.append(f"spec.gateways: {g!r} is not an IP address")
    if not gateways and not problems:
        problems.append("spec.gateways is empty")
    transports, wrong = _transports(spec.get("transports"))
    name, td = str(meta.get("name", "")), _s(spec.get("trustDomain"))
    return PeerView(name, tuple(gateways), td, (*problems, *wrong), transports)


@dataclass(frozen=True)
class ImportVerdict:
    """What one ServiceImport becomes: a destination (Ready) or the reason it is not one."""

    destination: QuicDestination | None
    reason: str
    message: str
    cluster: str | None = None  # the peer it names: status.clusters


def import_verdict(
    imp: ImportView, peer: PeerView | None, local: ServiceView | None, trust_domain: str
) -> ImportVerdict:
    """A ServiceImport as a QUIC destination reached through its peer's gateways on 18009 (no endpoint of its own),
    or why not: the checks in the order a user would fix them."""
    cluster = imp.peer
    if imp.peer is None:
        return ImportVerdict(None, mc.NO_PEER, f"annotation {mc.PEER_ANNOTATION} names no MeshPeer", None)
    if peer is None:
        return ImportVerdict(None, mc.UNKNOWN_PEER, f"MeshPeer {imp.peer} does not exist", cluster)
    if peer.problems or not peer.gateways:
        return ImportVerdict(None, mc.UNKNOWN_PEER, f"MeshPeer {imp.peer}: {'; '.join(peer.problems)}", cluster)
    if peer.trust_domain not in (None, trust_domain):
        message = (
            f"MeshPeer {imp.peer} is in trust domain {peer.trust_domain}; only {trust_domain} (a shared root) is "
            "built: federating bundles is not"
        )
        return ImportVerdict(None, mc.UNKNOWN_PEER, message, cluster)
    if imp.type not in ("", "ClusterSetIP"):
        return ImportVerdict(None, mc.INVALID_TYPE, f"spec.type {imp.type}: only ClusterSetIP is served", cluster)
    if not imp.ports:
        why = "; ".join(imp.problems) or "spec.ports has no TCP port"
        return ImportVerdict(None, mc.NO_PORTS, why, cluster)
    if imp.service_account is None:
        message = f"annotation {mc.SERVICE_ACCOUNT_ANNOTATION} is missing: the SNI and pinned identity need it"
        return ImportVerdict(None, mc.NO_SERVICE_ACCOUNT, message, cluster)
    if local is not None and local.ports_of("TCP"):
        message = f"Service {ref(local.namespace, local.name)} of this cluster has the name: the local one is served"
        return ImportVerdict(None, mc.LOCAL_SERVICE, message, cluster)
    dest = QuicDestination(
        service=ref(imp.namespace, imp.name),
        service_account=imp.service_account,
        ports=list(imp.ports),
        gateways=list(peer.gateways),
        gateway_transports=[t for t in mc.TRANSPORTS if t in peer.transports],
    )
    over = "TCP 18009 (h2) and UDP 18009 (h3)" if "h3" in peer.transports else "TCP 18009 (h2 only)"
    message = f"through {', '.join(peer.gateways)} (MeshPeer {imp.peer}) on {over}"
    return ImportVerdict(dest, mc.READY, message, cluster)


def _condition(type_: str, ok: bool, reason: str, message: str, generation: int) -> Raw:
    return {
        "type": type_,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def import_status(imp: ImportView, verdict: ImportVerdict) -> Raw:
    ready = verdict.destination is not None
    clusters = [{"cluster": verdict.cluster}] if verdict.cluster else []
    reason = mc.READY if ready else verdict.reason
    return {
        "clusters": clusters,
        "conditions": [_condition(mc.READY, ready, reason, verdict.message, imp.generation)],
    }


@dataclass(frozen=True)
class ExportVerdict:
    valid: bool
    reason: str
    message: str
    exported: bool = False  # the Service is a QUIC destination the gateways carry (Ready)
    pending: str = ""


def export_verdict(exp: ExportView, svc: ServiceView | None, eligible: str | None) -> ExportVerdict:
    """A ServiceExport's verdict. `eligible`: None when the Service is a QUIC destination of this cluster (the
    gateways export it), else why it is not (its IneligibleDestination reason, or that it has none)."""
    sref = ref(exp.namespace, exp.name)
    if svc is None:
        return ExportVerdict(False, mc.NO_SERVICE, f"Service {sref} does not exist")
    if svc.external_name is not None or not svc.ports_of("TCP"):
        message = f"Service {sref} has no TCP port: the gateways carry mTLS by SNI (TCP and QUIC) only"
        return ExportVerdict(False, mc.INVALID_SERVICE_TYPE, message)
    if eligible is not None:
        return ExportVerdict(True, mc.REASON_VALID, "", False, eligible)
    return ExportVerdict(True, mc.REASON_VALID, "", True)


def export_status(exp: ExportView, verdict: ExportVerdict) -> Raw:
    g = exp.generation
    if verdict.exported:
        ready = _condition(mc.READY, True, mc.EXPORTED, "the east-west gateways export it", g)
    else:
        why = verdict.pending or verdict.message
        ready = _condition(mc.READY, False, mc.PENDING, f"not exported: {why}", g)
    return {
        "conditions": [
            _condition(mc.VALID, verdict.valid, verdict.reason, verdict.message, g),
            ready,
            # one exporting cluster per Service (each peer imports from one): no properties to conflict
            _condition(mc.CONFLICT, False, mc.NO_CONFLICT, "", g),
        ]
    }
