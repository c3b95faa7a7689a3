"""A directory of PEM files per identity: what SPIRE's spiffe-helper and cert-manager's helpers write.

Layout (docs/identity.md has the long form):

    <root>/bundle.pem                        trust bundle: every CA certificate of the trust domain (optional)
    <root>/<namespace>/<serviceaccount>/
        svid.pem       svid_key.pem    [svid_bundle.pem]    spiffe-helper's file names, or
        tls.crt        tls.key         [ca.crt]             cert-manager's (Secret / csi-driver) names

The trust bundle is `<root>/bundle.pem` when present, else the union of the per-identity bundle files. Files are
re-read on every call, so a helper rotating them in place (rename over) shows up as new content, hence a new SDS
Secret version, on the next build. The leaf's URI SAN must be the identity the directory is named for and the key
must match the leaf: a misplaced file is an IdentityError, never another workload's certificate.

The reads build their paths as strings (`os.path`, `glob`), never `pathlib.Path`: on the Python this runs on (3.11)
`Path` interns every part of every path it parses, and these reads run on every build, so each one interned the
identities' directory names anew once the last build's paths had died. A table that churns that way is resized
from its live count every few tens of thousands of insertions, and the process's heap stepped up by a MiB when a
resize doubled it (docs/performance.md, the soak's sidecar steps).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from aether.atomicfile import write_text_atomic
from aether.xds.identity.svid import IdentityError, Svid, TrustBundle, parse_spiffe_id

BUNDLE_FILE = "bundle.pem"
# (chain, key, bundle) file names, in the order they are looked for
FILE_SETS: tuple[tuple[str, str, str], ...] = (
    ("svid.pem", "svid_key.pem", "svid_bundle.pem"),
    ("tls.crt", "tls.key", "ca.crt"),
)


def _leaf_uris(chain_pem: str, where: str) -> list[str]:
    try:
        leaf = x509.load_pem_x509_certificates(chain_pem.encode())[0]
    except ValueError as exc:
        raise IdentityError(f"{where}: not a PEM certificate chain: {exc}") from exc
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(u) for u in san.get_values_for_type(x509.UniformResourceIdentifier)]


def _check_key_matches(chain_pem: str, key_pem: str, where: str) -> None:
    leaf = x509.load_pem_x509_certificates(chain_pem.encode())[0]
    try:
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise IdentityError(f"{where}: unreadable private key: {exc}") from exc
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*fmt) != leaf.public_key().public_bytes(*fmt):
        raise IdentityError(f"{where}: the private key does not match the leaf certificate")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


class DirectorySource:
    """CertificateSource over a directory tree in the layout above."""

    def __init__(self, root: str | os.PathLike[str], trust_domain: str) -> None:
        self.root = os.fspath(root)
        self._trust_domain = trust_domain

    @property
    def trust_domain(self) -> str:
        return self._trust_domain

    def _files(self, namespace: str, service_account: str) -> tuple[str, str, str]:
        d = os.path.join(self.root, namespace, service_account)
        for file_set in FILE_SETS:
            chain, key, bundle = (os.path.join(d, name) for name in file_set)
            if os.path.isfile(chain) and os.path.isfile(key):
                return chain, key, bundle
        expected = " or ".join(f"{c}+{k}" for c, k, _ in FILE_SETS)
        raise IdentityError(f"{d}: no SVID files ({expected})")

    def svid(self, spiffe_id: str) -> Svid:
        sid = parse_spiffe_id(spiffe_id)
        if sid.trust_domain != self._trust_domain:
            raise IdentityError(f"{spiffe_id}: not in trust domain {self._trust_domain!r}")
        chain_path, key_path, _ = self._files(sid.namespace, sid.service_account)
        try:
            chain_pem, key_pem = _read(chain_path), _read(key_path)
        except OSError as exc:
            raise IdentityError(f"{os.path.dirname(chain_path)}: cannot read: {exc}") from exc
        uris = _leaf_uris(chain_pem, chain_path)
        if uris != [spiffe_id]:
            raise IdentityError(f"{chain_path}: leaf URI SANs {uris} are not exactly [{spiffe_id}]")
        _check_key_matches(chain_pem, key_pem, chain_path)
        return Svid(spiffe_id, chain_pem, key_pem)

    def bundle(self) -> TrustBundle:
        top = os.path.join(self.root, BUNDLE_FILE)
        if os.path.isfile(top):
            return TrustBundle(self._trust_domain, _read(top))
        seen: dict[str, None] = {}
        for _chain, _key, bundle_name in FILE_SETS:
            for path in sorted(
                glob.glob(os.path.join(glob.escape(self.root), "*", "*", bundle_name), include_hidden=True)
            ):
                for cert in x509.load_pem_x509_certificates(_read(path).encode()):
                    seen.setdefault(cert.public_bytes(serialization.Encoding.PEM).decode(), None)
        if not seen:
            raise IdentityError(f"{self.root}: no trust bundle ({BUNDLE_FILE} or per-identity bundle files)")
        return TrustBundle(self._trust_domain, "".join(seen))


def write_identity(root: str | os.PathLike[str], svid: Svid, bundle: TrustBundle | None = None) -> Path:
    """Write one identity in spiffe-helper's names (each file replaced atomically, key first); returns its dir."""
    sid = parse_spiffe_id(svid.spiffe_id)
    d = Path(root) / sid.namespace / sid.service_account
    write_text_atomic(d / "svid_key.pem", svid.key_pem, 0o600)
    write_text_atomic(d / "svid.pem", svid.chain_pem)
    if bundle is not None:
        write_text_atomic(d / "svid_bundle.pem", bundle.pem)
    return d


def write_bundle(root: str | os.PathLike[str], bundle: TrustBundle) -> Path:
    path = Path(root) / BUNDLE_FILE
    write_text_atomic(path, bundle.pem)
    return path
