"""Faults in front of a real API server: a reverse proxy on loopback (plain HTTP, its own kubeconfig) that forwards
every request to kube-apiserver as the admin, and on demand answers chosen requests with an error, cuts the open
watch streams, or holds them off, with the API test bed's fault interface:

    proxy = FaultProxy(cp)                          # -> .kubeconfig_path for the client under test
    proxy.inject(Fault(500, verb="patch", plural="udproutes", subresource="status"))
    proxy.cut_watches(); proxy.set_down(True)       # 503 to everything until set_down(False)
    proxy.hide_groups({"discovery.k8s.io"})         # discovery as a server still starting serves it

The server behind it stays whole (a real outage is `ControlPlane.set_down`): tests write through the server's own
kubeconfig while the client under test sees the faults. Each answered fault counts on its `Fault.hits`.

`FaultProxy.plain(url, kubeconfig_path)` fronts a plain-HTTP server instead (the API test bed run as `aether dev-api
--control-plane emulated`), so a benchmark counts one client's traffic the same way on both. `traffic()`: what went
through so far, per (verb, plural, subresource): requests, request body bytes, response body bytes (watch streams
included)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
from multidict import CIMultiDict

from aether.testing import kubeconfig
from aether.testing.apitestbed.faults import Fault
from aether.testing.apitestbed.server import parse_target, request_verb
from aether.testing.controlplane.cluster import ControlPlane

HOP_HEADERS = {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "authorization"}


def write_proxy_kubeconfig(path: Path, url: str) -> Path:
    return kubeconfig.write_kubeconfig(path, url, {}, "aether-fault-proxy")


@dataclass
class Tally:
    requests: int = 0
    request_bytes: int = 0
    response_bytes: int = 0


TrafficKey = tuple[str, str, str]  # (verb, plural, subresource); "" where there is none


class FaultProxy:
    def __init__(
        self, cp: ControlPlane | None, kubeconfig_path: Path | None = None, *, upstream: str | None = None
    ) -> None:
        """`cp`: the real server, as its admin; None with `upstream` (a plain-HTTP URL) and `kubeconfig_path`."""
        if cp is None and (upstream is None or kubeconfig_path is None):
            raise ValueError("a FaultProxy without a control plane needs upstream and kubeconfig_path")
        self.upstream = cp.url if cp is not None else str(upstream)
        self._ssl = cp.admin_ssl_context() if cp is not None else None
        self._traffic: dict[TrafficKey, Tally] = {}
        self._traffic_lock = threading.Lock()
        self.faults: list[Fault] = []
        self.down = False
        self._watches_held: asyncio.Event | None = None  # set: new watch requests wait (hold_watches)
        self._held_agent = ""
        self.hidden_groups: frozenset[str] = frozenset()  # API groups discovery leaves out (hide_groups)
        self.expired = 0  # watch streams that carried a 410 (the API server's "too old resource version")
        self._watches: set[aiohttp.ClientResponse] = set()  # the open watch streams' upstream halves
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="aether-fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the fault proxy did not start")
        if kubeconfig_path is None and cp is not None:
            kubeconfig_path = cp.workdir / "proxy.kubeconfig"
        assert kubeconfig_path is not None
        self.kubeconfig_path = write_proxy_kubeconfig(kubeconfig_path, f"http://127.0.0.1:{self.port}")

    @classmethod
    def plain(cls, upstream: str, kubeconfig_path: Path) -> FaultProxy:
        """In front of a plain-HTTP API server (no TLS, no credentials forwarded)."""
        return cls(None, kubeconfig_path, upstream=upstream)

    # -- the interface tests use (any thread) ---------------------------------------------------------------------
    def inject(self, fault: Fault) -> Fault:
        self._loop.call_soon_threadsafe(self.faults.append, fault)
        return fault

    def clear_faults(self) -> None:
        self._loop.call_soon_threadsafe(self.faults.clear)

    def cut_watches(self) -> None:
        asyncio.run_coroutine_threadsafe(self._cut(), self._loop).result(10)

    def hold_watches(self, held: bool, user_agent: str = "") -> None:
        """While held, a new watch request (of a client whose User-Agent starts with `user_agent`) waits at the
        proxy (a slow path, not an error), then goes on as sent, with the resourceVersion its client asked for."""
        self._held_agent = user_agent

        def flip() -> None:
            if held and self._watches_held is None:
                self._watches_held = asyncio.Event()
            elif not held and self._watches_held is not None:
                self._watches_held.set()
                self._watches_held = None

        self._loop.call_soon_threadsafe(flip)

    def hide_groups(self, groups: set[str] | frozenset[str]) -> None:
        """Discovery as a kube-apiserver still starting serves it: the group list (`GET /apis`) leaves `groups` out
        and their discovery documents answer 404; requests for the resources themselves go through."""
        self.hidden_groups = frozenset(groups)

    def set_down(self, down: bool) -> None:
        self.down = down
        if down:
            self.cut_watches()

    def traffic(self) -> dict[TrafficKey, Tally]:
        """A copy of the counts so far (any thread)."""
        with self._traffic_lock:
            return {k: Tally(t.requests, t.request_bytes, t.response_bytes) for k, t in self._traffic.items()}

    def _count(self, key: TrafficKey, requests: int = 0, request_bytes: int = 0, response_bytes: int = 0) -> None:
        with self._traffic_lock:
            tally = self._traffic.setdefault(key, Tally())
            tally.requests += requests
            tally.request_bytes += request_bytes
            tally.response_bytes += response_bytes

    def stop(self) -> None:
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # -- the proxy (its loop) ----------------------------------------------------------------------------------------
    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else True, limit=0),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        app = aiohttp.web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = aiohttp.web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server: Any = site._server
        self.port: int = server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        await self._cut()
        await self._runner.cleanup()
        await self._session.close()

    async def _cut(self) -> None:
        """End every open watch: closing its upstream half ends the copy loop, and the client sees the stream end."""
        for upstream in list(self._watches):
            upstream.close()
        self._watches.clear()

    def _fault_for(self, request: aiohttp.web.Request) -> Fault | None:
        target = parse_target(request.path)
        if target is None:
            return None
        verb = request_verb(request.method, target, dict(request.query))
        for fault in self.faults:
            if fault.matches(verb, target.plural, target.name, target.namespace, target.subresource):
                fault.hits += 1
                return fault
        return None

    async def _handle(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        held = self._watches_held
        watch = request.query.get("watch") in ("true", "1")
        if held is not None and watch and request.headers.get("User-Agent", "").startswith(self._held_agent):
            await held.wait()
        if self.down:
            return status_response(503, "ServiceUnavailable", "the API is down (injected by the fault proxy)")
        fault = self._fault_for(request)
        if fault is not None:
            return status_response(fault.code, fault.reason, fault.message)
        parts = request.path.strip("/").split("/")
        if self.hidden_groups and request.method == "GET" and parts[0] == "apis" and len(parts) <= 3:
            return await self._discovery(request, parts)
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in HOP_HEADERS)
        body = await request.read()
        key = traffic_key(request)
        self._count(key, requests=1, request_bytes=len(body))
        if body and "Content-Type" not in headers:
            # the kubernetes client may send none (the API server reads JSON then); aiohttp would say octet-stream
            headers["Content-Type"] = "application/json"
        try:
            upstream = await self._session.request(
                request.method,
                self.upstream + request.path_qs,
                headers=headers,
                data=body or None,
                allow_redirects=False,
            )
        except aiohttp.ClientConnectionError as exc:  # the API server is down: what a load balancer in front says
            return status_response(503, "ServiceUnavailable", f"the API server is unreachable: {exc}")
        out = aiohttp.web.StreamResponse(status=upstream.status)
        for k, v in upstream.headers.items():
            # the client session decompresses what it reads (a list over 128 KiB comes gzipped): say nothing of it
            if k.lower() not in HOP_HEADERS and k.lower() != "content-encoding":
                out.headers[k] = v
        watching = request.query.get("watch") in ("true", "1")
        if watching:
            self._watches.add(upstream)
        await out.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                if watching and b'"code":410' in chunk:
                    self.expired += 1
                self._count(key, response_bytes=len(chunk))
                await out.write(chunk)
        except (ConnectionResetError, aiohttp.ClientError, RuntimeError):
            pass  # cut, or the client went away
        finally:
            upstream.release()
            self._watches.discard(upstream)
        with contextlib.suppress(Exception):
            await out.write_eof()
        return out

    async def _discovery(self, request: aiohttp.web.Request, parts: list[str]) -> aiohttp.web.Response:
        """A discovery document with the hidden groups left out (`hide_groups`)."""
        self._count(traffic_key(request), requests=1)
        if len(parts) > 1 and parts[1] in self.hidden_groups:
            return status_response(404, "NotFound", "the server could not find the requested resource")
        async with self._session.get(
            self.upstream + request.path_qs, headers={"Accept": "application/json"}
        ) as upstream:
            body = await upstream.json(content_type=None)
            if upstream.status == 200 and len(parts) == 1:
                body["groups"] = [g for g in body.get("groups") or [] if g.get("name") not in self.hidden_groups]
            return aiohttp.web.Response(status=upstream.status, text=json.dumps(body), content_type="application/json")


def traffic_key(request: aiohttp.web.Request) -> TrafficKey:
    target = parse_target(request.path)
    if target is None:
        return (request.method.lower(), request.path, "")  # discovery and the like
    verb = request_verb(request.method, target, dict(request.query))
    return (verb, target.plural, target.subresource or "")


def status_response(code: int, reason: str, message: str) -> aiohttp.web.Response:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    body |= {"message": message, "reason": reason, "code": code}
    return aiohttp.web.Response(status=code, text=json.dumps(body), content_type="application/json")
