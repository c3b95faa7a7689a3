"""The policy loop (thin): MeshAuthorizationPolicy status and the MeshNode `status.authorization` counts, level-based.

A policy, Service, EndpointSlice, Pod or MeshNode event wakes it (`touch`); after `debounce` seconds one pass
recomputes every policy's status and every node's counts from the kopf indexes (`aether.operator.policies`, pure) and
writes only what differs from the stored copy (merge patches on /status; a MeshNode not yet created is left to the
main reconciler and counted on its next event). A status write that makes a policy's ResolvedRefs ServiceNotFound
(a target that does not exist: a typo) also posts a Warning Event `ServiceNotFound` on the policy. A failed write is logged and retried on the next pass; every
`resync` seconds a pass runs anyway. It shares nothing with the MeshNode reconciler but the indexes: the MeshNode
field it writes (`status.authorization`) is one the reconciler never patches."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aether.api import authz
from aether.api.client import ApiException, now
from aether.api.meshnode import API_GROUP, API_VERSION
from aether.api.meshnode import PLURAL as MESHNODES
from aether.metrics import OPERATOR_POLICIES
from aether.operator.kubeapi import MERGE
from aether.operator.policies import node_counts, policy_status, same_status, unresolved, with_times
from aether.operator.reconcile.views import PodView, ServiceView, SliceView
from aether.operator.statusloop import StatusLoop

log = logging.getLogger("aether.operator.policies")
Bodies = Callable[[], Iterable[dict[str, Any]]]
Views = Callable[[], Iterable[Any]]
PostEvent = Callable[[dict[str, Any], str, str, str], None]  # (policy body, type, reason, message)


@dataclass(frozen=True)
class Inputs:
    """One pass's copy of what it reads from the indexes."""

    policies: list[dict[str, Any]]
    services: list[Any]
    slices: list[Any]
    pods: list[Any]
    meshnodes: list[dict[str, Any]]


class PolicyController(StatusLoop):
    def __init__(
        self,
        custom: Any,  # kubernetes.client.CustomObjectsApi
        policies: Bodies,
        services: Views,
        slices: Views,
        pods: Views,
        meshnodes: Bodies,
        trust_domain: str,
        debounce: float = 0.1,
        resync: float = 30.0,
        post_event: PostEvent | None = None,
    ) -> None:
        self.custom, self.trust_domain, self.post_event = custom, trust_domain, post_event
        self.policies, self.services, self.slices, self.pods, self.meshnodes = (
            policies,
            services,
            slices,
            pods,
            meshnodes,
        )
        super().__init__(log, "policy", debounce, resync)
        # writes by kind ("policy" | "meshnode" | "event"), for tests: counted, not listed (a list grew with every write)
        self.writes: Counter[str] = Counter()

    def read(self) -> Inputs:
        return Inputs(
            list(self.policies()), list(self.services()), list(self.slices()), list(self.pods()), list(self.meshnodes())
        )

    async def a_pass(self) -> None:
        """kopf changes its indexes on the event loop, so they are read here, on the loop (read from the pass's
        thread, one could change size mid-iteration: `dictionary changed size during iteration`, seen twice); the
        pass then computes and writes from that copy in a thread."""
        inputs = self.read()
        await asyncio.to_thread(self.write_pass, inputs)

    def one_pass(self) -> None:
        self.write_pass(self.read())

    def write_pass(self, inputs: Inputs) -> None:
        by_ns: dict[str, dict[str, ServiceView]] = {}
        for svc in inputs.services:
            if isinstance(svc, ServiceView):
                by_ns.setdefault(svc.namespace, {})[svc.name] = svc
        bodies = inputs.policies
        states = dict.fromkeys(("accepted", "not_accepted", "unresolved"), 0)
        for body in bodies:
            meta = body.get("metadata") or {}
            ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            want = policy_status(body, by_ns.get(ns, {}), self.trust_domain)
            states["accepted" if want["conditions"][0]["status"] == "True" else "not_accepted"] += 1
            states["unresolved"] += unresolved(want) is not None
            current = body.get("status")
            if same_status(current, want):
                continue
            patch = {"status": with_times(want, current, now())}
            try:
                self.custom.patch_namespaced_custom_object_status(
                    API_GROUP, API_VERSION, ns, authz.PLURAL, name, patch, _content_type=MERGE
                )
                self.writes["policy"] += 1
                accepted = want["conditions"][0]
                log.info(
                    "MeshAuthorizationPolicy %s/%s: Accepted=%s %s", ns, name, accepted["status"], accepted["reason"]
                )
            except ApiException as exc:
                if exc.status != 404:  # gone meanwhile: nothing to say
                    log.warning("MeshAuthorizationPolicy %s/%s: status write failed: %s", ns, name, exc.reason)
                continue
            self._warn_unresolved(body, want, ns, name)
        for state, n in states.items():
            OPERATOR_POLICIES.labels(state=state).set(n)
        self._counts(authz.compile_bodies(bodies, self.trust_domain), inputs)

    def _warn_unresolved(self, body: dict[str, Any], want: dict[str, Any], ns: str, name: str) -> None:
        """A Warning Event when this write says a target does not exist (once per status change, not per pass)."""
        message = unresolved(want)
        if message is None:
            return
        log.warning("MeshAuthorizationPolicy %s/%s: %s", ns, name, message)
        if self.post_event is None:
            return
        try:
            self.post_event(body, "Warning", authz.SERVICE_NOT_FOUND, message)
            self.writes["event"] += 1
        except ApiException as exc:
            log.warning("MeshAuthorizationPolicy %s/%s: event not posted: %s", ns, name, exc.reason)

    def _counts(self, compiled: tuple[authz.CompiledPolicy, ...], inputs: Inputs) -> None:
        stored = {str((m.get("metadata") or {}).get("name", "")): m for m in inputs.meshnodes}
        pods = [p for p in inputs.pods if isinstance(p, PodView)]
        slices = [s for s in inputs.slices if isinstance(s, SliceView)]
        services = [s for s in inputs.services if isinstance(s, ServiceView)]
        for node, counts in node_counts(compiled, pods, slices, stored, services).items():
            current = (stored[node].get("status") or {}).get("authorization")
            if current == counts or (current is None and not any(counts.values())):
                continue
            try:
                self.custom.patch_cluster_custom_object_status(
                    API_GROUP, API_VERSION, MESHNODES, node, {"status": {"authorization": counts}}, _content_type=MERGE
                )
                self.writes["meshnode"] += 1
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("MeshNode %s: authorization counts not written: %s", node, exc.reason)
