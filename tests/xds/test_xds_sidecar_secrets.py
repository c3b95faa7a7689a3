"""The sidecar serves the SDS secrets that the east-west resources reference, and refreshes them."""

from __future__ import annotations

import json
from typing import Any

from aether.testing.eastwest_sample import two_sources_one_destination
from aether.xds.ads.cache import SnapshotCache
from aether.xds.identity.ca import BuiltinCA
from aether.xds.resources import SECRET, TranslateOptions
from aether.xds.sidecar.loop import Sidecar
from aether.xds.sidecar.secrets import SecretKeeper

EW = TranslateOptions()  # every area, east-west included


def _secret_names_referenced(resources: dict[str, Any]) -> set[str]:
    names: set[str] = set()

    def walk(obj: Any) -> None:
        if isinstance(obj, dict):
            for key, value in obj.items():
                if key in ("sds_config", "sdsConfig") and "name" in obj:
                    names.add(obj["name"])
                walk(value)
        elif isinstance(obj, list):
            for item in obj:
                walk(item)

    for type_url, by_name in resources.items():
        if type_url != SECRET:
            walk(by_name)
    return names


def _sidecar(keeper: SecretKeeper | None) -> tuple[Sidecar, SnapshotCache]:
    cache = SnapshotCache()
    return Sidecar("node-a", cache, None, options=EW, path_exists=lambda _p: True, secrets=keeper), cache


def test_every_referenced_secret_is_in_the_snapshot() -> None:
    node, records = two_sources_one_destination()
    sc, cache = _sidecar(SecretKeeper(BuiltinCA(EW.trust_domain, EW.mesh_domain)))
    sc.on_records(records)
    sc.on_state(node)
    snap = cache.get("node-a")
    assert snap is not None, sc.condition
    referenced = _secret_names_referenced(json.loads(json.dumps(snap.resources)))
    assert referenced, "the east-west resources reference SDS secrets"
    assert referenced <= set(snap.resources.get(SECRET, {})), referenced - set(snap.resources.get(SECRET, {}))


def test_without_a_keeper_the_referenced_secrets_are_missing() -> None:
    """The negative control: what the sidecar served before it was wired to the certificate source."""
    node, records = two_sources_one_destination()
    sc, cache = _sidecar(None)
    sc.on_records(records)
    sc.on_state(node)
    snap = cache.get("node-a")
    assert snap is not None
    referenced = _secret_names_referenced(json.loads(json.dumps(snap.resources)))
    assert referenced and not referenced <= set(snap.resources.get(SECRET, {}))


def test_a_rotated_certificate_is_a_new_secret_version_and_nothing_else_changes() -> None:
    node, records = two_sources_one_destination()
    ca = BuiltinCA(EW.trust_domain, EW.mesh_domain)
    sc, cache = _sidecar(SecretKeeper(ca))
    sc.on_records(records)
    sc.on_state(node)
    before = cache.get("node-a")
    assert before is not None
    ca.rotate("spiffe://cluster.local/ns/default/sa/client")  # a new leaf for one identity
    sc.poll_secrets()
    after = cache.get("node-a")
    assert after is not None and after.version != before.version
    for type_url, versions in after.versions.items():
        changed = {n for n, v in versions.items() if before.versions.get(type_url, {}).get(n) != v}
        if type_url == SECRET:
            assert changed
        else:
            assert not changed, (type_url, changed)
