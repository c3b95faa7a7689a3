"""The Phase-0 rig on real namespaces, with rulesets from the builder installed by the installer.

Also the rig's own negative controls: when the REDIRECT control does not load, the run fails (BrokenRig), whether
the pre-measure check catches it or only the missing C2 delivery does.
"""

from __future__ import annotations

from typing import Any

import pytest

from aether.netns import install as inst
from aether.netns import rules as nftrules
from aether.netns.contract import L4_OUTBOUND_PORT, CaptureMode
from aether.netns.install import install_capture, remove_capture
from aether.testing.netlab import Lab, Pod
from aether.testing.phase0 import BrokenRig, run_rig

pytestmark = pytest.mark.privileged

VIP = "10.96.0.10"  # exists nowhere: not in the pod, not on the node


@pytest.fixture
def pod(lab: Lab) -> Pod:
    node = lab.add_node("n")
    return lab.add_pod(node, "p", "10.200.1.2")


def test_phase0_rig(pod: Pod) -> None:
    report = run_rig(pod.path, VIP)
    # C1: mark-and-divert keeps the VIP, and the reply comes from VIP:18082
    assert report.c1.delivered_dst == VIP
    assert report.c1.reply_from == (VIP, L4_OUTBOUND_PORT)
    # C2: REDIRECT rewrites the destination (the measurement tracks the real header)
    assert report.c2.delivered_dst == "127.0.0.1"
    # C3: without a rule nothing is delivered
    assert report.c3.delivered_dst is None and report.c3.reply_from is None
    # MAIN: created in the pod netns via setns, read from another netns: still the VIP
    assert report.main.reader_netns_ino != report.main.pod_netns_ino
    assert report.main.delivered_dst == VIP
    assert report.main.reply_from == (VIP, L4_OUTBOUND_PORT)


def _redirect_loads_nothing(path: str, mode: CaptureMode) -> None:
    if mode is CaptureMode.REDIRECT:
        remove_capture(path)  # "installed", but nothing is there
    else:
        install_capture(path, mode)


def test_rig_fails_when_redirect_does_not_load_check_catches_it(pod: Pod) -> None:
    with pytest.raises(BrokenRig, match="C2: the redirect capture is not what the case needs"):
        run_rig(pod.path, VIP, installer=_redirect_loads_nothing)


def test_rig_fails_when_redirect_does_not_load_and_nothing_is_delivered(pod: Pod) -> None:
    """Even with the pre-measure check switched off, no delivery in C2 fails the run instead of passing it."""
    with pytest.raises(BrokenRig, match=r"C2 \(REDIRECT\) delivered nothing"):
        run_rig(pod.path, VIP, installer=_redirect_loads_nothing, checker=lambda p, m: None, wait=0.5)


def test_rig_fails_on_counter_after_redirect(pod: Pod, monkeypatch: pytest.MonkeyPatch) -> None:
    """The historical failure: `redirect to :18082 counter` makes nft load nothing at all."""

    def counter_after_redirect(mode: CaptureMode, ports: Any = None, inbound: Any = None) -> dict[str, Any]:
        rs = nftrules.build_ruleset(mode)
        if mode is CaptureMode.REDIRECT:
            for cmd in rs["nftables"]:
                if "rule" in cmd["add"]:
                    cmd["add"]["rule"]["expr"].append({"counter": None})
        return rs

    monkeypatch.setattr(inst, "build_ruleset", counter_after_redirect)
    with pytest.raises(BrokenRig, match=r"C2: .*nft rejected the redirect ruleset"):
        run_rig(pod.path, VIP)
