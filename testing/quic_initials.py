"""Real QUIC client Initials from aioquic, captured without any network, for the Rust SNI reader's tests.

`python -m aether.testing.quic_initials DIR` writes one file per case, `aioquic-<case>.hex`: a header comment
(the SNI the client sent, or `none`), then one protected datagram per line in the order the client sent them.
The files live in `envoy-modules/quicsni/testdata/` and `cargo test` reads them; re-run this to refresh them.
The Retry case answers the client's first flight with a Retry built by aioquic's own encoder, so the client's
second flight uses the new Destination Connection ID (and Initial keys derived from it, RFC 9001 section 5.2).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aioquic
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicProtocolVersion, encode_quic_retry

SERVER = ("127.0.0.1", 18009)
MESH_SNI = "8080.web.default.mesh.local"


@dataclass(frozen=True)
class Case:
    name: str
    server_name: str | None
    alpn: list[str] = field(default_factory=lambda: ["h3"])
    version: int = QuicProtocolVersion.VERSION_1
    retry: bool = False


def _long_alpn() -> list[str]:
    # 40 protocol names of 60 bytes: a ~2.5 KB ClientHello, more than one Initial packet can carry.
    return ["h3"] + [f"x-aether-test-{i:02d}-" + "p" * 43 for i in range(40)]


CASES = [
    Case("short", MESH_SNI),
    Case("long", "a" * 63 + "." + "b" * 63 + "." + "c" * 63 + ".mesh.local", alpn=_long_alpn()),
    Case("v2", MESH_SNI, version=QuicProtocolVersion.VERSION_2),
    Case("nosni", None),
    Case("retry", MESH_SNI, alpn=_long_alpn(), retry=True),
]


def _client(case: Case) -> QuicConnection:
    config = QuicConfiguration(is_client=True, alpn_protocols=case.alpn, server_name=case.server_name)
    config.supported_versions = [case.version]
    config.original_version = case.version
    conn = QuicConnection(configuration=config)
    conn.connect(SERVER, now=time.monotonic())
    return conn


def _flight(conn: QuicConnection) -> list[bytes]:
    return [data for data, _ in conn.datagrams_to_send(now=time.monotonic())]


def _retry(conn: QuicConnection, first: bytes, version: int) -> None:
    # A long header (RFC 9000 section 17.2): flags, version, DCID length and DCID, SCID length and SCID.
    dcid = first[6 : 6 + first[5]]
    scid_at = 6 + len(dcid)
    scid = first[scid_at + 1 : scid_at + 1 + first[scid_at]]
    packet = encode_quic_retry(
        version=version,
        source_cid=os.urandom(8),
        destination_cid=scid,
        original_destination_cid=dcid,
        retry_token=os.urandom(16),
    )
    conn.receive_datagram(packet, SERVER, now=time.monotonic())


def capture(case: Case) -> list[bytes]:
    """The client datagrams of `case`'s first flight (and, after a Retry, its second)."""
    conn = _client(case)
    datagrams = _flight(conn)
    if case.retry:
        _retry(conn, datagrams[0], case.version)
        datagrams += _flight(conn)
    return datagrams


def write(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        lines = [f"# aioquic {aioquic.__version__}, case {case.name}, sni {case.server_name or 'none'}"]
        lines += [d.hex() for d in capture(case)]
        (directory / f"aioquic-{case.name}.hex").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1]))
