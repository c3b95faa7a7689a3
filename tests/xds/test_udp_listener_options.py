"""The UDP capture listener's socket options (GRO, the GSO batch writer): what each option emits, and that the
real Envoy 1.40 accepts every combination (`envoy --mode validate`)."""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest

from aether.testing.samples import node_with, records_for
from aether.xds.resources import LISTENER, ResourceDict, Resources, TranslateOptions
from aether.xds.sidecar.bootstrap import static_bootstrap
from aether.xds.translate.compose import translate
from aether.xds.translate.l4.udp import GSO_WRITER, GSO_WRITER_CONFIG

WRITER = {"name": GSO_WRITER, "typedConfig": {"@type": GSO_WRITER_CONFIG}}


def _listener(options: TranslateOptions, tmp: str = "/run/netns") -> ResourceDict:
    node = node_with(2, 1)
    res = translate(node, records_for(node, tmp), options)
    (listener,) = (v for k, v in res[LISTENER].items() if k.startswith("capture-udp:"))
    return listener


def _validate(envoy_bin: Path, tmp_path: Path, resources: Resources) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "bootstrap.json"
    path.write_text(json.dumps(static_bootstrap("node-a", resources)))
    return subprocess.run(
        [
            *(str(envoy_bin), "--mode", "validate", "-c", str(path), "--disable-hot-restart"),
            *("--base-id", str(60_000 + secrets.randbelow(5000)), "-l", "error"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_defaults_emit_gro_and_the_gso_writer() -> None:
    listener = _listener(TranslateOptions(areas=("udp",)))
    assert listener["udpListenerConfig"] == {
        "downstreamSocketConfig": {"preferGro": True},
        "udpPacketPacketWriterConfig": WRITER,
    }


def test_gso_writer_off_leaves_envoys_default_writer() -> None:
    listener = _listener(TranslateOptions(areas=("udp",), udp_gso_writer=False))
    assert listener["udpListenerConfig"] == {"downstreamSocketConfig": {"preferGro": True}}


def test_gso_writer_without_gro() -> None:
    listener = _listener(TranslateOptions(areas=("udp",), udp_prefer_gro=False))
    assert listener["udpListenerConfig"] == {"udpPacketPacketWriterConfig": WRITER}


def test_both_off_has_no_udp_listener_config() -> None:
    listener = _listener(TranslateOptions(areas=("udp",), udp_prefer_gro=False, udp_gso_writer=False))
    assert "udpListenerConfig" not in listener


@pytest.mark.envoy
@pytest.mark.parametrize("gro", [True, False])
@pytest.mark.parametrize("gso", [True, False])
def test_envoy_validates_each_combination(envoy_bin: Path, tmp_path: Path, gro: bool, gso: bool) -> None:
    options = TranslateOptions(areas=("udp",), udp_prefer_gro=gro, udp_gso_writer=gso)
    node = node_with(3, 1)
    resources = translate(node, records_for(node, str(tmp_path / "netns")), options)
    out = _validate(envoy_bin, tmp_path, resources)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK" in out.stdout


@pytest.mark.envoy
def test_validate_rejects_a_misspelled_writer(envoy_bin: Path, tmp_path: Path) -> None:
    """Negative control: the writer's typed config is checked (an unknown type fails validation)."""
    node = node_with(1, 1)
    resources = translate(node, records_for(node, str(tmp_path / "netns")), TranslateOptions(areas=("udp",)))
    (name,) = (k for k in resources[LISTENER] if k.startswith("capture-udp:"))
    listener = json.loads(json.dumps(resources[LISTENER][name]))
    listener["udpListenerConfig"]["udpPacketPacketWriterConfig"]["typedConfig"]["@type"] += "Typo"
    resources[LISTENER][name] = listener
    out = _validate(envoy_bin, tmp_path, resources)
    assert out.returncode != 0
