"""The HTTP face of the test bed: kmock's KubernetesEmulator (server, discovery, error rendering) with our
store behind every resource request, an audit of every request, and consistent watches."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml

from aether.testing.apitestbed.faults import Fault
from aether.testing.apitestbed.patches import PatchError, apply_patch, json_patch, merge_patch, strip_directives
from aether.testing.apitestbed.resources import ALL_VERBS, ResourceType
from aether.testing.apitestbed.selectors import Selector
from aether.testing.apitestbed.sizes import body_refusal
from aether.testing.apitestbed.store import ApiError, Obj, Store
from aether.testing.apitestbed.tables import table, wants_table


@dataclass(frozen=True)
class AuditRecord:
    """One API call as RBAC sees it (verb, apiGroup, resource, subresource, namespace), plus its path."""

    verb: str
    api_group: str | None
    resource: str | None
    subresource: str | None
    namespace: str | None
    name: str | None
    path: str
    code: int
    user_agent: str

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Target:
    group: str
    version: str
    plural: str
    namespace: str | None
    name: str | None
    subresource: str | None


def parse_target(path: str) -> Target | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace: str | None = None
    namespace_object = (
        group == ""
        and rest[0] == "namespaces"
        and (len(rest) <= 2 or (len(rest) == 3 and rest[2] in ("status", "finalize")))
    )
    if rest[0] == "namespaces" and len(rest) >= 3 and not namespace_object:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    sub = "/".join(rest[2:]) or None
    return Target(group, version, plural, namespace, name, sub)


def request_verb(method: str, target: Target, params: dict[str, str]) -> str:
    if method == "GET":
        if params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if target.name else "list"
    return {
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if target.name else "deletecollection",
    }.get(method, method.lower())


@attrs.define(kw_only=True)
class TestBedHandler(kmock.KubernetesEmulator):
    store: Store = attrs.field(factory=Store)
    audit: list[AuditRecord] = attrs.field(factory=list)
    audit_path: Path | None = None
    faults: list[Fault] = attrs.field(factory=list)
    down: bool = False  # every resource request answers 503 (the API server is unreachable)
    # server-side apply: the paths each (object, subresource, field manager) applied last (patches.apply_patch)
    applied: dict[tuple[str, str | None, str, str | None, str], set[tuple[str, ...]]] = attrs.field(factory=dict)
    _stopping: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.sync_discovery()

    def sync_discovery(self) -> None:
        """Make kmock's discovery answer exactly the types the store serves (CRDs included)."""
        for res in list(self.resources):
            del self.resources[res]
        for rt in self.store.types.values():
            self.resources[f"{rt.group}/{rt.version}/{rt.plural}" if rt.group else f"v1/{rt.plural}"] = (
                kmock.ResourceInfo(
                    kind=rt.kind,
                    singular=rt.kind.lower(),
                    namespaced=rt.namespaced,
                    verbs=set(ALL_VERBS),
                    shortnames=set(rt.short_names),
                    subresources=set(rt.subresources),
                )
            )

    def _resource_list(self, path: str) -> dict[str, Any] | None:
        """/api/v1 and /apis/<group>/<version> from the store's types (kmock says groupVersion "/v1" for
        core and lists subresources with short names, which confuses kubectl)."""
        parts = [p for p in path.split("/") if p]
        if len(parts) == 2 and parts[0] == "api":
            group, version = "", parts[1]
        elif len(parts) == 3 and parts[0] == "apis":
            group, version = parts[1], parts[2]
        else:
            return None
        resources: list[dict[str, Any]] = []
        for rt in sorted(self.store.types.values(), key=lambda r: r.plural):
            if (rt.group, rt.version) != (group, version):
                continue
            resources.append(
                {
                    "name": rt.plural,
                    "singularName": rt.kind.lower(),
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": list(ALL_VERBS),
                    "shortNames": list(rt.short_names),
                }
            )
            for sub in sorted(rt.subresources):
                resources.append(
                    {
                        "name": f"{rt.plural}/{sub}",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": rt.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    def _record(self, raw: aiohttp.web.BaseRequest, target: Target | None, code: int) -> None:
        params = dict(raw.query)
        if target is None:
            rec = AuditRecord("get", None, None, None, None, None, raw.path, code, raw.headers.get("User-Agent", ""))
        else:
            rec = AuditRecord(
                request_verb(raw.method, target, params),
                target.group,
                target.plural,
                target.subresource,
                target.namespace,
                target.name,
                raw.path,
                code,
                raw.headers.get("User-Agent", ""),
            )
        self.audit.append(rec)
        if self.audit_path is not None:
            with self.audit_path.open("a") as fh:
                fh.write(json.dumps(rec.as_json()) + "\n")

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        target = parse_target(raw_request.path)
        if target is None:
            self._record(raw_request, None, 200)
            listing = self._resource_list(raw_request.path)
            if listing is not None:
                return aiohttp.web.json_response(listing, status=200 if listing.get("resources") else 404)
            return await super().__call__(raw_request)
        try:
            response = await self._serve(raw_request, target)
        except ApiError as exc:
            self._record(raw_request, target, exc.code)
            return aiohttp.web.json_response(exc.status(), status=exc.code)
        return response

    async def _serve(self, raw: aiohttp.web.BaseRequest, t: Target) -> aiohttp.web.StreamResponse:
        rt = self.store.lookup(t.group, t.version, t.plural)
        if not rt.namespaced and t.namespace is not None:
            raise ApiError(404, "NotFound", f"{t.plural} is not namespaced")
        params = dict(raw.query)
        verb = request_verb(raw.method, t, params)
        self._injected(verb, t)
        selector = Selector.parse(params.get("labelSelector"), params.get("fieldSelector"))
        if verb == "watch":
            if t.name:
                selector = Selector(selector.labels, (*selector.fields, ("metadata.name", "=", (t.name,))))
            self._record(raw, t, 200)
            return await self._watch(raw, rt, t.namespace, selector, params)
        body = await self._body(raw) if raw.method in ("POST", "PUT", "PATCH") else None
        result: Obj
        code = 200
        if verb == "get":
            result = self.store.get(rt, t.namespace, t.name or "")
            if t.subresource not in (None, "status"):
                raise ApiError(404, "NotFound", f"subresource {t.subresource!r} is not served")
        elif verb == "list":
            result = self.store.list(rt, t.namespace, selector)
        elif verb == "create":
            if t.name:
                raise ApiError(405, "MethodNotAllowed", "POST to a named object")
            result, code = self.store.create(rt, t.namespace, body), 201
        elif verb == "update":
            result = self.store.replace(rt, t.namespace, t.name or "", body, t.subresource)
        elif verb == "patch":
            result = self._patch(raw, rt, t, body)
        elif verb == "delete":
            result = self.store.delete(rt, t.namespace, t.name or "")
        elif verb == "deletecollection":
            listed = self.store.list(rt, t.namespace, selector)
            for item in listed["items"]:
                self.store.delete(rt, item["metadata"].get("namespace"), item["metadata"]["name"])
            result = listed
        else:
            raise ApiError(405, "MethodNotAllowed", f"{raw.method} is not supported")
        if rt.plural == "customresourcedefinitions" and verb in ("create", "update", "patch", "delete"):
            self.sync_discovery()
        self._record(raw, t, code)
        if rt.printer_columns and verb in ("get", "list") and wants_table(raw.headers.get("Accept", "")):
            items = result["items"] if verb == "list" else [result]
            result = table(rt.printer_columns, items, str(self.store.rv))
        return aiohttp.web.json_response(result, status=code)

    def _injected(self, verb: str, t: Target) -> None:
        """Raise the injected fault this request meets, if any (faults.py)."""
        if self.down:
            raise ApiError(503, "ServiceUnavailable", "the API test bed is down (injected)")
        for fault in self.faults:
            if fault.matches(verb, t.plural, t.name, t.namespace, t.subresource):
                fault.hits += 1
                raise ApiError(fault.code, fault.reason, f"{fault.message} ({verb} {t.plural}/{t.name or ''})")

    @staticmethod
    async def _body(raw: aiohttp.web.BaseRequest) -> Any:
        data = bytearray()  # read past aiohttp's own 1 MiB default (client_max_size): the wall is kube-apiserver's
        while chunk := await raw.content.read(1 << 16):
            data += chunk
            refusal = body_refusal(len(data))
            if refusal is not None:
                raise ApiError(*refusal)
        text = bytes(data).decode("utf-8", errors="replace")
        if not text:
            return None
        try:
            if "yaml" in raw.headers.get("Content-Type", ""):
                return yaml.safe_load(text)
            return json.loads(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise ApiError(400, "BadRequest", f"cannot decode the body: {exc}") from exc

    def _patch(self, raw: aiohttp.web.BaseRequest, rt: ResourceType, t: Target, body: Any) -> Obj:
        ctype = raw.headers.get("Content-Type", "").split(";")[0].strip()
        current = self.store.get(rt, t.namespace, t.name or "")
        try:
            if ctype == "application/json-patch+json":
                new = json_patch(current, body)
            elif ctype == "application/merge-patch+json":
                new = merge_patch(current, body)
            elif ctype == "application/strategic-merge-patch+json":
                new = merge_patch(current, strip_directives(body))
            elif ctype == "application/apply-patch+yaml":
                new = self._apply(raw, rt, t, current, body)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"the test bed does not serve patches of type {ctype!r}")
        except PatchError as exc:
            raise ApiError(422, "Invalid", str(exc)) from exc
        if ctype != "application/json-patch+json" and not (
            isinstance(body, dict) and "resourceVersion" in (body.get("metadata") or {})
        ):
            new.setdefault("metadata", {}).pop("resourceVersion", None)
        return self.store.replace(rt, t.namespace, t.name or "", new, t.subresource)

    def _apply(self, raw: aiohttp.web.BaseRequest, rt: ResourceType, t: Target, current: Obj, body: Any) -> Obj:
        """Server-side apply (patches.apply_patch): the field manager is required, as on a real server."""
        manager = raw.query.get("fieldManager")
        if not manager:
            raise ApiError(422, "Invalid", "PatchOptions.meta.k8s.io is invalid: fieldManager is required for apply")
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "an apply body must be an object")
        key = (rt.plural, t.namespace, t.name or "", t.subresource, manager)
        new, self.applied[key] = apply_patch(current, body, self.applied.get(key, set()))
        result: Obj = new
        return result

    async def _watch(
        self,
        raw: aiohttp.web.BaseRequest,
        rt: ResourceType,
        namespace: str | None,
        sel: Selector,
        params: dict[str, str],
    ) -> aiohttp.web.StreamResponse:
        since = params.get("resourceVersion")
        watcher = self.store.watch(rt, namespace, sel, since)
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        initial_bookmark = params.get("sendInitialEvents") == "true" and params.get("allowWatchBookmarks") == "true"
        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            if initial_bookmark:
                while not watcher.queue.empty():
                    await response.write(json.dumps(watcher.queue.get_nowait()).encode() + b"\n")
                bookmark = {
                    "apiVersion": rt.api_version,
                    "kind": rt.kind,
                    "metadata": {
                        "resourceVersion": str(self.store.rv),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                }
                await response.write(json.dumps({"type": "BOOKMARK", "object": bookmark}).encode() + b"\n")
            while not self._stopping:
                wait = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
                except TimeoutError:
                    break
                if event is None:
                    break
                await response.write(json.dumps(event).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.watchers.discard(watcher)
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await response.write_eof()
        return response

    def close_watches(self) -> None:
        self._stopping = True
        self.cut_watches()

    def cut_watches(self) -> None:
        """End every open watch stream (clients see the connection close and must re-watch)."""
        for w in list(self.store.watchers):
            w.queue.put_nowait(None)
