"""`aether xds` command line: clear errors and non-zero exits on bad input; bootstrap output."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

from aether.testing.wait import wait_for


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aether.cli", "xds", *args], capture_output=True, text=True, timeout=60
    )


def _sample_state(tmp_path: Path) -> tuple[str, ...]:
    """`aether xds render` arguments for two sources and one destination (`two_sources_one_destination`), written
    under `tmp_path`."""
    from aether.netns.records import write_record
    from aether.testing.eastwest_sample import two_sources_one_destination

    node, records = two_sources_one_destination()
    state = tmp_path / "node.json"
    state.write_text(json.dumps(node.wire()))
    for record in records.values():
        write_record(record, tmp_path / "records")
    return ("render", "--state", str(state), "--records", str(tmp_path / "records"))


def test_bootstrap_points_delta_ads_at_the_sidecar() -> None:
    out = _run("bootstrap", "--node", "node-a", "--xds", "unix:/run/aether/xds.sock")
    assert out.returncode == 0, out.stderr
    boot = json.loads(out.stdout)
    assert boot["node"]["id"] == "node-a"
    assert boot["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"
    ep = boot["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert ep["endpoint"]["address"] == {"pipe": {"path": "/run/aether/xds.sock"}}


def test_bad_inputs_fail_clearly(tmp_path: Path) -> None:
    cases = [
        (("bootstrap", "--node", "n", "--xds", "nowhere"), "expected host:port or unix:PATH"),
        (("bootstrap",), "--node"),
        (("--node", "n", "--listen", "1.2.3.4"), "expected host:port or unix:PATH"),
        (("--node", "n", "--state", str(tmp_path / "x.yaml"), "--areas", "udp,bogus"), "unknown ['bogus']"),
        (("render", "--state", str(tmp_path / "absent.yaml")), "cannot read"),
    ]
    for args, message in cases:
        out = _run(*args)
        assert out.returncode != 0, args
        assert message in out.stderr, (args, out.stderr)


def test_render_refuses_a_duplicate_vip_and_prints_the_rest(tmp_path: Path) -> None:
    """As the sidecar does: the two arms claiming one VIP are refused, the unrelated arm is still rendered."""
    import yaml

    from aether.testing.samples import node_with

    node = node_with(3, 1)
    arms = node.status.udp.services
    arms[1] = arms[1].model_copy(update={"vip": arms[0].vip})
    state = tmp_path / "meshnode.yaml"
    state.write_text(yaml.safe_dump(node.wire()))
    out = _run("render", "--state", str(state), "--records", str(tmp_path / "no-records"))
    assert out.returncode == 0, out.stderr
    assert "refused, the rest is served" in out.stderr and arms[0].vip in out.stderr
    clusters = json.loads(out.stdout)["type.googleapis.com/envoy.config.cluster.v3.Cluster"]
    assert arms[2].cluster in clusters and arms[0].cluster not in clusters and arms[1].cluster not in clusters


def test_render_from_a_list_of_meshnodes_and_slices_equals_the_inline_state(tmp_path: Path) -> None:
    """`kubectl get mn,mss -o yaml` is a List: --node picks the MeshNode, its named slices supply the arms, and
    the output is what the same arms inline give; a named slice missing is said and the rest rendered."""
    import yaml

    from aether.testing.samples import as_slices, node_with

    node = node_with(6, 1)
    inline = tmp_path / "inline.yaml"
    inline.write_text(yaml.safe_dump(node.wire()))
    listed = as_slices(node, count=2)
    listed["items"].append(node_with(1, 1, name="node-b").wire())
    state = tmp_path / "list.yaml"
    state.write_text(yaml.safe_dump(listed))
    records = str(tmp_path / "no-records")
    want = _run("render", "--state", str(inline), "--records", records)
    got = _run("render", "--state", str(state), "--node", "node-a", "--records", records)
    assert want.returncode == got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == json.loads(want.stdout) and got.stderr == ""
    two = _run("render", "--state", str(state), "--records", records)
    assert two.returncode != 0 and "holds exactly one MeshNode, found 2; --node picks one" in two.stderr
    listed["items"] = [i for i in listed["items"] if i["metadata"]["name"] != "default.1"]
    state.write_text(yaml.safe_dump(listed))
    partial = _run("render", "--state", str(state), "--node", "node-a", "--records", records)
    assert partial.returncode == 0, partial.stderr
    assert "incomplete state, the rest is rendered: 1 MeshServiceSlices missing: default.1" in partial.stderr


def _up(sock: Path, proc: subprocess.Popen[str]) -> bool:
    return sock.exists() or proc.poll() is not None


def test_a_sidecar_without_certificates_refuses_to_start(tmp_path: Path) -> None:
    """Production: no --certs-dir and no development flag is a refusal naming --certs-dir (before it, the sidecar
    came up with a built-in CA no other node shares); with --dev-builtin-ca or the east-west area off it starts."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "AETHER_XDS_DEV_BUILTIN_CA"}
    state = tmp_path / "node.yaml"
    state.write_text("apiVersion: mesh.aether.dev/v1alpha1\nkind: MeshNode\nmetadata: {name: n}\nstatus: {}\n")
    argv = [sys.executable, "-m", "aether.cli", "xds", "--node", "n", "--state", str(state)]
    out = subprocess.run(
        [*argv, "--listen", f"unix:{tmp_path / 'a.sock'}"], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 2 and "--certs-dir" in out.stderr, out.stderr
    for i, extra in enumerate((["--dev-builtin-ca"], ["--areas", "udp,tcp-floor"])):
        sock = tmp_path / f"b{i}.sock"
        proc = subprocess.Popen([*argv, "--listen", f"unix:{sock}", *extra], stderr=subprocess.PIPE, text=True, env=env)
        try:  # started: it listens (or it exited, which fails below)
            wait_for(functools.partial(_up, sock, proc), timeout=30, what=f"aether xds {extra} listening")
            assert proc.poll() is None, (extra, proc.stderr.read() if proc.stderr else "")
        finally:
            proc.kill()
            proc.wait(10)


def test_the_mesh_domain_reaches_the_routes_and_the_sni(tmp_path: Path) -> None:
    """`--mesh-domain`: the outbound routes answer <svc>.<ns>.<domain> and a twin's SNI ends in it; a name that is
    not a domain is a usage error."""

    base = _sample_state(tmp_path)
    out = _run(*base, "--mesh-domain", "mesh.example.org")
    assert out.returncode == 0, out.stderr
    assert ".mesh.example.org" in out.stdout and "mesh.aether.internal" not in out.stdout
    assert "quic." in out.stdout  # the twins are there: the SNI check is not vacuous
    bad = _run(*base, "--mesh-domain", "Not_A_Domain")
    assert bad.returncode != 0 and "is not a DNS domain" in bad.stderr


def test_east_west_quic_off_routes_every_destination_over_its_h2_cluster(tmp_path: Path) -> None:
    """`--east-west-quic off`: the pods' outbound route names the destination's h2 cluster, with no per-source twin
    selection, and no twin is built; on (the default) the twins are there."""
    from aether.xds.resources import CLUSTER, ROUTE

    base = _sample_state(tmp_path)
    on, off = _run(*base), _run(*base, "--east-west-quic", "off")
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    clusters = {c: set(json.loads(r.stdout)[CLUSTER]) for c, r in (("on", on), ("off", off))}
    twins = {c: {n for n in names if n.startswith("quic:")} for c, names in clusters.items()}
    assert twins["on"] and not twins["off"], twins
    assert "h2:default/web" in clusters["off"]
    route = json.loads(off.stdout)[ROUTE]["http-outbound"]
    actions = [r["route"] for vh in route["virtualHosts"] for r in vh["routes"]]
    assert actions and all(set(a) == {"cluster"} and a["cluster"].startswith("h2:") for a in actions), actions


def test_the_east_west_idle_timeout_reaches_every_h2_cluster_and_twin(tmp_path: Path) -> None:
    """`--east-west-idle-timeout`: every h2 cluster's and twin's HTTP idle timeout (5 minutes without it, not
    Envoy's hour); a value that is not a duration is a usage error."""
    from aether.xds.resources import CLUSTER

    base = _sample_state(tmp_path)

    def idle(*extra: str) -> dict[str, str]:
        out = _run(*base, *extra)
        assert out.returncode == 0, out.stderr
        clusters = json.loads(out.stdout)[CLUSTER].items()
        options = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        return {
            name: c["typedExtensionProtocolOptions"][options]["commonHttpProtocolOptions"]["idleTimeout"]
            for name, c in clusters
            if name.startswith(("h2:", "quic:"))
        }

    default, set_ = idle(), idle("--east-west-idle-timeout", "90s")
    assert any(n.startswith("quic:") for n in default) and any(n.startswith("h2:") for n in default), default
    assert set(default.values()) == {"300s"} and set(set_.values()) == {"90s"} and set_.keys() == default.keys()
    bad = _run(*base, "--east-west-idle-timeout", "soon")
    assert bad.returncode != 0 and "not a duration" in bad.stderr


def test_the_sidecar_runs_full_collections_and_exports_the_heap_after_them(tmp_path: Path) -> None:
    """`--full-gc-every SECONDS` (aether.heap): the running sidecar's metrics carry the full collections' count and
    the heap after the last one; a negative period is refused."""
    import socket

    from aether.testing.promtext import named, scrape

    state = tmp_path / "node.yaml"
    state.write_text("apiVersion: mesh.aether.dev/v1alpha1\nkind: MeshNode\nmetadata: {name: n}\nstatus: {}\n")
    argv = [sys.executable, "-m", "aether.cli", "xds", "--node", "n", "--state", str(state), "--dev-builtin-ca"]
    out = subprocess.run(
        [*argv, "--listen", f"unix:{tmp_path / 'a.sock'}", "--full-gc-every", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        out.returncode == 2 and "argument --full-gc-every: '-1': must be 0 (off) or positive seconds" in out.stderr
    ), out.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    extra = ["--listen", f"unix:{tmp_path / 'b.sock'}", "--metrics", f"127.0.0.1:{port}", "--full-gc-every", "0.2"]
    proc = subprocess.Popen([*argv, *extra], stderr=subprocess.DEVNULL)
    try:

        def collected() -> dict[str, float] | None:
            try:
                got = scrape(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                return None
            figures = {
                m: sum(named(got, m).values())
                for m in (
                    "aether_process_full_gc_total",
                    "aether_process_malloc_in_use_after_full_gc_bytes",
                    "aether_process_python_allocated_blocks_after_full_gc",
                )
            }
            return figures if figures["aether_process_full_gc_total"] >= 3 else None

        figures = wait_for(collected, 60.0, "three full collections in the sidecar's metrics", interval=0.2)
        assert figures["aether_process_malloc_in_use_after_full_gc_bytes"] > 1 << 20, figures
        assert figures["aether_process_python_allocated_blocks_after_full_gc"] > 10_000, figures
    finally:
        proc.terminate()
        proc.wait(timeout=30)
