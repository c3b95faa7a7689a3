"""Workload identity: SVIDs, the trust bundle, and the interface every certificate source implements.

Pure values and names only. The two sources live in `ca.py` (a built-in CA, for tests and the demo) and
`pemdir.py` (a directory of PEM files per identity, what SPIRE's and cert-manager's helpers write); the SDS
Secret resources built from either live in `sds.py`.

Naming (what Envoy and the sidecar agree on). Each SVID is served under two secret names:
- `<spiffe id>` (`spiffe://<td>/ns/<ns>/sa/<sa>`): the source identity the outbound listener stamps into filter
  state; the h2 clusters' `on_demand_secret` certificate selector (mapper `filter_state_override`) asks for
  exactly that name. Nothing else may subscribe to it: on Envoy 1.40.0 a selector whose secret name was already
  subscribed by a listener's TLS context never received it (handshakes waited out the connect timeout; seen
  here, tests/xds/test_quic_datapath.py), while disjoint names work, across several h2 clusters;
- `svid:<spiffe id>`: what TLS contexts reference (the inbound listeners' server certificate, the QUIC twins'
  client certificate);
- the trust bundle's secret is `bundle:<trust domain>`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

SPIFFE_SCHEME = "spiffe://"
BUNDLE_SECRET_PREFIX = "bundle:"


class IdentityError(ValueError):
    """An identity or certificate that cannot be used: names the identity and why."""


@dataclass(frozen=True)
class SpiffeId:
    trust_domain: str
    namespace: str
    service_account: str

    @property
    def uri(self) -> str:
        return f"{SPIFFE_SCHEME}{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"

    def dns_sans(self, mesh_domain: str) -> tuple[str, str]:
        """`<sa>.<ns>.<mesh-domain>` and `*.<sa>.<ns>.<mesh-domain>`: what the QUIC client's hostname check needs
        for the SNI `<port>.<sa>.<ns>.<mesh-domain>` (identity itself is the URI SAN)."""
        base = f"{self.service_account}.{self.namespace}.{mesh_domain}"
        return base, f"*.{base}"

    def __str__(self) -> str:
        return self.uri


def parse_spiffe_id(uri: str) -> SpiffeId:
    """`spiffe://<td>/ns/<ns>/sa/<sa>` -> SpiffeId; anything else is an IdentityError."""
    if not uri.startswith(SPIFFE_SCHEME):
        raise IdentityError(f"{uri!r}: not a SPIFFE ID (expected spiffe://<trust-domain>/ns/<ns>/sa/<sa>)")
    td, _, path = uri[len(SPIFFE_SCHEME) :].partition("/")
    parts = path.split("/")
    if not td or len(parts) != 4 or parts[0] != "ns" or parts[2] != "sa" or not parts[1] or not parts[3]:
        raise IdentityError(f"{uri!r}: not a workload SPIFFE ID (expected spiffe://<trust-domain>/ns/<ns>/sa/<sa>)")
    return SpiffeId(td, parts[1], parts[3])


SVID_SECRET_PREFIX = "svid:"


def svid_secret_name(spiffe_id: str) -> str:
    """The SVID as TLS contexts reference it (inbound server certificate, a twin's client certificate)."""
    return f"{SVID_SECRET_PREFIX}{spiffe_id}"


def selector_secret_name(spiffe_id: str) -> str:
    """The SVID as the h2 certificate selector asks for it: the stamped source identity itself."""
    return spiffe_id


def bundle_secret_name(trust_domain: str) -> str:
    return f"{BUNDLE_SECRET_PREFIX}{trust_domain}"


@dataclass(frozen=True)
class Svid:
    """One workload certificate: the leaf first, then any intermediates, and its private key (PEM)."""

    spiffe_id: str
    chain_pem: str
    key_pem: str

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256((self.chain_pem + self.key_pem).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TrustBundle:
    """The CA certificates (PEM, concatenated) that peers of `trust_domain` chain to."""

    trust_domain: str
    pem: str


class CertificateSource(Protocol):
    """Where SVIDs and the trust bundle come from. Implementations re-read or re-issue on each call, so a
    rotated certificate shows up as different content (and so a new Secret version) on the next build."""

    @property
    def trust_domain(self) -> str: ...

    def svid(self, spiffe_id: str) -> Svid:
        """The current SVID for `spiffe_id`; IdentityError if this source cannot provide it."""
        ...

    def bundle(self) -> TrustBundle: ...
