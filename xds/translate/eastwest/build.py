"""The east-west builder: inbound h2 + QUIC per local pod, outbound HTTP per local pod, h2 clusters and QUIC twins.

`build(node, records, options)` follows the builder contract of `aether.xds.resources` (pure, deterministic).
Secrets are not built here (they need a certificate source, which reads files): `required_secrets` names what
these resources reference, and `aether.xds.identity.sds.secrets(source, ids)` builds them.

Twins are demand-scoped (docs/pairs.md): the route keeps one selection arm per local ServiceAccount for every
destination, but a twin and its load assignment (EDS name: the twin's own name) are built only for the pairs
`status.quic.pairs` lists (`plan.twin_pairs`); the sidecar fills that list with its pair machine's published pairs.
A twin that is missing is fetched on demand by the outbound's `on_demand` filter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from aether.api.meshnode import MeshNode
from aether.api.naming import h2_cluster
from aether.netns.records import PodRecord
from aether.xds.codec import extra_protos  # noqa: F401  (registers the selector and mapper messages for the codec)
from aether.xds.identity.sds import secrets
from aether.xds.identity.svid import CertificateSource, bundle_secret_name
from aether.xds.memo import register
from aether.xds.resources import CLUSTER, ENDPOINT, LISTENER, ROUTE, Resources, TranslateOptions
from aether.xds.translate.eastwest import inbound, outbound, rbac
from aether.xds.translate.eastwest.plan import (
    Destination,
    EastWestOptions,
    LocalPod,
    destinations,
    guarded,
    identities,
    local_pods,
    through_gateways,
    twin_pairs,
)

__all__ = ["EastWestOptions", "build", "camel", "required_secrets", "secrets_for", "twins_for"]

_SNAKE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")


# proto field names (snake_case) -> lowerCamelCase: bounded by the protos' fields. Data keys (SPIFFE IDs, names,
# "@type") are not kept here: they come and go with pods and ServiceAccounts (an LRU of 4,096 kept them: issue 28)
_FIELDS: dict[str, str] = register({})


def _camel_key(key: str, keys: dict[str, str]) -> str:
    """`key` in lowerCamelCase if it is a snake_case field name, else as it is; remembered in `keys` (one call's)."""
    if not _SNAKE.match(key):
        keys[key] = key  # data keys stay as they are
        return key
    head, *rest = key.split("_")
    out = keys[key] = _FIELDS[key] = head + "".join(p.capitalize() for p in rest)
    return out


def _camel(obj: Any, keys: dict[str, str]) -> Any:
    if isinstance(obj, dict):
        return {(keys.get(k) or _camel_key(k, keys)): _camel(v, keys) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_camel(v, keys) for v in obj]
    return obj


def camel(obj: Any) -> Any:
    """The builders write proto field names; resources are served in proto3-JSON's lowerCamelCase (the form the
    other builders and the gates read). Data keys seen are remembered for this call only."""
    return _camel(obj, dict(_FIELDS))


def _eastwest(options: TranslateOptions, ew: EastWestOptions | None) -> EastWestOptions:
    """The east-west knobs: `ew`, or a `TranslateOptions.eastwest` field, or the defaults; QUIC off when the node's
    options say so (`aether xds --east-west-quic off`: every destination over its h2 cluster, no twin), and their
    idle timeout when the node's options set one (`--east-west-idle-timeout`)."""
    ew = ew or getattr(options, "eastwest", None) or EastWestOptions()
    ew = ew if options.east_west_quic else replace(ew, quic=False)
    idle = options.east_west_idle_timeout_s
    return ew if idle is None else replace(ew, idle_timeout_s=idle)


def build(
    node: MeshNode,
    records: Mapping[str, PodRecord],
    options: TranslateOptions,
    ew: EastWestOptions | None = None,
) -> Resources:
    ew = _eastwest(options, ew)
    td, md = options.trust_domain, options.mesh_domain
    backed = guarded(node)
    pods = local_pods(node, records, td, ew, backed)
    dests = through_gateways(destinations(node, td), ew.remote_gateways)
    sources = identities(pods)
    listeners: dict[str, dict[str, Any]] = {}
    clusters: dict[str, dict[str, Any]] = {}
    endpoints: dict[str, dict[str, Any]] = {}
    routes: dict[str, dict[str, Any]] = {}
    guards = rbac.inbound_rbac(options.authorization, pods, backed)
    for pod in pods:
        listeners.update(inbound.listeners(pod, td, md, ew))
        routes.update(inbound.route_configs(pod, guards))
        clusters.update(inbound.app_clusters(pod, ew))
        listeners.update(outbound.listeners(pod, ew))
    for d in dests:
        name = h2_cluster(d.namespace, d.service)
        clusters[name] = outbound.h2_cluster_resource(d, td, md, ew)
        endpoints[name] = outbound.load_assignment(name, d)
    for d, sid in twin_pairs(node, pods, dests) if ew.quic else ():
        twin = outbound.twin_name(d, sid)
        clusters[twin] = outbound.twin_resource(d, sid, td, md, ew)
        endpoints[twin] = outbound.load_assignment(twin, d)
    out: Resources = {LISTENER: listeners, CLUSTER: clusters, ENDPOINT: endpoints}
    if pods:
        out[ROUTE] = {ew.http_outbound_route: outbound.route_config(dests, sources, md, ew), **routes}
    converted: Resources = camel(out)
    return converted


def twins_for(
    node: MeshNode,
    records: Mapping[str, PodRecord],
    options: TranslateOptions,
    twins: Iterable[str],
    ew: EastWestOptions | None = None,
    plan: tuple[list[LocalPod], list[Destination]] | None = None,
) -> Resources:
    """Just the twin clusters and load assignments of `twins` that the node can serve, exactly as `build` makes
    them: the sidecar's on-demand fast path adds these to the served snapshot instead of translating everything.
    `plan`: `(local_pods, destinations)` of this node and these records, when the caller has them."""
    ew = _eastwest(options, ew)
    td, md = options.trust_domain, options.mesh_domain
    pods, dests = plan or (local_pods(node, records, td, ew), destinations(node, td))
    dests = through_gateways(dests, ew.remote_gateways)  # a remote Service's twin dials its gateway's UDP 18009
    clusters: dict[str, dict[str, Any]] = {}
    endpoints: dict[str, dict[str, Any]] = {}
    for d, sid in twin_pairs(node, pods, dests, twins) if ew.quic else ():
        twin = outbound.twin_name(d, sid)
        clusters[twin] = outbound.twin_resource(d, sid, td, md, ew)
        endpoints[twin] = outbound.load_assignment(twin, d)
    converted: Resources = camel({CLUSTER: clusters, ENDPOINT: endpoints})
    return converted


def required_secrets(node: MeshNode, records: Mapping[str, PodRecord], options: TranslateOptions) -> list[str]:
    """The SPIFFE IDs whose SVIDs the built resources reference (the local pods'); the bundle comes with them."""
    return identities(local_pods(node, records, options.trust_domain, EastWestOptions()))


def bundle_name(options: TranslateOptions) -> str:
    return bundle_secret_name(options.trust_domain)


def secrets_for(
    node: MeshNode, records: Mapping[str, PodRecord], options: TranslateOptions, source: CertificateSource
) -> Resources:
    """The SDS secrets `build`'s resources reference, from `source` (reads files for a DirectorySource: call it in
    the shell, merge the result with the translation, and keep the last good secrets on IdentityError)."""
    return secrets(source, required_secrets(node, records, options))
