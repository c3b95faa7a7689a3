"""Identity: SPIFFE IDs, the built-in CA, the PEM directory source, SDS secrets and their content versions."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509

from aether.xds.identity.ca import BuiltinCA
from aether.xds.identity.pemdir import DirectorySource, write_bundle, write_identity
from aether.xds.identity.sds import secret_resources, secret_version, secrets
from aether.xds.identity.svid import IdentityError, bundle_secret_name, parse_spiffe_id
from aether.xds.resources import SECRET

CLIENT = "spiffe://cluster.local/ns/default/sa/client"
WEB = "spiffe://cluster.local/ns/shop/sa/web"


def _sans(chain_pem: str) -> tuple[list[str], list[str]]:
    leaf = x509.load_pem_x509_certificates(chain_pem.encode())[0]
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(u) for u in san.get_values_for_type(x509.UniformResourceIdentifier)], list(
        san.get_values_for_type(x509.DNSName)
    )


def test_parse_spiffe_id_round_trips_and_rejects_non_workload_ids() -> None:
    sid = parse_spiffe_id(WEB)
    assert (sid.trust_domain, sid.namespace, sid.service_account) == ("cluster.local", "shop", "web")
    assert sid.uri == WEB
    assert sid.dns_sans("mesh.example") == ("web.shop.mesh.example", "*.web.shop.mesh.example")
    for bad in (
        "https://x/ns/a/sa/b",
        "spiffe://td/ns/a",
        "spiffe://td/ns//sa/b",
        "spiffe:///ns/a/sa/b",
        "spiffe://td/x/a/sa/b",
    ):
        with pytest.raises(IdentityError):
            parse_spiffe_id(bad)


def test_builtin_ca_issues_svids_with_uri_and_both_dns_sans_chained_to_the_bundle() -> None:
    ca = BuiltinCA(mesh_domain="mesh.example")
    svid = ca.svid(WEB)
    uris, dns = _sans(svid.chain_pem)
    assert uris == [WEB]
    assert dns == ["web.shop.mesh.example", "*.web.shop.mesh.example"]
    leaf = x509.load_pem_x509_certificates(svid.chain_pem.encode())[0]
    root = x509.load_pem_x509_certificates(ca.bundle().pem.encode())[0]
    leaf.verify_directly_issued_by(root)
    assert ca.svid(WEB) is svid  # cached until rotated


def test_builtin_ca_refuses_another_trust_domain() -> None:
    with pytest.raises(IdentityError, match="trust domain"):
        BuiltinCA().svid("spiffe://other.example/ns/a/sa/b")


def test_rotation_is_a_new_secret_version_and_nothing_else_changes() -> None:
    ca = BuiltinCA()
    before = secret_resources(ca, [CLIENT, WEB])
    ca.rotate(CLIENT)
    after = secret_resources(ca, [CLIENT, WEB])
    names = {bundle_secret_name("cluster.local"), CLIENT, WEB, "svid:" + CLIENT, "svid:" + WEB}
    assert set(before) == set(after) == names
    for name in (CLIENT, "svid:" + CLIENT):
        assert secret_version(before[name]) != secret_version(after[name])
    for name in (WEB, "svid:" + WEB):
        assert secret_version(before[name]) == secret_version(after[name])
    assert before[bundle_secret_name("cluster.local")] == after[bundle_secret_name("cluster.local")]


def test_secrets_are_keyed_by_the_sds_type_and_named_by_spiffe_id() -> None:
    out = secrets(BuiltinCA(), [CLIENT])
    assert set(out) == {SECRET}
    sec = out[SECRET][CLIENT]
    assert sec["name"] == CLIENT
    assert out[SECRET]["svid:" + CLIENT] == {**sec, "name": "svid:" + CLIENT}
    assert "BEGIN CERTIFICATE" in sec["tls_certificate"]["certificate_chain"]["inline_string"]
    assert "BEGIN PRIVATE KEY" in sec["tls_certificate"]["private_key"]["inline_string"]
    bundle = out[SECRET][bundle_secret_name("cluster.local")]
    assert "BEGIN CERTIFICATE" in bundle["validation_context"]["trusted_ca"]["inline_string"]


def test_directory_source_reads_the_layout_and_sees_rotation(tmp_path: Path) -> None:
    ca = BuiltinCA()
    write_bundle(tmp_path, ca.bundle())
    write_identity(tmp_path, ca.svid(CLIENT))
    src = DirectorySource(tmp_path, "cluster.local")
    assert src.svid(CLIENT) == ca.svid(CLIENT)
    assert src.bundle().pem == ca.bundle().pem
    v1 = secret_version(secret_resources(src, [CLIENT])["svid:" + CLIENT])
    write_identity(tmp_path, ca.rotate(CLIENT))
    v2 = secret_version(secret_resources(src, [CLIENT])["svid:" + CLIENT])
    assert v1 != v2


def test_directory_source_accepts_cert_manager_names_and_per_identity_bundles(tmp_path: Path) -> None:
    ca = BuiltinCA()
    svid = ca.svid(WEB)
    d = tmp_path / "shop" / "web"
    d.mkdir(parents=True)
    (d / "tls.crt").write_text(svid.chain_pem)
    (d / "tls.key").write_text(svid.key_pem)
    (d / "ca.crt").write_text(ca.bundle().pem)
    src = DirectorySource(tmp_path, "cluster.local")
    assert src.svid(WEB).chain_pem == svid.chain_pem
    assert src.bundle().pem == ca.bundle().pem


def test_directory_source_refuses_misplaced_or_mismatched_files(tmp_path: Path) -> None:
    ca = BuiltinCA()
    src = DirectorySource(tmp_path, "cluster.local")
    with pytest.raises(IdentityError, match="no SVID files"):
        src.svid(CLIENT)
    # web's certificate in client's directory: never served as client
    d = tmp_path / "default" / "client"
    d.mkdir(parents=True)
    (d / "svid.pem").write_text(ca.svid(WEB).chain_pem)
    (d / "svid_key.pem").write_text(ca.svid(WEB).key_pem)
    with pytest.raises(IdentityError, match="not exactly"):
        src.svid(CLIENT)
    # the right certificate with another identity's key
    (d / "svid.pem").write_text(ca.svid(CLIENT).chain_pem)
    with pytest.raises(IdentityError, match="does not match"):
        src.svid(CLIENT)
    with pytest.raises(IdentityError, match="no trust bundle"):
        src.bundle()


def test_tls_context_and_selector_names_never_collide() -> None:
    """On Envoy 1.40.0 a selector asking for a name a listener already subscribed never got it (docs/identity.md);
    test_h2_when_the_twin_is_absent is the data-path side of this."""
    from aether.xds.identity.svid import selector_secret_name, svid_secret_name

    assert svid_secret_name(CLIENT) != selector_secret_name(CLIENT)
    assert selector_secret_name(CLIENT) == CLIENT  # the stamped identity is the SPIFFE ID itself
