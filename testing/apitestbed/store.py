"""The test bed's object store: what kube-apiserver keeps, with the semantics kopf and the clients rely on.

resourceVersion (one counter for everything), uid, generation (bumped when anything but metadata/status
changes), creationTimestamp, generateName, status-subresource rules (the main endpoint never changes
status; /status changes only status), optimistic concurrency on a resourceVersion in the body, finalizers
and deletionTimestamp, and garbage collection through ownerReferences: kube-apiserver leaves that to the
garbage-collector controller; the test bed does it synchronously when an owner is removed, which is what a
real cluster converges to. It runs on one event loop thread: no locking.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import re
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any

from aether.testing.apitestbed.resources import BUILTIN, ResourceType, from_crd
from aether.testing.apitestbed.schema import admit
from aether.testing.apitestbed.selectors import Selector
from aether.testing.apitestbed.sizes import stored_refusal

Obj = dict[str, Any]
EVENT_LOG_SIZE = 20000


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        out: Obj = {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "code": self.code,
            "message": self.message,
        }
        if self.reason:  # StatusReasonUnknown is "" and omitted, as kube-apiserver's JSON omits it
            out["reason"] = self.reason
        if self.details is not None:
            out["details"] = self.details
        return out


def _top(path: str) -> str:
    return re.split(r"[.\[]", path, maxsplit=1)[0]


def _unchanged(top: str, new: Obj, old: Obj) -> bool:
    return bool(top) and top in old and new.get(top) == old.get(top)


def _admitted(rt: ResourceType, obj: Obj, validate: bool, old: Obj | None = None) -> Obj:
    """The object pruned and validated against its CRD's schema (schema.py); a 422 Invalid naming each field. An
    update is ratcheted as kube-apiserver does (CRD validation ratcheting, GA in 1.33), at the granularity of a
    top-level field: a cause in a part the update leaves unchanged (`spec` under a status write, say) is ignored, so
    an object stored through one version's schema keeps taking writes through a stricter served version's."""
    if not validate or rt.schema is None:
        return obj
    stored, problems = admit(obj, rt.schema)
    if old is not None:
        problems = [c for c in problems if not _unchanged(_top(str(c.get("field", ""))), stored, old)]
    if problems:
        name = str((obj.get("metadata") or {}).get("name") or "")
        message = f'{rt.kind}.{rt.group} "{name}" is invalid: ' + ", ".join(c["message"] for c in problems)
        details = {"name": name, "group": rt.group, "kind": rt.plural, "causes": problems}
        raise ApiError(422, "Invalid", message, details)
    return stored


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


@dataclass(eq=False)
class Watcher:
    rtype: ResourceType
    namespace: str | None
    selector: Selector
    queue: asyncio.Queue[Obj | None] = field(default_factory=asyncio.Queue)


class Store:
    def __init__(self, validate: bool = True) -> None:
        self.validate = validate  # custom resources checked against their CRD's openAPIV3Schema (schema.py)
        self.rv = 0
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self.objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = collections.defaultdict(dict)
        self.log: collections.deque[tuple[int, tuple[str, str], Obj]] = collections.deque(maxlen=EVENT_LOG_SIZE)
        self.watchers: set[Watcher] = set()
        for rt in BUILTIN:
            self.register(rt)
        for ns in ("default", "kube-system"):
            self.create(self.lookup("", "v1", "namespaces"), None, {"metadata": {"name": ns}})

    # ---- types -------------------------------------------------------------------------------
    def register(self, rt: ResourceType) -> None:
        self.types[(rt.group, rt.version, rt.plural)] = rt

    def lookup(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.types.get((group, version, plural))
        if rt is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({plural}.{group})")
        return rt

    def _crd_changed(self, crd: Obj, removed: bool) -> None:
        try:
            rts = from_crd(crd)
        except ValueError:
            return
        for rt in rts:
            if removed:
                self.types.pop((rt.group, rt.version, rt.plural), None)
            else:
                self.register(rt)

    # ---- events ------------------------------------------------------------------------------
    def _emit(self, rt: ResourceType, kind: str, obj: Obj) -> None:
        event = {"type": kind, "object": copy.deepcopy(obj)}
        self.log.append((self.rv, rt.key, event))
        for w in list(self.watchers):
            if w.rtype.key == rt.key and self._visible(w.namespace, w.selector, obj):
                w.queue.put_nowait(event)

    @staticmethod
    def _visible(namespace: str | None, selector: Selector, obj: Obj) -> bool:
        meta = obj.get("metadata") or {}
        return (namespace is None or meta.get("namespace") == namespace) and selector.matches(obj)

    def _bump(self, obj: Obj) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    # ---- reads -------------------------------------------------------------------------------
    @staticmethod
    def _fits(rt: ResourceType, namespace: str, name: str, obj: Obj) -> None:
        """etcd's request limit (sizes.py): an object too large to store is refused as kube-apiserver relays it."""
        key = f"/registry/{rt.group + '/' if rt.group else ''}{rt.plural}/{namespace + '/' if namespace else ''}{name}"
        refusal = stored_refusal(key, obj)
        if refusal is not None:
            raise ApiError(*refusal)

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.objects[rt.key].get((namespace or "", name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{rt.plural}.{rt.group or "core"} "{name}" not found')
        return self._versioned(rt, obj)

    @staticmethod
    def _versioned(rt: ResourceType, obj: Obj) -> Obj:
        out = copy.deepcopy(obj)
        out["apiVersion"], out["kind"] = rt.api_version, rt.kind
        return out

    def list(self, rt: ResourceType, namespace: str | None, selector: Selector) -> Obj:
        items = [
            self._versioned(rt, o)
            for (ns, _), o in sorted(self.objects[rt.key].items())
            if (namespace is None or ns == namespace) and selector.matches(o)
        ]
        return {
            "apiVersion": rt.api_version,
            "kind": f"{rt.kind}List",
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }

    def watch(self, rt: ResourceType, namespace: str | None, selector: Selector, since: str | None) -> Watcher:
        """Register a watcher and queue what it must see first: the replay from `since`, or every object."""
        w = Watcher(rt, namespace, selector)
        if since and since != "0":
            try:
                start = int(since)
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"invalid resourceVersion {since!r}") from exc
            if self.log and start < self.log[0][0] - 1 and len(self.log) == self.log.maxlen:
                raise ApiError(410, "Expired", f"too old resource version: {start} ({self.log[0][0]})")
            for rv, key, event in self.log:
                if rv > start and key == rt.key and self._visible(namespace, selector, event["object"]):
                    w.queue.put_nowait(event)
        else:
            for (ns, _), o in sorted(self.objects[rt.key].items()):
                if (namespace is None or ns == namespace) and selector.matches(o):
                    w.queue.put_nowait({"type": "ADDED", "object": self._versioned(rt, o)})
        self.watchers.add(w)
        return w

    # ---- writes ------------------------------------------------------------------------------
    def create(self, rt: ResourceType, namespace: str | None, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        if rt.namespaced:
            ns = namespace or meta.get("namespace")
            if not ns:
                raise ApiError(400, "BadRequest", "a namespaced object needs a namespace")
            if meta.get("namespace") not in (None, ns):
                raise ApiError(400, "BadRequest", "the namespace of the object does not match the URL")
            if ("", ns) not in self.objects[("", "namespaces")]:
                raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
            ns = ""
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{secrets.token_hex(3)[:5]}"
            else:
                raise ApiError(422, "Invalid", "metadata.name or metadata.generateName is required")
        name = meta["name"]
        if not isinstance(name, str):
            raise ApiError(422, "Invalid", "metadata.name must be a string")
        if (ns, name) in self.objects[rt.key]:
            raise ApiError(409, "AlreadyExists", f'{rt.plural}.{rt.group or "core"} "{name}" already exists')
        for k in ("resourceVersion", "deletionTimestamp"):
            meta.pop(k, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        if rt.has_status and rt.plural not in ("namespaces",):
            obj.pop("status", None)
        if rt.plural == "namespaces":
            obj["status"] = {"phase": "Active"}
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        obj = _admitted(rt, obj, self.validate)
        self._fits(rt, ns, name, obj)
        self._bump(obj)
        self.objects[rt.key][(ns, name)] = obj
        self._emit(rt, "ADDED", obj)
        if rt.plural == "customresourcedefinitions":
            self._crd_changed(obj, removed=False)
        return self._versioned(rt, obj)

    def replace(self, rt: ResourceType, namespace: str | None, name: str, new: Any, subresource: str | None) -> Obj:
        """PUT, and the last step of every PATCH: apply status-subresource rules, concurrency, generation."""
        key = (namespace or "", name)
        old = self.objects[rt.key].get(key)
        if old is None:
            raise ApiError(404, "NotFound", f'{rt.plural}.{rt.group or "core"} "{name}" not found')
        if not isinstance(new, dict) or not isinstance(new.get("metadata", {}), dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object with object metadata")
        want_rv = (new.get("metadata") or {}).get("resourceVersion")
        if want_rv and want_rv != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {rt.plural} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
            )
        if subresource == "status":
            if not rt.has_status:
                raise ApiError(404, "NotFound", f"{rt.plural} has no status subresource")
            obj = copy.deepcopy(old)
            if "status" in new:
                obj["status"] = copy.deepcopy(new["status"])
            else:
                obj.pop("status", None)
        elif subresource:
            raise ApiError(404, "NotFound", f"subresource {subresource!r} is not served")
        else:
            obj = copy.deepcopy(new)
            if rt.has_status:
                obj.pop("status", None)
                if "status" in old:
                    obj["status"] = copy.deepcopy(old["status"])
            meta = obj.setdefault("metadata", {})
            for k in ("uid", "creationTimestamp", "generation", "namespace", "name", "deletionTimestamp"):
                if k in old["metadata"]:
                    meta[k] = old["metadata"][k]
                else:
                    meta.pop(k, None)
            if _spec_part(obj) != _spec_part(old):
                meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        obj = _admitted(rt, obj, self.validate, old)
        if obj == {**old, "apiVersion": rt.api_version, "kind": rt.kind}:
            return self._versioned(rt, old)  # a no-op write does not bump resourceVersion
        self._fits(rt, key[0], name, obj)
        self._bump(obj)
        self.objects[rt.key][key] = obj
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._remove(rt, key)
        else:
            self._emit(rt, "MODIFIED", obj)
            if rt.plural == "customresourcedefinitions":
                self._crd_changed(obj, removed=False)
        return self._versioned(rt, obj)

    def delete(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        key = (namespace or "", name)
        obj = self.objects[rt.key].get(key)
        if obj is None:
            raise ApiError(404, "NotFound", f'{rt.plural}.{rt.group or "core"} "{name}" not found')
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj = copy.deepcopy(obj)
                obj["metadata"]["deletionTimestamp"] = _now()
                self._bump(obj)
                self.objects[rt.key][key] = obj
                self._emit(rt, "MODIFIED", obj)
            return self._versioned(rt, obj)
        self._remove(rt, key)
        return self._versioned(rt, obj)

    def _remove(self, rt: ResourceType, key: tuple[str, str]) -> None:
        obj = self.objects[rt.key].pop(key)
        self._bump(obj)
        self._emit(rt, "DELETED", obj)
        if rt.plural == "customresourcedefinitions":
            self._crd_changed(obj, removed=True)
        if rt.plural == "namespaces":
            self._delete_namespace_contents(key[1])
        self._collect_garbage()

    def _delete_namespace_contents(self, ns: str) -> None:
        for rt in list(self._types_by_key().values()):
            if rt.namespaced:
                for okey in [k for k in self.objects[rt.key] if k[0] == ns]:
                    if okey in self.objects[rt.key]:
                        self.delete(rt, okey[0], okey[1])

    def _types_by_key(self) -> dict[tuple[str, str], ResourceType]:
        return {rt.key: rt for rt in self.types.values()}

    def _collect_garbage(self) -> None:
        """Delete every object whose ownerReferences all name objects that no longer exist."""
        live = {o["metadata"]["uid"] for objs in self.objects.values() for o in objs.values()}
        for rt in list(self._types_by_key().values()):
            for okey, o in list(self.objects[rt.key].items()):
                owners = o["metadata"].get("ownerReferences") or []
                uids = [r.get("uid") for r in owners if isinstance(r, dict)]
                if uids and not any(u in live for u in uids) and okey in self.objects[rt.key]:
                    self.delete(rt, okey[0], okey[1])
