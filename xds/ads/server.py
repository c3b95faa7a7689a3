"""The delta-ADS gRPC server (grpcio): type-agnostic, one diff state per stream and type.

It serves whatever type URLs the node's snapshot holds: CDS, EDS, LDS and RDS from the translation, SDS from the
secret keeper. Policy lives outside, behind two interfaces the server calls (the shape of go-control-plane's
`pkg/server` callbacks): `Callbacks` hears ACKs, NACKs (with Envoy's `error_detail`), connects and each type's
first request on a stream (what a fresh stream subscribes and holds), and `Events` is its default, which only logs;
`OnDemand` hears names subscribed explicitly later on the stream and may add them to the snapshot before they are
answered (as removed, when still missing). Both run on the stream's thread before its request is answered.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import stat
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from aether.metrics import XDS_CONNECTED_STREAMS, XDS_NACKS, XDS_PUSHED_RESOURCES
from aether.xds.ads.cache import Snapshot, SnapshotCache
from aether.xds.ads.delta import TypeState
from aether.xds.codec.protojson import to_any
from aether.xds.resources import short_type

log = logging.getLogger("aether.xds.ads.server")

Companions = Mapping[str, frozenset[str]]
"""type URL -> names: resources of other types the client will ask for next because of an on-demand answer (a
fetched cluster's own load assignment). They go out right after that answer, before the client asks (`_announce`)."""

OnDemand = Callable[[str, str, set[str]], Companions | None]
"""on_demand(node, type_url, names): names newly subscribed explicitly after a type's first request on a stream
(on-demand CDS sends each name this way), whether the snapshot has them or not. It may install a snapshot holding
them (synchronously) before they are answered; names still missing are answered as removed. It may return the
answer's companions."""


class Callbacks(Protocol):
    """What the server tells the policy (the sidecar: its Programmed condition, rollback, the pair machine), on the
    stream's thread, before the request that caused it is answered."""

    def on_connect(self, node: str, stream_id: int) -> None: ...

    def on_disconnect(self, node: str, stream_id: int) -> None: ...

    def on_ack(self, node: str, type_url: str, snapshot_version: str) -> None: ...

    def on_first_request(
        self, node: str, stream_id: int, type_url: str, subscribed: frozenset[str], held: frozenset[str]
    ) -> bool:
        """A type's first request on a stream: its explicit subscribe set (without `*`) and the names its
        `initial_resource_versions` hold. Runs before the request is answered; may install a new snapshot.
        Returns whether it took the request's explicit names (then `on_demand` is not asked about them)."""
        ...

    def on_nack(self, node: str, type_url: str, snapshot_version: str, error_detail: str) -> None: ...


class Events:
    """The default `Callbacks`: log only (connects and disconnects at INFO, a NACK as a WARNING)."""

    def on_connect(self, node: str, stream_id: int) -> None:
        log.info("stream %d connected: node %s", stream_id, node)

    def on_disconnect(self, node: str, stream_id: int) -> None:
        log.info("stream %d closed: node %s", stream_id, node)

    def on_ack(self, node: str, type_url: str, snapshot_version: str) -> None:
        pass

    def on_first_request(
        self, node: str, stream_id: int, type_url: str, subscribed: frozenset[str], held: frozenset[str]
    ) -> bool:
        return False

    def on_nack(self, node: str, type_url: str, snapshot_version: str, error_detail: str) -> None:
        log.warning("NACK node=%s type=%s version=%s: %s", node, short_type(type_url), snapshot_version, error_detail)


@dataclass(frozen=True)
class SentRecord:
    """What one response carried (kept in `DeltaAdsServer.sent` for tests and debugging)."""

    stream_id: int
    node: str
    type_url: str
    nonce: str
    snapshot_version: str
    resources: tuple[str, ...]
    removed: tuple[str, ...]
    announced: bool = False  # sent before the client subscribed to them (`DeltaAdsServer._announce`)


@dataclass
class _Stream:
    id: int
    node: str = ""
    types: dict[str, TypeState] = field(default_factory=dict)
    nonces: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    pushed: str = ""  # the snapshot version last pushed to every started type, in PUSH_ORDER


SENT_LOG: Final = 64  # responses `DeltaAdsServer.sent` keeps by default


class DeltaAdsServer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):  # type: ignore[misc]
    def __init__(
        self,
        cache: SnapshotCache,
        events: Callbacks | None = None,
        on_demand: OnDemand | None = None,
        sent_log_size: int = SENT_LOG,
        announce: bool = True,
    ) -> None:
        self.cache = cache
        self.announce = announce  # send on-demand answers' companions unasked (`_announce`)
        self.events: Callbacks = events or Events()
        self.on_demand = on_demand
        # the last `sent_log_size` responses, for tests and debugging (every response is also logged at INFO); it
        # was 10,000 records, filled at some 10 responses a minute under the soak's churn: the sidecar's heap grew
        # with it for its first 16 hours (a few MiB of records and the resource names they held)
        self.sent: deque[SentRecord] = deque(maxlen=sent_log_size)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    # -- gRPC ------------------------------------------------------------------------------------
    def StreamAggregatedResources(self, request_iterator: Any, context: Any) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "aether serves delta ADS only (api_type: DELTA_GRPC)")

    def DeltaAggregatedResources(
        self, request_iterator: Iterator[discovery_pb2.DeltaDiscoveryRequest], context: Any
    ) -> Iterator[discovery_pb2.DeltaDiscoveryResponse]:
        with self._lock:
            stream = _Stream(id=next(self._ids))
        inbox: queue.Queue[tuple[str, Any]] = queue.Queue()

        def read() -> None:
            try:
                for req in request_iterator:
                    inbox.put(("req", req))
            except Exception as exc:  # the stream broke: the client went away
                log.debug("stream %d read ended: %s", stream.id, exc)
            finally:
                inbox.put(("eof", None))

        threading.Thread(target=read, name=f"ads-read-{stream.id}", daemon=True).start()
        cancel_watch: Callable[[], None] | None = None
        XDS_CONNECTED_STREAMS.inc()
        try:
            while True:
                try:
                    kind, item = inbox.get(timeout=1.0)
                except queue.Empty:
                    if not context.is_active():
                        return
                    continue
                if kind == "eof":
                    return
                if kind == "req":
                    req: discovery_pb2.DeltaDiscoveryRequest = item
                    if not stream.node:
                        stream.node = req.node.id or "unknown"
                        cancel_watch = self.cache.watch(stream.node, lambda: inbox.put(("snap", None)))
                        self.events.on_connect(stream.node, stream.id)
                    yield from self._on_request(stream, req)
                elif kind == "snap":
                    snap = self.cache.get(stream.node)
                    if snap is not None:
                        yield from self._push(stream, snap)
        finally:
            XDS_CONNECTED_STREAMS.dec()
            if cancel_watch is not None:
                cancel_watch()
            if stream.node:
                self.events.on_disconnect(stream.node, stream.id)

    # -- protocol --------------------------------------------------------------------------------
    def _on_request(
        self, stream: _Stream, req: discovery_pb2.DeltaDiscoveryRequest
    ) -> Iterator[discovery_pb2.DeltaDiscoveryResponse]:
        ts = stream.types.setdefault(req.type_url, TypeState())
        if req.response_nonce:
            if req.HasField("error_detail"):
                sent = ts.nack(req.response_nonce)
                XDS_NACKS.labels(type_url=req.type_url).inc()
                version = sent.snapshot_version if sent else ""
                self.events.on_nack(stream.node, req.type_url, version, req.error_detail.message)
                # no re-diff here: re-sending would repeat the rejected content; a new snapshot (the sidecar
                # rolls back) or a new subscription triggers the next response
                if not req.resource_names_subscribe and not req.resource_names_unsubscribe:
                    return
            else:
                sent = ts.ack(req.response_nonce)
                if sent is not None:
                    self.events.on_ack(stream.node, req.type_url, sent.snapshot_version)
        first = not ts.started
        initial = dict(req.initial_resource_versions)
        new = ts.apply_request(req.resource_names_subscribe, req.resource_names_unsubscribe, initial)
        if first and self.events.on_first_request(
            stream.node, stream.id, req.type_url, frozenset(ts.subscribed), frozenset(initial)
        ):
            new = set()
        snap = self.cache.get(stream.node)
        companions: Companions | None = None
        if new and self.on_demand is not None and not first:
            companions = self.on_demand(stream.node, req.type_url, new)
            snap = self.cache.get(stream.node)
        elif new and self.on_demand is not None:
            missing = {n for n in new if snap is None or n not in snap.versions.get(req.type_url, {})}
            if missing:
                companions = self.on_demand(stream.node, req.type_url, missing)
                snap = self.cache.get(stream.node)
        if snap is None:
            return  # nothing to serve yet: the first snapshot will answer
        if snap.version != stream.pushed:
            # a snapshot this stream has not had yet (its watch event may still be queued behind this request):
            # every type in order, or this type would get listeners naming clusters CDS has not sent yet
            yield from self._push(stream, snap)
        else:
            yield from self._respond(stream, req.type_url, snap)
        if companions and self.announce:
            yield from self._announce(stream, snap, companions)

    def _push(self, stream: _Stream, snap: Snapshot) -> Iterator[discovery_pb2.DeltaDiscoveryResponse]:
        """Every started type's diff against `snap`, CDS and EDS before LDS and RDS (`PUSH_ORDER`)."""
        for type_url in snap.types():
            yield from self._respond(stream, type_url, snap)
        # types the client holds (or asked for) that the snapshot lacks entirely
        for type_url in sorted(set(stream.types) - set(snap.versions)):
            yield from self._respond(stream, type_url, snap)
        stream.pushed = snap.version

    def _announce(
        self, stream: _Stream, snap: Snapshot, companions: Companions
    ) -> Iterator[discovery_pb2.DeltaDiscoveryResponse]:
        """Send an on-demand answer's companions before the client subscribes to them, saving it a round trip.

        Envoy 1.40 takes an unrequested resource only if it is subscribed by the time the response is processed
        (DeltaSubscriptionState keeps requested names only; the WatchMap delivers to existing watches): a cluster
        answered just before subscribes its own EDS name while that answer is processed, so its load assignment
        sent next is taken, and the cluster warms without waiting for its subscription's round trip. What was
        announced is not recorded as held: when the subscription arrives it is answered as usual (a copy Envoy
        takes as an update that changes nothing), so a copy Envoy dropped costs that round trip, never a wait."""
        for type_url, names in sorted(companions.items()):
            ts = stream.types.get(type_url)
            versions = snap.versions.get(type_url, {})
            if ts is None or not ts.started:
                continue
            send = sorted(
                n for n in names if n in versions and not (ts.interested(n) and ts.known.get(n) == versions[n])
            )
            if not send:
                continue
            resp = self._response(stream, type_url, snap, send, [])
            nonce = resp.nonce
            ts.record_announced(nonce, snap.version)
            self.sent.append(
                SentRecord(stream.id, stream.node, type_url, nonce, snap.version, tuple(send), (), announced=True)
            )
            XDS_PUSHED_RESOURCES.labels(type_url=type_url).inc(len(send))
            log.info(
                "announced stream=%d node=%s type=%s version=%s resources=%d",
                stream.id,
                stream.node,
                short_type(type_url),
                snap.version,
                len(send),
            )
            yield resp

    @staticmethod
    def _response(
        stream: _Stream, type_url: str, snap: Snapshot, send: list[str], removed: list[str]
    ) -> discovery_pb2.DeltaDiscoveryResponse:
        """One response of `type_url` from `snap`, with the stream's next nonce."""
        versions, encoded = snap.versions.get(type_url, {}), snap.encoded.get(type_url, {})
        resp = discovery_pb2.DeltaDiscoveryResponse(
            system_version_info=snap.version,
            type_url=type_url,
            nonce=f"{stream.id}-{next(stream.nonces)}",
            removed_resources=removed,
            resources=[
                discovery_pb2.Resource(name=n, version=versions[n], resource=to_any(type_url, encoded[n])) for n in send
            ],
        )
        resp.control_plane.CopyFrom(base_pb2.ControlPlane(identifier="aether-xds"))
        return resp

    def _respond(
        self, stream: _Stream, type_url: str, snap: Snapshot
    ) -> Iterator[discovery_pb2.DeltaDiscoveryResponse]:
        ts = stream.types.get(type_url)
        if ts is None or not ts.started:
            return
        versions = snap.versions.get(type_url, {})
        send, removed = ts.diff(versions)
        if not send and not removed and ts.answered:
            return
        resp = self._response(stream, type_url, snap, send, removed)
        nonce = resp.nonce
        ts.record_sent(nonce, snap.version, {n: versions[n] for n in send}, removed)
        record = SentRecord(stream.id, stream.node, type_url, nonce, snap.version, tuple(send), tuple(removed))
        self.sent.append(record)
        if send:
            XDS_PUSHED_RESOURCES.labels(type_url=type_url).inc(len(send))
        log.info(
            "sent stream=%d node=%s type=%s version=%s resources=%d removed=%d",
            stream.id,
            stream.node,
            short_type(type_url),
            snap.version,
            len(send),
            len(removed),
        )
        yield resp


UNIX_SOCKET_MODE: Final = 0o600


def serve(servicer: DeltaAdsServer, listen: str, max_workers: int = 32) -> tuple[grpc.Server, int]:
    """Start a grpc server on `host:port` or `unix:PATH`; returns (server, bound port; 0 for unix).

    A unix socket is created mode 0600 (the umask is 0177 while grpc binds it, so it is never connectable by
    others, then it is chmod-ed and checked): SDS serves workload private keys on this stream, and only the
    socket's owner (the node pod's Envoy runs as the same user) may connect."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="ads"),
        options=[("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 64 << 20)],
    )
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(servicer, server)
    path = listen.removeprefix("unix:") if listen.startswith("unix:") else None
    if path is not None and os.path.dirname(path):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    old_umask = os.umask(0o177) if path is not None else None
    try:
        port = server.add_insecure_port(listen)
        if port == 0 and path is None:
            raise OSError(f"cannot listen on {listen}")
        server.start()
    finally:
        if old_umask is not None:
            os.umask(old_umask)
    if path is not None:
        os.chmod(path, UNIX_SOCKET_MODE)
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode != UNIX_SOCKET_MODE:
            server.stop(0)
            raise OSError(f"{path}: socket mode {mode:o}, expected {UNIX_SOCKET_MODE:o}")
    return server, port
