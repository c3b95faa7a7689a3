"""What a refused twin name costs a real Envoy, with `envoy.reloadable_features.odcds_over_ads_fix` at its default
and off: node A of the `aether.testing.quic_mesh` rig is restarted with the runtime flag and served by the sidecar
(its pair machine on the ADS hooks); its MeshNode lists default/web as a destination and as ineligible, so every
fetch of web's twin is refused. Three requests, then the name made valid (web no longer ineligible), one more.

    .venv/bin/python -m bench.quic_pairs_odcds_flag [--flag default|off]

Printed per request: status, seconds, and whether a new on-demand request reached the sidecar.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from aether.api.meshnode import IneligibleDestination
from aether.testing.eastwest_lab import http_in_netns, start_envoy
from aether.testing.eastwest_sample import SampleDestination, SamplePod, sample_node
from aether.testing.quic_mesh import MD, OPTS, VIP, quic_mesh
from aether.testing.wait import wait_for
from aether.xds.sidecar.loop import Sidecar
from aether.xds.sidecar.secrets import SecretKeeper

FLAG = "envoy.reloadable_features.odcds_over_ads_fix"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.quic_pairs_odcds_flag", description=__doc__.split("\n\n")[0])
    ap.add_argument("--flag", choices=["default", "off"], default="default")
    args = ap.parse_args()
    with quic_mesh(Path(tempfile.mkdtemp(prefix="odcds-flag-"))) as mesh:
        mesh.a.stop()
        runtime = {FLAG: False} if args.flag == "off" else None
        mesh.a = start_envoy(mesh.lab, mesh.lab.nodes["qa"].netns, "node-a", mesh.workdir, mesh.ads, runtime=runtime)
        node, records = sample_node(
            "node-a",
            [SamplePod("u-client", "client-0", mesh.client.ip, "client", mesh.client.path)],
            [SampleDestination("default/web", "web-sa", (8080,), (mesh.web.ip,), vip=VIP)],
            dialled=False,
        )
        node.status.quic.ineligible = [IneligibleDestination(service="default/web", reason="NoReadyEndpoints")]
        sidecar = Sidecar("node-a", mesh.ads.cache, None, options=OPTS, secrets=SecretKeeper(mesh.ca))
        mesh.ads.servicer.events = sidecar
        mesh.ads.servicer.on_demand = sidecar.on_demand
        sidecar.on_records(records)
        sidecar.on_state(node)
        wait_for(lambda: "http-outbound" in mesh.a.admin("/listeners"), 30, "node A's outbound listener")
        wait_for(lambda: "quic:default/web@" not in mesh.a.admin("/clusters"), 30, "no twin on node A")
        print(f"{FLAG}: {args.flag}")

        def request(label: str) -> None:
            sent = len(mesh.ads.servicer.sent)
            t0 = time.monotonic()
            (status, _), *_ = http_in_netns(mesh.client.netns, f"web.default.{MD}", ip=VIP)
            took = time.monotonic() - t0
            asked = any("quic:default/web@client" in r.removed for r in list(mesh.ads.servicer.sent)[sent:])
            print(
                f"  {label}: {status} in {took:.2f} s; an on-demand request reached the sidecar (answered absent): {asked}"
            )

        for i in range(3):
            request(f"request {i + 1} (name refused)")
        fixed = node.model_copy(deep=True)
        fixed.status.quic.ineligible = []
        sidecar.on_state(fixed)
        wait_for(lambda: "quic:default/web@client::" in mesh.a.admin("/clusters"), 30, "the twin pushed")
        request("after the name passes the check (twin pushed, no request)")


if __name__ == "__main__":
    main()
