"""The real Envoy 1.40 accepts what we render and what the codec encodes (no netns needed)."""

from __future__ import annotations

import copy
import datetime
import socket
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from aether.api.meshnode import Endpoint, MeshNode
from aether.netns.records import PodRecord
from aether.testing.envoy import Envoy, start_envoy, validate
from aether.testing.samples import node_with, records_for
from aether.testing.wait import wait_for
from aether.xds.ads.cache import Snapshot, SnapshotCache, make_snapshot
from aether.xds.ads.server import DeltaAdsServer, Events, serve
from aether.xds.codec import protojson as codec
from aether.xds.resources import CLUSTER, LISTENER, Resources, TranslateOptions
from aether.xds.sidecar.bootstrap import ads_bootstrap, static_bootstrap
from aether.xds.translate.compose import translate as translate_all

pytestmark = pytest.mark.envoy


L4 = TranslateOptions(areas=("udp", "tcp-floor"))


def translate(node: MeshNode, records: Mapping[str, PodRecord]) -> Resources:
    """This area's builders only (the east-west area has its own tests)."""
    return translate_all(node, records, L4)


@pytest.mark.parametrize("services", [0, 1, 500])
def test_envoy_validates_rendered_configs(tmp_path: Path, services: int) -> None:
    node = node_with(services, 2)
    node.status.tcp.services = [
        a.model_copy(update={"cluster": a.cluster.replace("udp:", "tcp:")}) for a in node.status.udp.services[:5]
    ]
    for arm in node.status.udp.services[:1] + node.status.tcp.services[:1]:  # a terminating endpoint beside
        arm.endpoints.append(Endpoint(ip="10.201.0.1", port=arm.endpoints[0].port, draining=True))
    resources = translate(node, records_for(node, str(tmp_path / "netns")))
    out = validate(static_bootstrap("node-a", resources))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK" in out.stdout


def test_validate_is_not_silently_green() -> None:
    """Negative control for the test above: a rendered listener with a misspelled udp_proxy field fails."""
    node = node_with(1, 1)
    resources = copy.deepcopy(translate(node, records_for(node)))  # resource dicts are shared: copy before editing
    listener = next(iter(resources[LISTENER].values()))
    listener["listenerFilters"][0]["typedConfig"]["idleTimout"] = "1s"
    out = validate(static_bootstrap("node-a", resources))
    assert out.returncode != 0 and "idleTimout" in out.stderr


# -- a 1.40-only field, delivered over ADS -------------------------------------------------------------

QUIC_DOWNSTREAM = "type.googleapis.com/envoy.extensions.transport_sockets.quic.v3.QuicDownstreamTransport"
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"


def _self_signed(tmp_path: Path) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aether-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("aether-test")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    crt, pem = tmp_path / "tls.crt", tmp_path / "tls.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(crt), str(pem)


def _quic_listener(port: int, crt: str, key: str) -> dict[str, object]:
    return {
        "name": "quic-test",
        "address": {"socketAddress": {"protocol": "UDP", "address": "127.0.0.1", "portValue": port}},
        "udpListenerConfig": {"quicOptions": {}},
        "filterChains": [
            {
                "transportSocket": {
                    "name": "envoy.transport_sockets.quic",
                    "typedConfig": {
                        "@type": QUIC_DOWNSTREAM,
                        "downstreamTlsContext": {
                            "commonTlsContext": {
                                "tlsCertificates": [
                                    {"certificateChain": {"filename": crt}, "privateKey": {"filename": key}}
                                ]
                            }
                        },
                        "enableEarlyData": False,
                        "enableResumption": False,
                    },
                },
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typedConfig": {
                            "@type": HCM,
                            "codecType": "HTTP3",
                            "statPrefix": "quic_test",
                            "routeConfig": {
                                "virtualHosts": [
                                    {
                                        "name": "all",
                                        "domains": ["*"],
                                        "routes": [{"match": {"prefix": "/"}, "directResponse": {"status": 200}}],
                                    }
                                ]
                            },
                            "httpFilters": [{"name": "envoy.filters.http.router", "typedConfig": {"@type": ROUTER}}],
                        },
                    }
                ],
            }
        ],
    }


class _Answers(Events):
    def __init__(self) -> None:
        self.acks: list[tuple[str, str]] = []
        self.nacks: list[tuple[str, str, str]] = []
        self.changed = threading.Condition()

    def on_ack(self, node: str, type_url: str, snapshot_version: str) -> None:
        with self.changed:
            self.acks.append((type_url, snapshot_version))

    def on_nack(self, node: str, type_url: str, snapshot_version: str, error_detail: str) -> None:
        with self.changed:
            self.nacks.append((type_url, snapshot_version, error_detail))


@pytest.fixture
def ads_envoy(tmp_path: Path) -> Iterator[tuple[SnapshotCache, _Answers, Envoy]]:
    cache, answers = SnapshotCache(), _Answers()
    ads_sock, admin_sock = str(tmp_path / "ads.sock"), str(tmp_path / "admin.sock")
    server, _ = serve(DeltaAdsServer(cache, events=answers), f"unix:{ads_sock}")
    try:
        boot = ads_bootstrap("node-v", f"unix:{ads_sock}", f"unix:{admin_sock}")
        envoy = start_envoy(boot, tmp_path, args=["--reject-unknown-dynamic-fields"])
        try:
            yield cache, answers, envoy
        finally:
            envoy.stop()
    finally:
        server.stop(grace=0).wait(5)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_enable_resumption_reaches_envoy_over_ads(
    ads_envoy: tuple[SnapshotCache, _Answers, Envoy], tmp_path: Path
) -> None:
    """Envoy runs with --reject-unknown-dynamic-fields: it ACKs field 3 and its config dump names it
    `enable_resumption`. Negative control: the same bytes under field number 4 are NACKed as an unknown field."""
    cache, answers, envoy = ads_envoy
    crt, key = _self_signed(tmp_path)
    good: Resources = {LISTENER: {"quic-test": _quic_listener(_free_udp_port(), crt, key)}, CLUSTER: {}}
    snap = make_snapshot(good)
    cache.set_snapshot("node-v", snap)
    wait_for(lambda: (LISTENER, snap.version) in answers.acks, timeout=30, what="LDS ACK")
    assert answers.nacks == []
    dump = envoy.admin("/config_dump?resource=dynamic_listeners")
    assert '"enable_resumption": false' in dump and '"enable_early_data": false' in dump

    # negative control: the same bytes with the field under a number Envoy does not know (4 instead of 3)
    listener = codec.to_message(LISTENER, good[LISTENER]["quic-test"])
    ts = listener.filter_chains[0].transport_socket.typed_config
    assert ts.value.endswith(b"\x1a\x00")
    ts.value = ts.value[:-2] + b"\x22\x00"
    bad = Snapshot(
        "wrong-number",
        good,
        {LISTENER: {"quic-test": "v-wrong"}, CLUSTER: {}},
        {LISTENER: {"quic-test": listener.SerializeToString()}, CLUSTER: {}},
    )
    cache.set_snapshot("node-v", bad)
    wait_for(lambda: answers.nacks, timeout=30, what="LDS NACK")
    ((type_url, version, detail),) = answers.nacks
    assert (type_url, version) == (LISTENER, "wrong-number")
    assert "QuicDownstreamTransport" in detail and "unknown field set {4}" in detail
