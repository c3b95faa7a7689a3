"""The pod's outbound HTTP listener (18080) takes only the pod's own traffic (issue 22, item 1), the pure part and
`envoy --mode validate`: its one forwarding chain matches the direct source (the pod's IP, loopback), and the default
chain refuses anything else with a deny-all RBAC filter, counted and logged. The data path (a caller in the node's
netns and on another node, through the whole mesh) is `tests/e2e/test_e2e_confused_deputy.py`."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.envoy import validate
from aether.xds.gates.authz import rbac_enforced
from aether.xds.gates.quic import run_quic_gates
from aether.xds.resources import LISTENER, Resources, TranslateOptions
from aether.xds.sidecar.bootstrap import static_bootstrap
from aether.xds.translate.eastwest.build import build

OUTBOUND = "http-outbound:default/client-0"


def resources() -> Resources:
    node, records = sample_node(
        "node-a",
        [SamplePod("u-client", "client-0", "10.200.1.2", "client", "/run/netns/client")],
        [SampleDestination("default/web", "web-sa", (8080,), ("10.200.2.7",), vip="10.96.0.20")],
    )
    return build(node, records, TranslateOptions(trust_domain="cluster.local"))


def test_only_the_pods_own_sources_reach_the_forwarding_chain() -> None:
    listener = resources()[LISTENER][OUTBOUND]
    (chain,) = listener["filterChains"]
    assert chain["filterChainMatch"] == {
        "directSourcePrefixRanges": [
            {"addressPrefix": "10.200.1.2", "prefixLen": 32},
            {"addressPrefix": "127.0.0.0", "prefixLen": 8},
            {"addressPrefix": "::1", "prefixLen": 128},
        ]
    }
    default = listener["defaultFilterChain"]
    assert default["name"] == "foreign-source"
    (hcm,) = default["filters"]
    cfg = hcm["typedConfig"]
    assert cfg["statPrefix"] == "http_outbound_foreign_source"
    rbac = cfg["httpFilters"][0]["typedConfig"]["rules"]
    assert rbac["action"] == "DENY" and list(rbac["policies"]) == ["aether:not-this-pods-traffic"]
    assert rbac["policies"]["aether:not-this-pods-traffic"]["principals"] == [{"any": True}]
    assert [r["directResponse"]["status"] for r in cfg["routeConfig"]["virtualHosts"][0]["routes"]] == [403]
    assert "setFilterState" not in str(default)  # no identity is ever stamped on what the default chain sees


def test_the_gates_pass_it() -> None:
    res = resources()
    assert rbac_enforced(res) == [] and run_quic_gates(res) == []


def _validatable(listener: dict[str, Any]) -> dict[str, Any]:
    """The listener as a static one: no netns (validate runs here), the forwarding chain's RDS and ODCDS replaced
    by an empty inline route (both come over ADS, which a static bootstrap has not)."""
    out = copy.deepcopy(listener)
    out["address"]["socketAddress"].pop("networkNamespaceFilepath")
    hcm = out["filterChains"][0]["filters"][1]["typedConfig"]
    hcm.pop("rds")
    hcm["routeConfig"] = {"name": "empty"}
    hcm["httpFilters"] = [f for f in hcm["httpFilters"] if f["name"] != "envoy.filters.http.on_demand"]
    return out


@pytest.mark.envoy
def test_envoy_validates_the_listener_and_refuses_a_broken_one() -> None:
    listener = _validatable(resources()[LISTENER][OUTBOUND])
    out = validate(static_bootstrap("node-a", {LISTENER: {OUTBOUND: listener}}))
    assert out.returncode == 0, out.stdout + out.stderr
    broken = copy.deepcopy(listener)
    broken["defaultFilterChain"]["filters"][0]["typedConfig"]["httpFilters"][0]["typedConfig"]["rules"]["action"] = (
        "REFUSE"
    )
    out = validate(static_bootstrap("node-a", {LISTENER: {OUTBOUND: broken}}))
    assert out.returncode != 0 and "REFUSE" in out.stdout + out.stderr  # validation is not silently green
