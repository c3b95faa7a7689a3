"""The sidecar's control loop: its inputs (desired state, pod records, policies, the pair machine's hooks and
clock) under one lock, each change run through the pipeline (pipeline.py) and installed in the snapshot cache,
with the `Programmed` condition kept by programmed.py.

The ADS server calls the sidecar through its `Callbacks` interface (`aether.xds.ads.server`): `Sidecar` implements
it (and `OnDemand`), it does not inherit from the server's types.

QUIC pairs (docs/pairs.md): the sidecar runs the pair machine (`aether.xds.pairs.keeper`). It starts from the
stored pairs at the first desired state, hears each stream's first CDS request (`on_first_request`) and every later
explicit CDS subscription (`on_demand`), the environment on every reconcile and the clock from its loop; every step
and the snapshot it implies happen under the one lock, before the request that caused them is answered. Twins are
translated from the machine's published pairs (handed to the pipeline as the node's `status.quic.pairs`), and
every `Persist` goes to the `PairWriter` (`PairsPersisted` condition), never blocking the snapshot. A fetch that
only admits pairs adds their twins to the served snapshot (`_add_twins`) instead of translating everything, and
a Programmed change made on a stream's thread (a fetch, a fresh stream, an ACK or NACK) is written by a publisher
thread: the request is answered without waiting for the API.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from aether.api.authz import compile_bodies
from aether.api.meshnode import Condition, MeshNode, QuicPair
from aether.metrics import QUIC_PAIR_FETCH_SECONDS
from aether.netns.records import PodRecord, load_records
from aether.xds.ads.cache import SnapshotCache, make_snapshot
from aether.xds.ads.server import Companions, Events
from aether.xds.codec.protojson import CodecError
from aether.xds.gates.core import PathExists
from aether.xds.pairs.keeper import PairKeeper
from aether.xds.pairs.persist import PairSink, PairWriter, WireMemo, stored
from aether.xds.pairs.values import (
    Decision,
    Dormant,
    Environment,
    PairConfig,
    Persist,
    Prune,
    Publish,
    Withdraw,
    is_twin_name,
)
from aether.xds.resources import CLUSTER, ENDPOINT, Resources, TranslateOptions, count
from aether.xds.sidecar.kernel_path import KernelUdpPath, kernel_selected
from aether.xds.sidecar.pipeline import gated_snapshot
from aether.xds.sidecar.programmed import Programmed
from aether.xds.sidecar.secrets import SecretKeeper
from aether.xds.sidecar.sources import StateSource, StatusSink
from aether.xds.translate.eastwest.build import twins_for
from aether.xds.translate.eastwest.plan import (
    Destination,
    EastWestOptions,
    LocalPod,
    destinations,
    local_pods,
    pair_environment,
)

log = logging.getLogger("aether.xds.sidecar.loop")
LOGGED = Events()  # the server's default callbacks: connects, disconnects and NACKs are logged as they would be


class Sidecar:
    def __init__(
        self,
        node_name: str,
        cache: SnapshotCache,
        sink: StatusSink | None = None,
        records_dir: str | os.PathLike[str] | None = None,
        options: TranslateOptions | None = None,
        path_exists: PathExists = os.path.exists,
        secrets: SecretKeeper | None = None,
        pair_config: PairConfig | None = None,
        clock: Callable[[], float] = time.time,
        kernel: KernelUdpPath | None = None,
    ) -> None:
        self.node_name = node_name
        self.cache = cache
        self.sink = sink
        self.records_dir = records_dir
        self.options = options or TranslateOptions()
        self.path_exists = path_exists
        self.secrets = secrets  # east-west: SDS secrets for what translate references, and the east-west gates
        self._lock = threading.RLock()
        self.desired: MeshNode | None = None
        self.records: dict[str, PodRecord] = {}
        self.programmed = Programmed(node_name, sink)
        # cluster mode sets it until the first list of MeshAuthorizationPolicies: nothing is served before (a
        # guarded Service must never be served open while its policy is still on the way)
        self.awaiting_policies = False
        self.pair_writer: PairWriter | None = None
        if isinstance(sink, PairSink):
            self.pair_writer = PairWriter(node_name, sink, self.options.trust_domain, self._publish_condition)
        self.pairs = PairKeeper(pair_config, clock, persist=self._persist)
        self._wire = WireMemo(self.options.trust_domain)  # the published pairs' wire form, for the live pairs only
        self._plan_memo: tuple[MeshNode, dict[str, PodRecord], tuple[list[LocalPod], list[Destination]]] | None = None
        self.kernel = kernel  # the in-kernel UDP path's programmer (kernel_path.py): fed every served state
        if kernel is not None:
            kernel.on_problems, kernel.on_idle = self._kernel_problems, self._kernel_idle

    @property
    def condition(self) -> Condition | None:
        return self.programmed.condition

    @property
    def served_version(self) -> str | None:
        return self.programmed.served_version

    @contextlib.contextmanager
    def _stream_hook(self) -> Iterator[None]:
        """The body of an ADS stream hook (ACK, NACK, first request, fetch): under the lock, and any condition it
        changes is written by the publisher thread, so the stream's next request never waits for the API."""
        with self._lock, self.programmed.deferred():
            yield

    def _publish_condition(self, condition: Condition) -> None:
        if self.sink is not None:
            self.sink.publish(self.node_name, [condition])

    # -- QUIC pairs ------------------------------------------------------------------------------------
    def _persist(self, view: Persist) -> None:
        if self.pair_writer is not None:
            self.pair_writer.submit(view)

    def _eastwest(self) -> bool:
        return not self.options.areas or "eastwest" in self.options.areas

    def _plan(self, node: MeshNode) -> tuple[list[LocalPod], list[Destination]]:
        """The east-west plan parts of (node, records), kept while both are the same objects."""
        memo = self._plan_memo
        if memo is None or memo[0] is not node or memo[1] is not self.records:
            td = self.options.trust_domain
            parts = (local_pods(node, self.records, td, EastWestOptions()), destinations(node, td))
            memo = self._plan_memo = (node, self.records, parts)
        return memo[2]

    def _pair_environment(self, node: MeshNode) -> Environment:
        return pair_environment(*self._plan(node), node)

    def _published_pairs(self, node: MeshNode) -> list[QuicPair] | None:
        """The pairs to build twins for: the machine started or told the environment, its published pairs in their
        wire form (None without the east-west area: the node's own)."""
        if not self._eastwest():
            return None
        env = self._pair_environment(node)
        if not self.pairs.started:
            found = getattr(self.sink, "stored_pairs", lambda _: None)(self.node_name)
            pairs, dormant = found if found is not None else (node.status.quic.pairs, node.status.quic.dormant_pairs)
            td = self.options.trust_domain
            self.pairs.start(env, stored(pairs, td), stored(dormant, td))
        else:
            self.pairs.environment(env)
        assert self.pairs.state is not None
        return self._wire.convert(self.pairs.state.persist().pairs)

    def on_first_request(
        self, node: str, stream_id: int, type_url: str, subscribed: frozenset[str], held: frozenset[str]
    ) -> bool:
        """A fresh stream's first CDS request: StreamOpened, and its snapshot, before it is answered."""
        if node != self.node_name or type_url != CLUSTER or not self._eastwest():
            return False
        with self._stream_hook():
            self.pairs.stream_opened(subscribed, held)
            self._reconcile()
        return True

    def on_demand(self, node: str, type_url: str, names: set[str]) -> Companions | None:
        """Twin names subscribed explicitly on the live stream (on-demand CDS): Fetched, then its snapshot. Returns
        the twins' load assignments (each under its twin's name) to go out with the answer."""
        twins = frozenset(n for n in names if is_twin_name(n))
        if node != self.node_name or type_url != CLUSTER or not twins or not self._eastwest():
            return None
        t0 = time.perf_counter()
        with self._stream_hook():
            locked = time.perf_counter()
            fast = self._add_twins(self.pairs.fetched(twins))
            if not fast:
                self._reconcile()
        took = time.perf_counter() - t0
        QUIC_PAIR_FETCH_SECONDS.observe(took)
        log.info(
            "on-demand %s: %.1f ms (%.1f ms waiting for the lock, %s)",
            ",".join(sorted(twins)),
            took * 1000,
            (locked - t0) * 1000,
            "twins added" if fast else "full reconcile",
        )
        return {ENDPOINT: twins}

    def _add_twins(self, decisions: list[Decision]) -> bool:
        """The on-demand fast path: a fetch that only admits (or refuses) pairs adds their twins and load
        assignments to the served snapshot; only those are encoded. No gate needs to run again: every gate reads
        listeners and routes, and a twin changes neither (routes name every twin from the start). False: the
        decisions need a full reconcile (a withdrawal), or the served snapshot is not this state's."""
        if any(isinstance(d, Withdraw | Prune | Dormant) for d in decisions):
            return False
        publish = [d.pair.twin for d in decisions if isinstance(d, Publish)]
        if not publish:
            return True  # a refusal: the diff answers the name absent, nothing to add
        current = self.cache.get(self.node_name)
        if current is None or self.desired is None or current.version != self.served_version:
            return False
        resources: Resources = {t: dict(named) for t, named in current.resources.items()}
        extra = twins_for(self.desired, self.records, self.options, publish, plan=self._plan(self.desired))
        for type_url, named in extra.items():
            resources.setdefault(type_url, {}).update(named)
        self._install(resources)
        return True

    def tick_pairs(self) -> None:
        """The clock for the fetch window: a prune changes the snapshot."""
        with self._lock:
            if self.pairs.tick():
                self._reconcile()

    # -- inputs --------------------------------------------------------------------------------------
    def on_state(
        self,
        node: MeshNode | None,
        error: str | None = None,
        policies: Sequence[Mapping[str, Any]] | None = None,
        problems: tuple[str, ...] = (),
    ) -> None:
        with self._lock:
            if policies is not None:
                self._set_policies(policies)
            if node is None:
                self.programmed.invalid_state(str(error))
                return
            if node.metadata.name != self.node_name:
                self.programmed.wrong_node(node.metadata.name)
                return
            self.desired = node
            self.programmed.new_state(problems)
            self._reconcile()

    def on_policies(self, policies: Sequence[Mapping[str, Any]]) -> None:
        """The MeshAuthorizationPolicies now in force (every namespace's; the translation picks the local Services'):
        a change is a new translation, served as an RDS update (docs/identity.md#authorization-by-identity)."""
        with self._lock:
            first, self.awaiting_policies = self.awaiting_policies, False
            if self._set_policies(policies) or first:
                self._reconcile()

    def _set_policies(self, policies: Sequence[Mapping[str, Any]]) -> bool:
        compiled = compile_bodies(policies, self.options.trust_domain)
        if compiled == self.options.authorization:
            return False
        refused = [p.ref for p in compiled if not p.accepted]
        log.info(
            "%d MeshAuthorizationPolicies (%d not accepted, allowing nothing on their Services%s)",
            len(compiled),
            len(refused),
            f": {', '.join(refused)}" if refused else "",
        )
        self.options = replace(self.options, authorization=compiled)
        return True

    def on_records(self, records: Mapping[str, PodRecord]) -> None:
        with self._lock:
            if dict(records) == self.records:
                return
            self.records = dict(records)
            self._reconcile()

    def poll_records(self) -> None:
        self.on_records(load_records(self.records_dir))

    def poll_secrets(self) -> None:
        """Re-read the certificate source: a rotated SVID is a new Secret version (content hash), pushed alone."""
        if self.secrets is None:
            return
        with self._lock:
            self._reconcile()

    def _reconcile(self) -> None:
        if self.desired is None:
            return
        if self.awaiting_policies:
            self.programmed.awaiting_policies()
            return
        pairs = self._published_pairs(self.desired)
        gated = gated_snapshot(
            self.desired, self.records, self.options, pairs, path_exists=self.path_exists, secrets=self.secrets
        )
        self.programmed.note_refused(gated.refused)  # one bad arm or listener refused, the rest served
        if gated.failures:
            self.programmed.gate_refused(gated.failures)
            return
        if self.kernel is not None:  # returns at once: its worker programs the pods' netns
            self.kernel.submit(gated.node, self.records)
            self.programmed.kernel_applying(self.kernel.involved or kernel_selected(gated.node, self.kernel.default))
        self._install(gated.resources)

    def _kernel_idle(self, seq: int) -> None:
        """From the kernel path's worker: submission `seq` is applied; if it is the latest, Programmed may turn True."""
        with self._lock:
            if self.kernel is not None and seq == self.kernel.submitted:
                self.programmed.kernel_applying(False)

    def _kernel_problems(self, problems: tuple[str, ...]) -> None:
        """From the kernel path's worker: the pod netns whose rules failed now (Programmed's message)."""
        with self._lock:
            self.programmed.kernel_rules(problems)

    def _install(self, resources: Resources) -> None:
        try:
            snap = make_snapshot(resources, previous=self.cache.get(self.node_name))
        except CodecError as exc:
            self.programmed.encode_failed(str(exc))
            return
        if self.programmed.rejects(snap.version):
            return  # already NACKed: the condition says why; wait for a new desired state
        self.cache.set_snapshot(self.node_name, snap)
        self.programmed.serving(snap.version, count(resources))

    # -- Envoy's answers (the server's Callbacks) --------------------------------------------------------
    def on_connect(self, node: str, stream_id: int) -> None:
        LOGGED.on_connect(node, stream_id)

    def on_disconnect(self, node: str, stream_id: int) -> None:
        LOGGED.on_disconnect(node, stream_id)

    def on_ack(self, node: str, type_url: str, snapshot_version: str) -> None:
        with self._stream_hook():
            if node == self.node_name:
                self.programmed.acked(snapshot_version)

    def on_nack(self, node: str, type_url: str, snapshot_version: str, error_detail: str) -> None:
        LOGGED.on_nack(node, type_url, snapshot_version, error_detail)
        with self._stream_hook():
            if node != self.node_name:
                return
            restored = self.cache.rollback(node, snapshot_version)
            kept = restored.version if restored is not None else None
            self.programmed.nacked(type_url, snapshot_version, error_detail, kept)

    # -- loop ----------------------------------------------------------------------------------------
    def run(
        self,
        source: StateSource,
        stop: threading.Event,
        records_interval: float = 0.2,
        secrets_interval: float = 5.0,
        pairs_interval: float = 5.0,
    ) -> None:
        try:
            self.poll_records()  # before the first state: the pair machine starts from the real local sources
        except Exception:
            log.exception("reading pod records failed")

        def records_loop() -> None:
            last_secrets = last_tick = 0.0
            while not stop.is_set():
                if time.monotonic() - last_tick >= pairs_interval:
                    last_tick = time.monotonic()
                    try:
                        self.tick_pairs()
                    except Exception:
                        log.exception("the QUIC pair clock failed")
                try:
                    self.poll_records()
                except Exception:
                    log.exception("reading pod records failed")
                if self.secrets is not None and time.monotonic() - last_secrets >= secrets_interval:
                    last_secrets = time.monotonic()
                    try:
                        self.poll_secrets()
                    except Exception:
                        log.exception("refreshing certificates failed")
                stop.wait(records_interval)

        t = threading.Thread(target=records_loop, name="records", daemon=True)
        t.start()
        for update in source.updates(stop):
            self.on_state(update.node, update.error, update.policies, update.problems)
        t.join(timeout=2)
        if self.pair_writer is not None:
            self.pair_writer.close()
        if self.kernel is not None:
            self.kernel.close()
