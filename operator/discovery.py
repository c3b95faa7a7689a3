"""Waiting, at start-up, until the API's discovery lists every resource the operator watches that should exist.

kopf lists the API's resources once, when its observers start (after the startup handlers), and afterwards looks
again only at a custom-resource group whose CustomResourceDefinition changes. A kube-apiserver that is still starting
serves partial discovery: an operator that started then watched neither EndpointSlices nor any custom resource, and
wrote every Service without endpoints until it was restarted (found by `bench.soak`: an operator restart 3 s before
a 10 s API outage; about 3 min 20 s of failures). So the startup handler waits, before kopf scans, until discovery
lists each watched resource that should be there: a built-in one always, a custom one when its CRD is Established
and serves that version (a CRD not installed is kopf's to notice later, when it is created).

`missing` is the pure part; `wait_until_listed` asks the API (legacy discovery, as kopf does) with
`DISCOVERY_RETRY` between attempts and logs what is still missing."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping, Set
from typing import Any

import kubernetes
import urllib3

from aether.api.client import ApiException
from aether.backoff import Backoff

log = logging.getLogger("aether.operator")

DISCOVERY_RETRY = Backoff(first=0.5, cap=5.0)
BUILT_IN_GROUPS = frozenset({"", "discovery.k8s.io"})  # the watched groups a Kubernetes API always serves

Resource = tuple[str, str, str]  # (group, version, plural); group "" is the core API


def resource(path: tuple[str, ...]) -> Resource:
    """A kopf resource tuple as the operator writes it ((version, plural) for the core API) as (group, version,
    plural)."""
    return ("", path[0], path[1]) if len(path) == 2 else (path[0], path[1], path[2])


def missing(wanted: Iterable[Resource], listed: Mapping[str, Set[str]], established: Set[Resource]) -> list[Resource]:
    """What of `wanted` discovery does not list yet though it should: `listed` maps a group/version ("v1",
    "discovery.k8s.io/v1") to the plurals its discovery document names; `established` holds the custom resources
    whose CRD is Established and serves that version."""
    out = []
    for group, version, plural in wanted:
        gv = f"{group}/{version}" if group else version
        if plural in listed.get(gv, ()):
            continue
        if group in BUILT_IN_GROUPS or (group, version, plural) in established:
            out.append((group, version, plural))
    return out


def established_resources(crds: Iterable[Mapping[str, Any]]) -> set[Resource]:
    """(group, version, plural) of every served version of every Established CRD."""
    out: set[Resource] = set()
    for crd in crds:
        conditions = (crd.get("status") or {}).get("conditions") or []
        if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            continue
        spec = crd.get("spec") or {}
        for v in spec.get("versions") or []:
            if v.get("served"):
                out.add((spec.get("group", ""), v.get("name", ""), (spec.get("names") or {}).get("plural", "")))
    return out


def get_json(
    client: kubernetes.client.ApiClient,
    path: str,
    query: list[tuple[str, Any]] | None = None,
    accept: str | None = None,
) -> Any:
    """The JSON document at `path` (with `query`, and `accept` as the Accept header), read with the client's own
    credentials; ApiException on a status outside 2xx."""
    request = client.param_serialize(
        method="GET",
        resource_path=path,
        query_params=query,
        header_params={"Accept": accept} if accept else None,
        auth_settings=["BearerToken"],
    )
    response = client.call_api(*request)
    response.read()  # type: ignore[no-untyped-call]  # kubernetes' RESTResponse.read has no annotations
    if not 200 <= response.status < 300:
        raise ApiException(status=response.status, reason=response.reason)
    return json.loads(response.data or b"{}")


def _listed(client: kubernetes.client.ApiClient, wanted: Iterable[Resource]) -> dict[str, set[str]]:
    """The discovery documents of the wanted group/versions the API's group list names (as kopf reads them)."""
    groups: Any = get_json(client, "/apis")
    served = {v.get("groupVersion") for g in groups.get("groups") or [] for v in g.get("versions") or []}
    listed: dict[str, set[str]] = {}
    for group, version, _ in wanted:
        gv = f"{group}/{version}" if group else version
        if gv in listed or (group and gv not in served):
            continue
        doc: Any = get_json(client, f"/apis/{gv}" if group else f"/api/{version}")
        listed[gv] = {r.get("name") for r in doc.get("resources") or []}
    return listed


def check(client: kubernetes.client.ApiClient, wanted: list[Resource]) -> list[Resource]:
    """One look at the API: what of `wanted` it should list and does not."""
    crds: Any = get_json(client, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
    return missing(wanted, _listed(client, wanted), established_resources(crds.get("items") or []))


async def wait_until_listed(client: kubernetes.client.ApiClient, wanted: Iterable[Resource]) -> int:
    """Returns once discovery lists everything of `wanted` it should (the number of looks it took). Errors (the
    API down or starting) count as a look that found nothing."""
    want = list(wanted)
    attempt = 0
    while True:
        attempt += 1
        try:
            gaps = await asyncio.to_thread(check, client, want)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            gaps, reason = want, f"discovery failed: {exc}"
        else:
            reason = "discovery does not list " + ", ".join("/".join(p for p in r if p) for r in gaps)
        if not gaps:
            if attempt > 1:
                log.info("API discovery lists every watched resource after %d looks: starting the watches", attempt)
            return attempt
        delay = DISCOVERY_RETRY.delay(attempt)
        (log.info if attempt < 4 else log.warning)("waiting before watching: %s; looking again in %.1fs", reason, delay)
        await asyncio.sleep(delay)
