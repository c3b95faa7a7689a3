"""SDS Secret resources (proto3-JSON dicts) from a CertificateSource, versioned by content.

Rotation is a new Secret version: the version is a hash of the secret's content, so re-issued or re-written PEM
files give a new version with no listener or cluster change (Envoy uses the new certificate for new handshakes
and drains nothing).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from aether.xds.identity.svid import (
    CertificateSource,
    Svid,
    TrustBundle,
    bundle_secret_name,
    selector_secret_name,
    svid_secret_name,
)
from aether.xds.resources import SECRET, Resources, version_of

ADS: Final[dict[str, Any]] = {"ads": {}, "resource_api_version": "V3"}
# A Secret's version is `version_of(secret)`: a content hash (equal content, equal version; any change, a new one).
secret_version = version_of


def svid_secret(svid: Svid, name: str | None = None) -> dict[str, Any]:
    return {
        "name": name or svid_secret_name(svid.spiffe_id),
        "tls_certificate": {
            "certificate_chain": {"inline_string": svid.chain_pem},
            "private_key": {"inline_string": svid.key_pem},
        },
    }


def bundle_secret(bundle: TrustBundle) -> dict[str, Any]:
    return {
        "name": bundle_secret_name(bundle.trust_domain),
        "validation_context": {"trusted_ca": {"inline_string": bundle.pem}},
    }


def secret_resources(source: CertificateSource, spiffe_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The bundle secret plus, per identity, its SVID under both names (`svid:<id>` for TLS contexts, `<id>` for the
    h2 certificate selector), by secret name. Raises IdentityError when the source cannot provide one (the caller
    keeps serving what it had)."""
    out = {bundle_secret_name(source.trust_domain): bundle_secret(source.bundle())}
    for sid in sorted(set(spiffe_ids)):
        svid = source.svid(sid)
        out[svid_secret_name(sid)] = svid_secret(svid, svid_secret_name(sid))
        out[selector_secret_name(sid)] = svid_secret(svid, selector_secret_name(sid))
    return out


def secrets(source: CertificateSource, spiffe_ids: Iterable[str]) -> Resources:
    """`secret_resources` keyed by the SDS type URL, ready to merge with the builders' resources."""
    return {SECRET: secret_resources(source, spiffe_ids)}


def sds_ref(name: str, config_source: dict[str, Any] | None = None) -> dict[str, Any]:
    """An `SdsSecretConfig` naming `name`, fetched over ADS unless another config source is given."""
    return {"name": name, "sds_config": dict(config_source or ADS)}
