"""The sidecar's `Programmed` condition: what is served, what Envoy holds, and how that is written.

Programmed: Unknown/Pending once a state is served, True/Accepted when Envoy ACKs it (True/AcceptedWithRefusals when
our gates removed a resource that names a fault, such as an arm whose VIP two arms claim: the message lists each and
the rest is served), False with a reason when the state file is invalid (InvalidState), a gate still refuses it
(GateRefused), it does not encode (EncodeFailed) or Envoy NACKs it (Rejected, with Envoy's error_detail), or, once
Envoy holds what is served, when part of the state is missing or stale (SlicesIncomplete: a MeshServiceSlice the
MeshNode names is absent or from another split of its namespace; the rest is served and the message names them;
KernelRulesFailed: the in-kernel UDP rules did not apply in a pod netns, named with nft's error: that netns keeps its
previous rules and the capture still carries the rest to Envoy; it turns True again when an apply succeeds). On a
node using the kernel path an ACK leaves it Pending until the kernel path's worker has applied that state too. In
every False case the last good state keeps serving: a NACKed version is remembered (`rejects`) and not served again
until the desired state changes (`new_state`).

`Programmed` holds the versions (served, acknowledged, rejected) and the notes the condition's message carries
(what the gates refused, what the state source could not supply), and writes each change of the condition to the
status sink. A change made inside `deferred()` (an ADS stream hook: a fetch, a fresh stream, an ACK or NACK) is
written by a publisher thread `PUBLISH_SETTLE_S` later, so the stream's next request never waits for the API. The
caller holds its own lock around every call (the sidecar's one lock).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime

from aether.api.meshnode import Condition
from aether.metrics import XDS_GATE_REFUSALS
from aether.xds.gates.core import GateFailure
from aether.xds.resources import short_type
from aether.xds.sidecar.sources import StatusSink

log = logging.getLogger("aether.xds.sidecar.loop")  # the sidecar's log, as before this module was split out
PROGRAMMED = "Programmed"
PUBLISH_SETTLE_S = 0.05  # a Programmed change made on an ADS stream is written this long after (see _publish_loop)
WAITING_FOR_POLICIES = "waiting for the first list of MeshAuthorizationPolicies; nothing served"
KERNEL_RULES_FAILED = "KernelRulesFailed"
KERNEL_APPLYING = "the kernel UDP rules are still being applied to the pod netns"
ACCEPTED_REASONS = ("Accepted", "AcceptedWithRefusals")
PARTIAL_REASONS = ("SlicesIncomplete", KERNEL_RULES_FAILED)  # False although Envoy holds what is served


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Programmed:
    """The Programmed condition of one node's sidecar and the versions it is about."""

    def __init__(self, node_name: str, sink: StatusSink | None) -> None:
        self.node_name = node_name
        self.sink = sink
        self.condition: Condition | None = None
        self.served_version: str | None = None
        self.acked_version: str | None = None
        self.rejected: set[str] = set()
        self.refused_now: tuple[str, ...] = ()  # what the gates removed from the served state (refuse.py)
        self.state_problems: tuple[str, ...] = ()  # what the source could not supply (StateUpdate.problems)
        self.kernel_problems: tuple[str, ...] = ()  # pod netns whose kernel UDP rules failed (kernel_path.py)
        self.kernel_busy = False  # the kernel path's worker has not applied the latest served state yet
        self._refusal_changed = False
        self._on_stream = False  # inside an ADS stream hook: condition writes go to the publisher thread
        self._publisher: threading.Thread | None = None
        self._publish_wanted = threading.Event()
        self._publish_lock = threading.Lock()

    # -- what happened -------------------------------------------------------------------------------
    def new_state(self, problems: tuple[str, ...]) -> None:
        """A new desired state: what its source could not supply, and a fresh chance for what was rejected."""
        if problems != self.state_problems:
            self.state_problems, self._refusal_changed = problems, True
        self.rejected.clear()  # a new desired state may fix what was rejected

    def invalid_state(self, error: str) -> None:
        """The source could not give a state: the last good one keeps serving."""
        kept = f"; serving version {self.served_version}" if self.served_version else ""
        self.set("False", "InvalidState", f"{error}{kept} (the last good state)")

    def wrong_node(self, name: str) -> None:
        self.set("False", "InvalidState", f"state is for node {name!r}, not {self.node_name!r}")

    def awaiting_policies(self) -> None:
        self.set("Unknown", "Pending", WAITING_FOR_POLICIES)

    def note_refused(self, refused: Sequence[GateFailure]) -> None:
        """Keep what the gates removed; count each refusal once per change of it (not on every re-translation)."""
        text = tuple(str(f) for f in refused)
        if text == self.refused_now:
            return
        for failure in refused:
            if str(failure) not in self.refused_now:
                XDS_GATE_REFUSALS.labels(gate=failure.gate).inc()
        self.refused_now, self._refusal_changed = text, True

    def gate_refused(self, failures: Sequence[GateFailure]) -> None:
        for failure in failures:
            XDS_GATE_REFUSALS.labels(gate=failure.gate).inc()
        kept = f"; serving version {self.served_version}" if self.served_version else "; nothing served yet"
        self.set("False", "GateRefused", "; ".join(str(f) for f in failures) + kept)

    def encode_failed(self, message: str) -> None:
        self.set("False", "EncodeFailed", message)

    def kernel_rules(self, problems: tuple[str, ...]) -> None:
        """The pod netns whose kernel UDP rules did not apply now (empty: every one did): once Envoy holds what is
        served, the condition says so (False/KernelRulesFailed) or recovers."""
        if problems == self.kernel_problems:
            return
        self.kernel_problems = problems
        accepted = self.condition is not None and self.condition.reason in (*ACCEPTED_REASONS, *PARTIAL_REASONS)
        if accepted and self.served_version is not None and self.served_version == self.acked_version:
            self._accepted(self.served_version)
        else:
            self._refusal_changed = True  # the next Pending message carries it

    def kernel_applying(self, busy: bool) -> None:
        """Whether the kernel path's worker still has the served state to apply: while it does, an ACK leaves the
        condition Pending; when it is done, a state Envoy holds turns True (or KernelRulesFailed)."""
        if busy == self.kernel_busy:
            return
        self.kernel_busy = busy
        waiting = self.condition is not None and self.condition.reason == "Pending"
        if not busy and waiting and self.served_version is not None and self.served_version == self.acked_version:
            self._accepted(self.served_version)

    def rejects(self, version: str) -> bool:
        """Whether Envoy already NACKed `version` (the condition says why; wait for a new desired state)."""
        return version in self.rejected

    def serving(self, version: str, counted: Mapping[str, int]) -> None:
        """`version` is in the cache now; `counted`: its resources per type (`resources.count`)."""
        stale = self.condition is None or self.condition.status == "False"
        if version != self.served_version or stale or self._refusal_changed:
            self._refusal_changed = False
            self.served_version = version
            if version == self.acked_version:  # e.g. back to the state Envoy holds after a rejected one
                self._accepted(version)
            else:
                self.set("Unknown", "Pending", f"serving version {version} {counted}; waiting for Envoy{self._note()}")

    def acked(self, version: str) -> None:
        # only a served state waiting for Envoy turns True: after a NACK the rolled-back state is ACKed, but the
        # desired state is still not programmed (False/Rejected stays until a new desired state)
        self.acked_version = version
        pending = self.condition is not None and self.condition.reason in ("Pending", *PARTIAL_REASONS)
        if version == self.served_version and pending:
            self._accepted(version)

    def nacked(self, type_url: str, version: str, error_detail: str, restored: str | None) -> None:
        """Envoy rejected `version`; the cache rolled back to `restored` (None: nothing earlier to fall back to)."""
        self.rejected.add(version)
        if restored is not None:
            self.served_version = restored
            kept = f"serving version {restored} (the last good state)"
        else:
            kept = f"no earlier state to fall back to; serving version {self.served_version}"
        self.set(
            "False", "Rejected", f"Envoy rejected {short_type(type_url)} of version {version}: {error_detail}; {kept}"
        )

    def _note(self) -> str:
        note = f"; refused, the rest served: {'; '.join(self.refused_now)}" if self.refused_now else ""
        if self.state_problems:
            note += f"; incomplete state, the rest served: {'; '.join(self.state_problems)}"
        if self.kernel_problems:
            note += f"; {'; '.join(self.kernel_problems)}"
        return note

    def _accepted(self, version: str) -> None:
        if self.kernel_busy:
            self.set("Unknown", "Pending", f"Envoy accepted version {version}; {KERNEL_APPLYING}{self._note()}")
            return
        if self.state_problems:
            self.set("False", "SlicesIncomplete", f"Envoy accepted version {version}{self._note()}")
            return
        if self.kernel_problems:
            self.set("False", KERNEL_RULES_FAILED, f"Envoy accepted version {version}{self._note()}")
            return
        reason = "AcceptedWithRefusals" if self.refused_now else "Accepted"
        self.set("True", reason, f"Envoy accepted version {version}{self._note()}")

    # -- the condition and its writes --------------------------------------------------------------------
    def set(self, status: str, reason: str, message: str) -> None:
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
            self._publish()
            return
        # on an ADS stream's thread (a fetch, a fresh stream): the request must not wait for the API
        if self._publisher is None:
            self._publisher = threading.Thread(target=self._publish_loop, name="programmed", daemon=True)
            self._publisher.start()
        self._publish_wanted.set()

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Inside an ADS stream hook: any change of the condition is written by the publisher thread."""
        self._on_stream = True
        try:
            yield
        finally:
            self._on_stream = False

    def _publish(self) -> None:
        """Write the current condition (read under the publish lock: the last writer writes the latest)."""
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
            self._publish()
