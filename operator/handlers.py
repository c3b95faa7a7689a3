"""Thin kopf handlers: one index per watched kind (typed views), one event handler per kind that marks the key
dirty, and a startup handler that starts the reconcile loop (reconciler.py) over those indexes.

`build_registry(config, route_version)` makes a fresh registry so several operators can run in one process (tests);
`discover_route_version(config)` picks the UDPRoute version to watch (the most preferred one the API serves)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import kopf
import kubernetes
import urllib3

from aether.api import authz
from aether.api import multicluster as mc
from aether.api.client import OPERATOR_USER_AGENT, ApiException, api_client, served_version
from aether.api.meshnode import API_GROUP, API_VERSION, PLURAL
from aether.api.naming import DEFAULT_TRUST_DOMAIN
from aether.api.slices import SLICE_PLURAL
from aether.operator import discovery
from aether.operator.kubeapi import UDPROUTE_VERSIONS, UDPROUTES, KubeWriter
from aether.operator.mcsctl import MulticlusterController
from aether.operator.policyctl import PolicyController
from aether.operator.reconcile import gateway, multicluster, views
from aether.operator.reconcile.model import Kind, View
from aether.operator.reconciler import Reconciler
from aether.operator.resync import RESYNC_PERIOD, IndexSweeper

GATEWAY = "gateway.networking.k8s.io"
log = logging.getLogger("aether.operator")
WATCH_BACKOFFS = (1, 1, 2, 3, 5, 8, 13, 21, *(30,) * 18)  # seconds between retries of one API request: 594 s in all
OWN_RESOURCES = [(API_GROUP, API_VERSION, p) for p in (PLURAL, authz.PLURAL, SLICE_PLURAL)]  # _watch_own_kinds'
POLICY_INPUTS = frozenset({"service", "slice", "pod"})  # kinds whose changes can change a policy's status or counts

# kind -> (kopf resource spec, parser); the UDPRoute version is replaced by the one discovered at start
WATCHED: dict[Kind, tuple[tuple[str, ...], Callable[[dict[str, Any]], View]]] = {
    "namespace": (("v1", "namespaces"), views.parse_namespace),
    "node": (("v1", "nodes"), views.parse_node),
    "pod": (("v1", "pods"), views.parse_pod),
    "service": (("v1", "services"), views.parse_service),
    "slice": (("discovery.k8s.io", "v1", "endpointslices"), views.parse_slice),
    "route": ((GATEWAY, UDPROUTE_VERSIONS[0], UDPROUTES), gateway.parse_route),
    "grant": ((GATEWAY, "v1beta1", "referencegrants"), gateway.parse_grant),
    "export": ((mc.MCS_GROUP, mc.MCS_VERSION, mc.SERVICE_EXPORTS), multicluster.parse_export),
    "import": ((mc.MCS_GROUP, mc.MCS_VERSION, mc.SERVICE_IMPORTS), multicluster.parse_import),
    "peer": ((API_GROUP, API_VERSION, mc.PEER_PLURAL), multicluster.parse_peer),
}


@dataclass
class OperatorConfig:
    kubeconfig: str | None = None  # None: in-cluster service account
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    debounce: float = 0.1
    metrics: tuple[str, int] | None = None  # serve aether.metrics.REGISTRY at http://host:port/metrics
    liveness: tuple[str, int] | None = None  # kopf's liveness endpoint at http://host:port/healthz
    stall_after: float = 300.0  # the probe fails when one reconcile pass has run longer than this (seconds)
    resync: float = RESYNC_PERIOD  # seconds between sweeps of the indexes against the API (resync.py)
    full_gc_every: float = 0.0  # seconds between full collections (aether.heap; 0: off; CLI default FULL_GC_EVERY_S)
    reconciler: list[Reconciler] = field(default_factory=list)  # filled at startup, for tests and probes


def _key(body: kopf.Body) -> tuple[str, str]:
    return (body.metadata.namespace or "", body.metadata.name or "")


NO_UDPROUTE = "NoUDPRouteVersion"  # the Event's reason when the API serves no UDPRoute version we can serve


def discover_route_version(config: OperatorConfig) -> str:
    """The UDPRoute version to watch and write status through: the first of UDPROUTE_VERSIONS the API serves (v1
    before v1alpha2). None served (no Gateway API CRDs, or only versions we do not know): a WARNING and a Warning
    Event, and v1 is watched, so routes appear once a v1 CRD is installed. Discovery failing (no client config,
    the API unreachable, an error other than 404): v1, with a WARNING."""
    try:
        client = api_client(config.kubeconfig, OPERATOR_USER_AGENT)
        version = served_version(client, GATEWAY, UDPROUTES, UDPROUTE_VERSIONS)
    except (ApiException, urllib3.exceptions.HTTPError, kubernetes.config.ConfigException) as exc:
        # no client (kopf's login then fails the same way) or no answer: watch the GA version
        log.warning("UDPRoute version discovery failed (%s): watching %s/%s", exc, GATEWAY, UDPROUTE_VERSIONS[0])
        return UDPROUTE_VERSIONS[0]
    if version is not None:
        log.info("UDPRoutes: watching %s/%s (the first served of %s)", GATEWAY, version, ", ".join(UDPROUTE_VERSIONS))
        return version
    message = (
        f"the API serves no UDPRoute version aether can serve ({GATEWAY} {', '.join(UDPROUTE_VERSIONS)}): "
        f"no UDPRoute is served; watching {UDPROUTE_VERSIONS[0]}, restart the operator after installing the CRDs"
    )
    log.warning("%s", message)
    try:
        KubeWriter(client).post_cluster_event("Warning", NO_UDPROUTE, message)
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        log.warning("could not post the %s Event: %s", NO_UDPROUTE, exc)
    return UDPROUTE_VERSIONS[0]


def build_registry(
    config: OperatorConfig, route_version: str = UDPROUTE_VERSIONS[0], memories: Any = None
) -> kopf.OperatorRegistry:
    """The handlers, registered in this order: login, an index and an event handler per watched kind, our own kinds
    (MeshNodes, MeshAuthorizationPolicies, MeshServiceSlices), startup (starts the loops), the probe, cleanup.
    `memories`: the kopf `ResourceMemories` given to `kopf.operator`, whose entries the index sweep forgets with the
    objects it drops (resync.py)."""
    registry = kopf.OperatorRegistry()
    watched = {**WATCHED, "route": ((GATEWAY, route_version, UDPROUTES), gateway.parse_route)}
    indexes: dict[Kind, Any] = {}
    state: dict[str, Any] = {"memories": memories}

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return _connection_info(config)

    for kind, (resource, parse) in watched.items():
        _watch(registry, state, kind, resource, parse)
    _watch_own_kinds(registry, state)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
        _configure(settings)
        # kopf scans the API's resources once, right after this handler: not before discovery is whole
        client = api_client(config.kubeconfig, OPERATOR_USER_AGENT)
        wanted = [discovery.resource(path) for path, _ in watched.values()] + OWN_RESOURCES
        await discovery.wait_until_listed(client, wanted)
        for kind in WATCHED:
            indexes[kind] = kwargs[f"aether_{kind}s"]  # kopf passes each index by its id
        writer = KubeWriter(client, route_version)
        reconciler = _start_reconciler(config, writer, indexes, kwargs, state)
        _start_policies(config, writer, indexes, kwargs, state)
        _start_multicluster(config, writer, indexes, reconciler, state)
        _start_sweeper(config, client, watched, kwargs, state)
        config.reconciler.append(reconciler)

    _probe(registry, config, state)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        for key in ("task", "policy_task", "mcs_task", "sweep_task"):
            task: asyncio.Task[None] | None = state.pop(key, None)
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    return registry


def _connection_info(config: OperatorConfig) -> kopf.ConnectionInfo:
    """kopf's login: the same credentials as our own API client (kubeconfig or in-cluster)."""
    client = api_client(config.kubeconfig)
    cfg = client.configuration
    token = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    scheme, _sep, value = (token or "").partition(" ")
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        scheme=scheme if value else None,
        token=(value or scheme) or None,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


def _watch(
    registry: kopf.OperatorRegistry,
    state: dict[str, Any],
    kind: Kind,
    resource: tuple[str, ...],
    parse: Callable[[dict[str, Any]], View],
) -> None:
    """One watched kind: its index of typed views, and an event handler that marks the key dirty."""

    def index(body: kopf.Body, **_: Any) -> dict[tuple[str, str], View]:
        return {_key(body): parse(dict(body))}

    kopf.index(*resource, registry=registry, id=f"aether_{kind}s")(index)

    def event(body: kopf.Body, **_: Any) -> None:
        _touched(state, kind, _key(body))

    kopf.on.event(*resource, registry=registry, id=f"aether_{kind}_event")(event)


def _touched(state: dict[str, Any], kind: Kind, key: tuple[str, str]) -> None:
    """An object of a watched kind changed or went: mark its key dirty, and touch the loops that read that kind."""
    reconciler: Reconciler | None = state.get("reconciler")
    if reconciler is not None:
        reconciler.ready.set()
        reconciler.touch(kind, key)
    if kind in POLICY_INPUTS and (policy_ctl := state.get("policies")) is not None:
        policy_ctl.touch()
    if (mcs := state.get("multicluster")) is not None:  # every kind can change an export's or import's status
        mcs.touch()


def _gone(state: dict[str, Any], kinds: dict[str, Kind], index_id: str, namespace: str, name: str) -> None:
    """The sweeper dropped an object from index `index_id` (`kinds`: a watched kind's index id -> that kind): what
    its DELETED event would have done."""
    reconciler: Reconciler | None = state.get("reconciler")
    if index_id == "aether_meshnodes" and reconciler is not None:
        reconciler.check(("meshnode", name))
        reconciler.touch("node", ("", name))
    elif index_id == "aether_meshserviceslices" and reconciler is not None:
        reconciler.check(("slice", name))
    elif index_id in kinds:
        _touched(state, kinds[index_id], (namespace, name))
    if index_id in ("aether_policies", "aether_meshnodes") and (policy_ctl := state.get("policies")) is not None:
        policy_ctl.touch()


def _start_sweeper(
    config: OperatorConfig,
    client: kubernetes.client.ApiClient,
    watched: dict[Kind, tuple[tuple[str, ...], Any]],
    kwargs: dict[str, Any],
    state: dict[str, Any],
) -> None:
    """The sweep of every index against the API (resync.py), started as a task (`state["sweep_task"]`)."""
    own = {"aether_meshnodes": PLURAL, "aether_policies": authz.PLURAL, "aether_meshserviceslices": SLICE_PLURAL}
    kinds: dict[str, Kind] = {f"aether_{kind}s": kind for kind in watched}
    targets = {i: (discovery.resource(watched[kind][0]), kwargs[i]) for i, kind in kinds.items()}
    targets.update({i: ((API_GROUP, API_VERSION, plural), kwargs[i]) for i, plural in own.items()})
    gone = partial(_gone, state, kinds)
    sweeper = IndexSweeper(client, targets, gone, config.resync, memories=state.get("memories"))
    state["sweeper"] = sweeper
    state["sweep_task"] = asyncio.create_task(sweeper.run(), name="aether-index-sweep")


def _watch_own_kinds(registry: kopf.OperatorRegistry, state: dict[str, Any]) -> None:
    """MeshNodes, MeshAuthorizationPolicies and MeshServiceSlices: indexed, and compared with what we compute."""

    @kopf.index(API_GROUP, API_VERSION, PLURAL, registry=registry, id="aether_meshnodes")
    def meshnode_index(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
        return {body.metadata.name or "": {"metadata": dict(body.metadata), "status": dict(body.status)}}

    @kopf.index(API_GROUP, API_VERSION, authz.PLURAL, registry=registry, id="aether_policies")
    def policy_index(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
        return {_key(body): {"metadata": dict(body.metadata), "spec": dict(body.spec), "status": dict(body.status)}}

    @kopf.on.event(API_GROUP, API_VERSION, authz.PLURAL, registry=registry, id="aether_policy_event")
    def policy_event(**_: Any) -> None:
        if (policy_ctl := state.get("policies")) is not None:
            policy_ctl.touch()

    @kopf.on.event(API_GROUP, API_VERSION, PLURAL, registry=registry, id="aether_meshnode_event")
    def meshnode_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        """A MeshNode changed (by us, the sidecar, or behind our back): compare it with what we compute. Deleted by
        hand while its Node lives: made again."""
        if (policy_ctl := state.get("policies")) is not None:
            policy_ctl.touch()
        reconciler: Reconciler | None = state.get("reconciler")
        if reconciler is None:
            return
        name = body.metadata.name or ""
        reconciler.check(("meshnode", name))
        if type == "DELETED":
            reconciler.touch("node", ("", name))

    @kopf.index(API_GROUP, API_VERSION, SLICE_PLURAL, registry=registry, id="aether_meshserviceslices")
    def slice_index(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
        return {body.metadata.name or "": {"metadata": dict(body.metadata), "spec": dict(body.spec)}}

    @kopf.on.event(API_GROUP, API_VERSION, SLICE_PLURAL, registry=registry, id="aether_meshserviceslice_event")
    def slice_event(body: kopf.Body, **_: Any) -> None:
        """A MeshServiceSlice changed or went (by us, or by hand): compare it with what we compute; made again."""
        reconciler: Reconciler | None = state.get("reconciler")
        if reconciler is not None:
            reconciler.check(("slice", body.metadata.name or ""))


def _configure(settings: kopf.OperatorSettings) -> None:
    settings.posting.enabled = False
    settings.peering.standalone = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # kopf gives a watch up (and the operator stops) once these retries are spent: its default (54 s in all) is
    # shorter than a control-plane upgrade; these ride out an API outage of about 10 minutes
    settings.networking.error_backoffs = WATCH_BACKOFFS


def _first(index: Any, key: Any) -> Any:
    """The one value a kopf index holds under `key`, or None."""
    store = index.get(key)
    return next(iter(store), None) if store is not None else None


def _values(index: Any) -> list[Any]:
    return [v for store in index.values() for v in store]


def _start_reconciler(
    config: OperatorConfig, writer: KubeWriter, indexes: dict[Kind, Any], kwargs: dict[str, Any], state: dict[str, Any]
) -> Reconciler:
    """The reconcile loop over the indexes, started as a task (`state["reconciler"]`, `state["task"]`)."""
    meshnodes = kwargs["aether_meshnodes"]
    meshslices = kwargs["aether_meshserviceslices"]

    def lookup(kind: Kind, key: tuple[str, str]) -> View | None:
        found: View | None = _first(indexes[kind], key)
        return found

    def meshnode(name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = _first(meshnodes, name)
        return found

    def meshslice(name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = _first(meshslices, name)
        return found

    reconciler = Reconciler(
        writer,
        lookup,
        meshnode,
        config.trust_domain,
        debounce=config.debounce,
        meshslice=meshslice,
        slice_names=lambda: [str(name) for name in meshslices],
    )
    state["reconciler"] = reconciler
    state["task"] = asyncio.create_task(reconciler.run(), name="aether-reconciler")
    return reconciler


def _start_policies(
    config: OperatorConfig, writer: KubeWriter, indexes: dict[Kind, Any], kwargs: dict[str, Any], state: dict[str, Any]
) -> None:
    """The policy status loop, started as a task (`state["policies"]`, `state["policy_task"]`) and touched once."""
    policy_index, meshnodes = kwargs["aether_policies"], kwargs["aether_meshnodes"]
    policy_ctl = PolicyController(
        writer.custom,
        lambda: _values(policy_index),
        lambda: _values(indexes["service"]),
        lambda: _values(indexes["slice"]),
        lambda: _values(indexes["pod"]),
        lambda: _values(meshnodes),
        config.trust_domain,
        debounce=config.debounce,
        post_event=writer.post_policy_event,
    )
    state["policies"] = policy_ctl
    state["policy_task"] = asyncio.create_task(policy_ctl.run(), name="aether-policies")
    policy_ctl.touch()


def _start_multicluster(
    config: OperatorConfig, writer: KubeWriter, indexes: dict[Kind, Any], reconciler: Reconciler, state: dict[str, Any]
) -> None:
    """The ServiceExport/ServiceImport status loop (`state["multicluster"]`, `state["mcs_task"]`), touched once."""
    ctl = MulticlusterController(
        writer,
        lambda: _values(indexes["export"]),
        lambda: _values(indexes["import"]),
        reconciler.model,
        settled=reconciler.idle,
        debounce=config.debounce,
    )
    state["multicluster"] = ctl
    state["mcs_task"] = asyncio.create_task(ctl.run(), name="aether-multicluster")
    ctl.touch()


def _probe(registry: kopf.OperatorRegistry, config: OperatorConfig, state: dict[str, Any]) -> None:
    @kopf.on.probe(registry=registry, id="reconciler")
    async def probe(**_: Any) -> dict[str, Any]:
        """Part of kopf's /healthz answer (only with a liveness endpoint). kopf serves it on the operator's own
        event loop, so a blocked loop fails the probe by not answering; this adds a dead or stalled reconcile loop
        (e.g. a write waiting forever on the API: the client sets no timeout)."""
        reconciler: Reconciler | None = state.get("reconciler")
        task: asyncio.Task[None] | None = state.get("task")
        if reconciler is None:
            return {"started": False}
        if task is not None and task.done():
            raise kopf.PermanentError("the reconcile loop has ended")
        health = reconciler.health()
        running = health["passRunningForSeconds"]
        if running is not None and running > config.stall_after:
            raise kopf.PermanentError(f"a reconcile pass has run for {running:.0f} s (limit {config.stall_after:g} s)")
        return health


def quiet_kopf_loggers(verbose: bool = False) -> None:
    """kopf logs every handled event at INFO, aiohttp every liveness probe: at cluster scale that is noise. kopf's
    reactor stays at INFO: it says only when and why the operator stops ("Signal SIGTERM is received. Operator is
    stopping."), which a stop that takes long needs to be read."""
    if not verbose:
        for name in ("kopf", "kopf.objects", "kopf.activities", "aiohttp.access"):
            logging.getLogger(name).setLevel(logging.WARNING)
        logging.getLogger("kopf._core.reactor.running").setLevel(logging.INFO)
