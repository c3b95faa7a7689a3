"""The identity shell: the source it picks, secrets per state, the last good secrets on a failing source, gates."""

from __future__ import annotations

from pathlib import Path

from aether.testing.eastwest_sample import two_sources_one_destination
from aether.xds.identity.ca import BuiltinCA
from aether.xds.identity.pemdir import DirectorySource, write_bundle, write_identity
from aether.xds.resources import LISTENER, SECRET, TranslateOptions
from aether.xds.sidecar.secrets import SecretKeeper, make_source
from aether.xds.translate.eastwest.build import EastWestOptions, build

OPTS = TranslateOptions()
CLIENT = "spiffe://cluster.local/ns/default/sa/client"
OTHER = "spiffe://cluster.local/ns/default/sa/other"


def test_make_source_picks_the_directory_when_given(tmp_path: Path) -> None:
    assert isinstance(make_source(tmp_path, OPTS), DirectorySource)
    assert isinstance(make_source(None, OPTS), BuiltinCA)


def test_finish_adds_the_referenced_secrets_and_runs_the_gates() -> None:
    node, records = two_sources_one_destination()
    keeper = SecretKeeper(BuiltinCA())
    res, failures = keeper.finish(node, records, OPTS, build(node, records, OPTS))
    assert failures == []
    assert set(res[SECRET]) == {"bundle:cluster.local", CLIENT, OTHER, "svid:" + CLIENT, "svid:" + OTHER}
    leaky = build(node, records, OPTS, EastWestOptions(identity_factory="envoy.string"))
    _, failures = keeper.finish(node, records, OPTS, leaky)
    assert [f.gate for f in failures] == ["identity-hashable", "identity-hashable"]
    assert LISTENER in res


def test_a_failing_source_keeps_the_last_good_secrets(tmp_path: Path) -> None:
    ca = BuiltinCA()
    write_bundle(tmp_path, ca.bundle())
    for sid in (CLIENT, OTHER):
        write_identity(tmp_path, ca.svid(sid))
    node, records = two_sources_one_destination()
    keeper = SecretKeeper(DirectorySource(tmp_path, "cluster.local"))
    good = keeper.secrets(node, records, OPTS)
    assert keeper.last_error is None
    # a helper half-way through a rotation: new certificate, old key
    (tmp_path / "default" / "client" / "svid.pem").write_text(ca.rotate(CLIENT).chain_pem)
    kept = keeper.secrets(node, records, OPTS)
    assert kept == good and keeper.last_error is not None and "does not match" in keeper.last_error
    write_identity(tmp_path, ca.svid(CLIENT))
    fresh = keeper.secrets(node, records, OPTS)
    assert keeper.last_error is None and fresh[SECRET]["svid:" + CLIENT] != good[SECRET]["svid:" + CLIENT]
