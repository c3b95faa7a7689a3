"""The sidecar's control loop: desired state + pod records -> translate -> gates -> snapshot, the pair machine's
hooks, and the `Programmed` condition.
Long because: everything that runs under the sidecar's one lock (state, records, pairs, snapshot, condition) is here.

Programmed: Unknown/Pending once a state is served, True/Accepted when Envoy ACKs it (True/AcceptedWithRefusals when
our gates removed a resource that names a fault, such as an arm whose VIP two arms claim: the message lists each and
the rest is served), False with a reason when the state file is invalid (InvalidState), a gate still refuses it
(GateRefused), it does not encode (EncodeFailed) or
Envoy NACKs it (Rejected, with Envoy's error_detail), or, once Envoy holds what is served, when part of the state
is missing or stale (SlicesIncomplete: a MeshServiceSlice the MeshNode names is absent or from another split of its
namespace; the rest is served and the message names them). In every False case the last good state keeps serving:
a NACKed snapshot is rolled back in the cache and not served again until the desired state changes.

QUIC pairs (docs/pairs.md): the sidecar runs the pair machine (`aether.xds.pairs.keeper`). It starts from the
stored pairs at the first desired state, hears each stream's first CDS request (`on_first_request`) and every later
explicit CDS subscription (`on_demand`), the environment on every reconcile and the clock from its loop; every step
and the snapshot it implies happen under the one lock, before the request that caused them is answered. Twins are
translated from the machine's published pairs (put into `status.quic.pairs` of the node handed to `translate`), and
every `Persist` goes to the `PairWriter` (`PairsPersisted` condition), never blocking the snapshot. A fetch that
only admits pairs adds their twins to the served snapshot (`_add_twins`) instead of translating everything, and
a Programmed change made on a stream's thread (a fetch, a fresh stream) is written by a publisher thread: the
request is answered without waiting for the API.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from aether.api.authz import compile_bodies
from aether.api.meshnode import Condition, MeshNode, QuicPair
from aether.metrics import QUIC_PAIR_FETCH_SECONDS, XDS_GATE_REFUSALS
from aether.netns.records import PodRecord, load_records
from aether.xds.ads.cache import SnapshotCache, make_snapshot
from aether.xds.ads.server import Companions, Events
from aether.xds.codec.protojson import CodecError
from aether.xds.gates.core import GateFailure, PathExists, run_gates
from aether.xds.gates.refuse import refuse_arms, refuse_listeners
from aether.xds.pairs.keeper import PairKeeper
from aether.xds.pairs.persist import PairSink, PairWriter, stored, to_wire
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
from aether.xds.resources import CLUSTER, ENDPOINT, Resources, TranslateOptions, count, short_type
from aether.xds.sidecar.secrets import SecretKeeper
from aether.xds.sidecar.sources import StateSource, StatusSink
from aether.xds.translate.compose import translate
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
PROGRAMMED = "Programmed"
PUBLISH_SETTLE_S = 0.05  # a Programmed change made on an ADS stream is written this long after (see _publish_loop)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Sidecar(Events):
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
        self.served_version: str | None = None
        self.acked_version: str | None = None
        self.rejected: set[str] = set()
        self.condition: Condition | None = None
        self.refused_now: tuple[str, ...] = ()  # what the gates removed from the served state (refuse.py)
        self.state_problems: tuple[str, ...] = ()  # what the source could not supply (StateUpdate.problems)
        # cluster mode sets it until the first list of MeshAuthorizationPolicies: nothing is served before (a
        # guarded Service must never be served open while its policy is still on the way)
        self.awaiting_policies = False
        self._refusal_changed = False
        self.pair_writer: PairWriter | None = None
        if isinstance(sink, PairSink):
            self.pair_writer = PairWriter(node_name, sink, self.options.trust_domain, self._publish_condition)
        self.pairs = PairKeeper(pair_config, clock, persist=self._persist)
        self._on_stream = False  # inside an ADS stream hook: condition writes go to the publisher thread
        self._publisher: threading.Thread | None = None
        self._publish_wanted = threading.Event()
        self._publish_lock = threading.Lock()
        self._plan_memo: tuple[MeshNode, dict[str, PodRecord], tuple[list[LocalPod], list[Destination]]] | None = None

    # -- condition ---------------------------------------------------------------------------------
    def _set(self, status: str, reason: str, message: str) -> None:
        prev = self.condition
        if prev and (prev.status, prev.reason, prev.message) == (status, reason, message):
            return
        when = prev.last_transition_time if prev and prev.status == status else _now()
        self.condition = Condition(
            type=PROGRAMMED, status=status, reason=reason, message=message, last_transition_time=when
        )
        level = logging.INFO if status != "False" else logging.WARNING
        log.log(level, "Programmed=%s %s: %s", status, reason, message)
        if self.sink is None:
            return
        if not self._on_stream:
            self._publish_programmed()
            return
        # on an ADS stream's thread (a fetch, a fresh stream): the request must not wait for the API
        if self._publisher is None:
            self._publisher = threading.Thread(target=self._publish_loop, name="programmed", daemon=True)
            self._publisher.start()
        self._publish_wanted.set()

    @contextlib.contextmanager
    def _stream_hook(self) -> Iterator[None]:
        """The body of an ADS stream hook (ACK, NACK, first request, fetch): under the lock, and any condition it
        changes is written by the publisher thread, so the stream's next request never waits for the API."""
        with self._lock:
            self._on_stream = True
            try:
                yield
            finally:
                self._on_stream = False

    def _publish_programmed(self) -> None:
        """Write the current Programmed condition (read under the publish lock: the last writer writes the latest)."""
        assert self.sink is not None
        with self._publish_lock:
            try:
                if self.condition is not None:
                    self.sink.publish(self.node_name, [self.condition])
            except Exception:
                log.exception("cannot publish the Programmed condition")

    def _publish_loop(self) -> None:
        while True:
            self._publish_wanted.wait()
            # let the stream answer first: the write's Python work would share the GIL with that answer (and a
            # Pending that Envoy ACKs meanwhile is written once, as the latest condition)
            time.sleep(PUBLISH_SETTLE_S)
            self._publish_wanted.clear()
            self._publish_programmed()

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

    def _with_pairs(self, node: MeshNode) -> MeshNode:
        """`node` as translated: the machine started or told the environment, its published pairs as
        status.quic.pairs (the builders make twins for those only)."""
        if not self._eastwest():
            return node
        env = self._pair_environment(node)
        if not self.pairs.started:
            found = getattr(self.sink, "stored_pairs", lambda _: None)(self.node_name)
            pairs, dormant = found if found is not None else (node.status.quic.pairs, node.status.quic.dormant_pairs)
            td = self.options.trust_domain
            self.pairs.start(env, stored(pairs, td), stored(dormant, td))
        else:
            self.pairs.environment(env)
        assert self.pairs.state is not None
        wire: list[QuicPair] = [to_wire(p, self.options.trust_domain) for p in self.pairs.state.persist().pairs]
        quic = node.status.quic.model_copy(update={"pairs": wire})
        return node.model_copy(update={"status": node.status.model_copy(update={"quic": quic})})

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
                kept = f"; serving version {self.served_version}" if self.served_version else ""
                self._set("False", "InvalidState", f"{error}{kept} (the last good state)")
                return
            if node.metadata.name != self.node_name:
                self._set("False", "InvalidState", f"state is for node {node.metadata.name!r}, not {self.node_name!r}")
                return
            self.desired = node
            if problems != self.state_problems:
                self.state_problems, self._refusal_changed = problems, True
            self.rejected.clear()  # a new desired state may fix what was rejected
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
            self._set("Unknown", "Pending", "waiting for the first list of MeshAuthorizationPolicies; nothing served")
            return
        node, refused = refuse_arms(self._with_pairs(self.desired))  # one bad arm or listener refused, the rest served
        resources = translate(node, self.records, self.options)
        resources, dropped = refuse_listeners(resources, self.path_exists)
        self._note_refused([*refused, *dropped])
        failures = run_gates(node, resources, self.path_exists)
        if not failures and self.secrets is not None:
            resources, failures = self.secrets.finish(node, self.records, self.options, resources)
        if failures:
            for failure in failures:
                XDS_GATE_REFUSALS.labels(gate=failure.gate).inc()
            kept = f"; serving version {self.served_version}" if self.served_version else "; nothing served yet"
            self._set("False", "GateRefused", "; ".join(str(f) for f in failures) + kept)
            return
        self._install(resources)

    def _install(self, resources: Resources) -> None:
        try:
            snap = make_snapshot(resources, previous=self.cache.get(self.node_name))
        except CodecError as exc:
            self._set("False", "EncodeFailed", str(exc))
            return
        if snap.version in self.rejected:
            return  # already NACKed: the condition says why; wait for a new desired state
        self.cache.set_snapshot(self.node_name, snap)
        stale = self.condition is None or self.condition.status == "False"
        if snap.version != self.served_version or stale or self._refusal_changed:
            self._refusal_changed = False
            self.served_version = snap.version
            if snap.version == self.acked_version:  # e.g. back to the state Envoy holds after a rejected one
                self._accepted(snap.version)
            else:
                self._set(
                    "Unknown",
                    "Pending",
                    f"serving version {snap.version} {count(resources)}; waiting for Envoy{self._refusal_note()}",
                )

    def _note_refused(self, refused: list[GateFailure]) -> None:
        """Keep what the gates removed; count each refusal once per change of it (not on every re-translation)."""
        text = tuple(str(f) for f in refused)
        if text == self.refused_now:
            return
        for failure in refused:
            if str(failure) not in self.refused_now:
                XDS_GATE_REFUSALS.labels(gate=failure.gate).inc()
        self.refused_now, self._refusal_changed = text, True

    def _refusal_note(self) -> str:
        note = f"; refused, the rest served: {'; '.join(self.refused_now)}" if self.refused_now else ""
        if self.state_problems:
            note += f"; incomplete state, the rest served: {'; '.join(self.state_problems)}"
        return note

    def _accepted(self, version: str) -> None:
        if self.state_problems:
            self._set("False", "SlicesIncomplete", f"Envoy accepted version {version}{self._refusal_note()}")
            return
        reason = "AcceptedWithRefusals" if self.refused_now else "Accepted"
        self._set("True", reason, f"Envoy accepted version {version}{self._refusal_note()}")

    # -- Envoy's answers (server Events) ---------------------------------------------------------------
    def on_ack(self, node: str, type_url: str, snapshot_version: str) -> None:
        with self._stream_hook():
            # only a served state waiting for Envoy turns True: after a NACK the rolled-back state is ACKed, but
            # the desired state is still not programmed (False/Rejected stays until a new desired state)
            if node == self.node_name:
                self.acked_version = snapshot_version
            pending = self.condition is not None and self.condition.reason in ("Pending", "SlicesIncomplete")
            if node == self.node_name and snapshot_version == self.served_version and pending:
                self._accepted(snapshot_version)

    def on_nack(self, node: str, type_url: str, snapshot_version: str, error_detail: str) -> None:
        super().on_nack(node, type_url, snapshot_version, error_detail)
        with self._stream_hook():
            if node != self.node_name:
                return
            self.rejected.add(snapshot_version)
            restored = self.cache.rollback(node, snapshot_version)
            if restored is not None:
                self.served_version = restored.version
                kept = f"serving version {restored.version} (the last good state)"
            else:
                kept = f"no earlier state to fall back to; serving version {self.served_version}"
            self._set(
                "False",
                "Rejected",
                f"Envoy rejected {short_type(type_url)} of version {snapshot_version}: {error_detail}; {kept}",
            )

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
