"""A MeshPeer's spec.transports (what its gateways offer on 18009) onto the destination entry of each ServiceImport
through it (aether.operator.reconcile.multicluster, pure): the default is both and is not written; [h2] is written
as `gatewayTransports: [h2]` (its sources then get no QUIC twin, tests/xds/test_gateway_tcp.py); a list without h2
is a problem that makes the import UnknownPeer, as the CRD model (PeerSpec) refuses it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from aether.api import multicluster as mc
from aether.operator.reconcile.multicluster import ImportVerdict, import_verdict, parse_import, parse_peer
from aether.testing.apitestbed.objects import mesh_peer, service_import

TD = "cluster.local"


def verdict(transports: list[str] | None = None) -> ImportVerdict:
    peer = mesh_peer("cluster-a", ["192.0.2.10"], transports=transports)
    imp = service_import("default", "web", [("http", 8080, "TCP")], "cluster-a", "web-sa")
    return import_verdict(parse_import(imp), parse_peer(peer), None, TD)


def written(v: ImportVerdict) -> dict[str, Any]:
    assert v.destination is not None, v.message
    out: dict[str, Any] = json.loads(v.destination.model_dump_json(by_alias=True))
    return out


def test_both_is_the_default_and_is_not_written() -> None:
    for transports in (None, ["h3", "h2"], ["h2", "h3"]):
        v = verdict(transports)
        assert v.reason == mc.READY and "gatewayTransports" not in written(v), transports
        assert "UDP 18009 (h3)" in v.message


def test_h2_only_is_written_on_the_destination() -> None:
    v = verdict(["h2"])
    assert v.reason == mc.READY
    assert written(v)["gatewayTransports"] == ["h2"]
    assert "TCP 18009 (h2 only)" in v.message


@pytest.mark.parametrize("transports", [["h3"], ["h2", "quic"], []])
def test_a_list_without_h2_or_with_an_unknown_entry_is_unusable(transports: list[str]) -> None:
    v = verdict(transports)
    assert v.destination is None and v.reason == mc.UNKNOWN_PEER
    assert "spec.transports" in v.message
    with pytest.raises(ValidationError):
        mc.PeerSpec.model_validate({"gateways": ["192.0.2.10"], "transports": transports})
