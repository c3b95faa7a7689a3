"""A built-in CA (the `cryptography` package) issuing SVIDs per ServiceAccount: for tests and the demo.

Each SVID carries the URI SAN `spiffe://<td>/ns/<ns>/sa/<sa>` (the identity) and the DNS SANs
`<sa>.<ns>.<mesh-domain>` and `*.<sa>.<ns>.<mesh-domain>` (what Envoy's QUIC client checks against the SNI).
SVIDs are cached per identity; `rotate()` re-issues one (new key, new serial), which becomes a new SDS Secret
version on the next build.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from aether.api.naming import DEFAULT_MESH_DOMAIN, DEFAULT_TRUST_DOMAIN
from aether.xds.identity.svid import IdentityError, Svid, TrustBundle, parse_spiffe_id

_BACKDATE = dt.timedelta(minutes=5)
# the key usages neither certificate has (KeyUsage takes all nine by name)
_NO_KEY_USAGE = dict.fromkeys(
    ("content_commitment", "key_encipherment", "data_encipherment", "encipher_only", "decipher_only"), False
)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePublicKey, validity: dt.timedelta, *, ca: bool
) -> x509.CertificateBuilder:
    """A certificate from `issuer` for `subject`, valid from a little before now for `validity`: a CA that signs
    leaves and nothing below them (path length 0), or a leaf for ECDHE key agreement and signatures."""
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(
            x509.KeyUsage(**_NO_KEY_USAGE, digital_signature=True, key_cert_sign=ca, crl_sign=ca, key_agreement=not ca),
            critical=True,
        )
    )


class BuiltinCA:
    """A self-signed root for one trust domain; issues leaf SVIDs directly under it."""

    def __init__(
        self,
        trust_domain: str = DEFAULT_TRUST_DOMAIN,
        mesh_domain: str = DEFAULT_MESH_DOMAIN,
        *,
        validity: dt.timedelta = dt.timedelta(hours=24),
        ca_validity: dt.timedelta = dt.timedelta(days=365),
    ) -> None:
        self._trust_domain = trust_domain
        self.mesh_domain = mesh_domain
        self.validity = validity
        self._lock = threading.Lock()
        self._cache: dict[str, Svid] = {}
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "aether"),
                x509.NameAttribute(NameOID.COMMON_NAME, trust_domain),
            ]
        )
        self._ca_cert = (
            _builder(name, name, self._ca_key.public_key(), ca_validity, ca=True)
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"spiffe://{trust_domain}")]),
                critical=False,
            )
            .sign(self._ca_key, hashes.SHA256())
        )

    @property
    def trust_domain(self) -> str:
        return self._trust_domain

    def bundle(self) -> TrustBundle:
        return TrustBundle(self._trust_domain, _cert_pem(self._ca_cert))

    def svid(self, spiffe_id: str) -> Svid:
        sid = parse_spiffe_id(spiffe_id)
        if sid.trust_domain != self._trust_domain:
            raise IdentityError(f"{spiffe_id}: not in this CA's trust domain {self._trust_domain!r}")
        with self._lock:
            cached = self._cache.get(spiffe_id)
            if cached is None:
                cached = self.issue(spiffe_id, dns_names=sid.dns_sans(self.mesh_domain))
                self._cache[spiffe_id] = cached
            return cached

    def rotate(self, spiffe_id: str) -> Svid:
        """Re-issue `spiffe_id`'s SVID (new key and serial); later `svid()` calls return the new one."""
        with self._lock:
            self._cache.pop(spiffe_id, None)
        return self.svid(spiffe_id)

    def issue(
        self,
        uri: str | None,
        *,
        dns_names: Sequence[str] = (),
        more_uris: Sequence[str] = (),
        common_name: str | None = None,
    ) -> Svid:
        """A leaf signed by this CA with exactly these SANs, `uri` then `more_uris` (no checks): also how tests build
        bad certificates, e.g. a URI-only SVID, one outside the trust domain, one with two URI SANs or with a
        SPIFFE ID as its DNS SAN or subject common name."""
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in [uri or "", *more_uris] if u]
        sans += [x509.DNSName(n) for n in dns_names]
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "aether")]
        if common_name is not None:
            subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        builder = _builder(
            x509.Name(subject), self._ca_cert.subject, key.public_key(), self.validity, ca=False
        ).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        return Svid(uri or "", _cert_pem(cert), _key_pem(key))
