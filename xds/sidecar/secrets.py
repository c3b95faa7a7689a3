"""The thin shell between a certificate source and the sidecar's snapshot: choose the source, build the secrets
each state references, keep the last good ones when the source fails, run the east-west gates.

How the sidecar uses it (one call per reconcile, after `translate`):

    keeper = SecretKeeper(make_source(certs_dir, options))          # once
    resources, failures = keeper.finish(node, records, options, translated)
    # failures: the east-west gates' refusals (serve nothing new when non-empty), like aether.xds.gates.core
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from aether.api.meshnode import MeshNode
from aether.netns.records import PodRecord
from aether.xds.gates.core import GateFailure
from aether.xds.gates.quic import run_quic_gates
from aether.xds.identity.ca import BuiltinCA
from aether.xds.identity.pemdir import DirectorySource
from aether.xds.identity.svid import CertificateSource, IdentityError
from aether.xds.resources import SECRET, Resources, TranslateOptions, merge
from aether.xds.translate.eastwest.build import secrets_for

log = logging.getLogger("aether.xds.identity.svid")


def make_source(certs_dir: str | os.PathLike[str] | None, options: TranslateOptions) -> CertificateSource:
    """A PEM directory (docs/identity.md) when given, else a built-in CA (tests and the demo only)."""
    if certs_dir:
        return DirectorySource(certs_dir, options.trust_domain)
    return BuiltinCA(options.trust_domain, options.mesh_domain)


class SecretKeeper:
    """Secrets per state from one source; on IdentityError the previous secret of that name keeps serving (a
    rotation half written by a helper never replaces a good certificate)."""

    def __init__(self, source: CertificateSource) -> None:
        self.source = source
        self._lock = threading.Lock()
        self._last: dict[str, dict[str, Any]] = {}
        self.last_error: str | None = None

    def secrets(self, node: MeshNode, records: Mapping[str, PodRecord], options: TranslateOptions) -> Resources:
        with self._lock:
            try:
                fresh = secrets_for(node, records, options, self.source)[SECRET]
            except IdentityError as exc:
                self.last_error = str(exc)
                log.warning("certificate source failed, keeping the last good secrets: %s", exc)
                return {SECRET: dict(self._last)}
            self.last_error = None
            self._last = dict(fresh)
            return {SECRET: fresh}

    def finish(
        self, node: MeshNode, records: Mapping[str, PodRecord], options: TranslateOptions, translated: Resources
    ) -> tuple[Resources, list[GateFailure]]:
        """`translated` plus the secrets it references, and the east-west gates' refusals of the result."""
        merged = merge(translated, self.secrets(node, records, options))
        return merged, run_quic_gates(merged)
