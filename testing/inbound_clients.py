"""Real clients aimed straight at a pod's inbound (TCP h2 mTLS and QUIC mTLS on 18008), run inside a pod's netns:
what an attacker inside the cluster would try, and what the tests of the inbound's TLS and XFCC rules run.

- `write_pems`: an SVID and the trust bundle as PEM files (what openssl and Python ssl load);
- `openssl_session` / `openssl_resume`: Debian's `openssl s_client`, first a full handshake with a client
  certificate that saves the session (`-sess_out`), then a second connection offering that session (`-sess_in`)
  and no certificate, carrying one HTTP/2 GET; returns what s_client printed (`Reused,` or `New,`, the ALPN, any
  alert) and the app's JSON answer if one came back;
- `h2_get`: Python ssl + the `h2` package, one GET with extra headers (a forged XFCC) over mTLS;
- `h3_get`: aioquic, the same over HTTP/3.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from aether.xds.identity.svid import Svid, TrustBundle


@dataclass(frozen=True)
class Pems:
    cert: Path
    key: Path
    bundle: Path


def write_pems(svid: Svid, bundle: TrustBundle, directory: Path, name: str) -> Pems:
    directory.mkdir(parents=True, exist_ok=True)
    out = Pems(directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}-bundle.pem")
    out.cert.write_text(svid.chain_pem)
    out.key.write_text(svid.key_pem)
    os.chmod(out.key, 0o600)
    out.bundle.write_text(bundle.pem)
    return out


def h2_request(authority: str, extra: dict[str, str] | None = None) -> bytes:
    """The client's first flight of an HTTP/2 connection with one GET / (preface, SETTINGS, HEADERS)."""
    import h2.config
    import h2.connection

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    headers = [(":method", "GET"), (":scheme", "https"), (":authority", authority), (":path", "/")]
    conn.send_headers(1, [*headers, *(extra or {}).items()], end_stream=True)
    return bytes(conn.data_to_send())


def _s_client(netns: str, ip: str, port: int, sni: str, tls: str, *more: str) -> list[str]:
    return [
        *("ip", "netns", "exec", netns, "openssl", "s_client", "-connect", f"{ip}:{port}", "-servername", sni),
        *("-alpn", "h2", f"-{tls}", "-nocommands", *more),
    ]


_BODY = re.compile(rb'\{"backend": [^{}]*\}')


@dataclass(frozen=True)
class Exchange:
    output: str  # what s_client printed
    body: dict[str, object] | None  # the app's answer, when one came back
    session_saved: bool  # -sess_out only: the server gave a session to resume (a TLS 1.3 ticket, a 1.2 session)

    @property
    def reused(self) -> bool:
        return "Reused, TLS" in self.output

    @property
    def asked_for_a_certificate(self) -> bool:
        """The server sent a CertificateRequest (s_client prints its CA names)."""
        return "Acceptable client certificate CA names" in self.output

    @property
    def alpn(self) -> str | None:
        m = re.search(r"ALPN protocol: (\S+)", self.output)
        return m.group(1) if m else None


def _exchange(argv: list[str], request: bytes, timeout: float) -> tuple[str, dict[str, object] | None]:
    """Run s_client, send `request`, read until the app's JSON body comes back or s_client ends (the server closed
    or refused the handshake)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdin is not None and proc.stdout is not None
    out = b""
    try:
        proc.stdin.write(request)
        proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while not _BODY.search(out) and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
    finally:
        proc.kill()
        rest, _ = proc.communicate(timeout=10)
        out += rest
    m = _BODY.search(out)
    return out.decode(errors="replace"), json.loads(m.group(0)) if m else None


def openssl_session(
    netns: str,
    ip: str,
    port: int,
    sni: str,
    pems: Pems,
    session: Path,
    request: bytes,
    tls: str = "tls1_3",
    timeout: float = 10.0,
) -> Exchange:
    """A full mTLS handshake carrying `request`; whatever session the server gave is written to `session`. Envoy
    sends its TLS 1.3 tickets before the first response, so once the app's answer is in, a ticket would be too."""
    session.unlink(missing_ok=True)
    argv = _s_client(netns, ip, port, sni, tls, "-cert", str(pems.cert), "-key", str(pems.key))
    output, body = _exchange([*argv, "-sess_out", str(session)], request, timeout)
    return Exchange(output, body, session.exists() and session.stat().st_size > 0)


def openssl_resume(
    netns: str, ip: str, port: int, sni: str, session: Path, request: bytes, tls: str = "tls1_3", timeout: float = 10.0
) -> Exchange:
    """Offer `session` and no client certificate, carrying `request` (h2 bytes)."""
    output, body = _exchange(_s_client(netns, ip, port, sni, tls, "-sess_in", str(session)), request, timeout)
    return Exchange(output, body, False)


# One GET over TLS + HTTP/2 (the h2 package) with the given headers; prints {"status": ..., "body": ...} or
# {"error": ...}.
_H2_GET = r"""
import json, socket, ssl, sys
import h2.config, h2.connection, h2.events
ip, port, sni, cert, key, ca, authority = sys.argv[1:8]
extra = json.loads(sys.argv[8])
ctx = ssl.create_default_context(cafile=ca)
ctx.check_hostname = False
ctx.load_cert_chain(cert, key)
ctx.set_alpn_protocols(["h2"])
try:
    s = ctx.wrap_socket(socket.create_connection((ip, int(port)), timeout=10), server_hostname=sni)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    hdrs = [(":method", "GET"), (":scheme", "https"), (":authority", authority), (":path", "/")]
    conn.send_headers(1, hdrs + [tuple(h) for h in extra], end_stream=True)
    s.sendall(conn.data_to_send())
    status, body, done = None, b"", False
    while not done:
        data = s.recv(65536)
        if not data:
            break
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                status = int(dict(ev.headers)[":status"])
            elif isinstance(ev, h2.events.DataReceived):
                body += ev.data
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                done = True
        s.sendall(conn.data_to_send())
    print(json.dumps({"status": status, "body": body.decode(errors="replace"), "alpn": s.selected_alpn_protocol()}))
except Exception as exc:
    print(json.dumps({"error": repr(exc)}))
"""

# The same over HTTP/3 (aioquic), with a client certificate.
_H3_GET = r"""
import asyncio, json, ssl, sys
from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated
ip, port, sni, cert, key, ca, authority = sys.argv[1:8]
extra = json.loads(sys.argv[8])

class Client(QuicConnectionProtocol):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.h3 = H3Connection(self._quic)
        self.status, self.body, self.done, self.closed = None, b"", asyncio.Event(), None
    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):  # e.g. the server refusing our certificate after our Finished
            self.closed = event
            self.done.set()
            return
        for ev in self.h3.handle_event(event):
            if isinstance(ev, HeadersReceived):
                self.status = int(dict(ev.headers)[b":status"])
            elif isinstance(ev, DataReceived):
                self.body += ev.data
            if getattr(ev, "stream_ended", False):
                self.done.set()

async def main():
    cfg = QuicConfiguration(is_client=True, alpn_protocols=["h3"], server_name=sni)
    cfg.load_verify_locations(ca)
    cfg.verify_mode = ssl.CERT_NONE  # the server's DNS SANs are not what this client would check; its chain is
    cfg.load_cert_chain(cert, key)
    async with connect(ip, int(port), configuration=cfg, create_protocol=Client, wait_connected=True) as c:
        sid = c._quic.get_next_available_stream_id()
        hdrs = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", authority.encode()), (b":path", b"/")]
        c.h3.send_headers(sid, hdrs + [(k.encode(), v.encode()) for k, v in extra], end_stream=True)
        c.transmit()
        await c.done.wait()
        if c.status is None and c.closed is not None:
            return {"error": f"connection closed: error code {c.closed.error_code}, {c.closed.reason_phrase!r}"}
        return {"status": c.status, "body": c.body.decode(errors="replace")}
try:
    print(json.dumps(asyncio.run(asyncio.wait_for(main(), 10))))
except BaseException as exc:
    print(json.dumps({"error": repr(exc)}))
"""


def _run(
    script: str, netns: str, ip: str, port: int, sni: str, pems: Pems, authority: str, extra: dict[str, str]
) -> dict[str, object]:
    argv = [sys.executable, "-c", script, ip, str(port), sni, str(pems.cert), str(pems.key), str(pems.bundle)]
    out = subprocess.run(
        ["ip", "netns", "exec", netns, *argv, authority, json.dumps(list(extra.items()))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        raise RuntimeError(f"client in {netns} failed: {out.stderr.strip()}")
    result: dict[str, object] = json.loads(out.stdout)
    return result


def h2_get(
    netns: str, ip: str, port: int, sni: str, pems: Pems, authority: str, extra: dict[str, str] | None = None
) -> dict[str, object]:
    """`{"status", "body", "alpn"}` or `{"error"}` of one GET over TCP mTLS + HTTP/2."""
    return _run(_H2_GET, netns, ip, port, sni, pems, authority, extra or {})


def h3_get(
    netns: str, ip: str, port: int, sni: str, pems: Pems, authority: str, extra: dict[str, str] | None = None
) -> dict[str, object]:
    """`{"status", "body"}` or `{"error"}` of one GET over QUIC mTLS + HTTP/3."""
    return _run(_H3_GET, netns, ip, port, sni, pems, authority, extra or {})
