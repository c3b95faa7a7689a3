"""The netns lab that every integration test stands on: it connects what it should and leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aether.testing.netlab import Lab, leftover_netns, sh
from aether.testing.wait import wait_for

pytestmark = pytest.mark.privileged

ASK = (
    "import socket;s=socket.socket(2,2);s.settimeout(3);s.sendto(b'hi',('{ip}',9000));print(s.recvfrom(99)[0].decode())"
)


def test_pods_on_two_nodes_reach_each_other(lab: Lab) -> None:
    a, b = lab.add_node("na"), lab.add_node("nb")
    lab.link_nodes(a, b, "10.199.0.1", "10.199.0.2")
    p1 = lab.add_pod(a, "p1", "10.200.1.2")
    p2 = lab.add_pod(b, "p2", "10.200.2.2")  # added after the link: still routed
    lab.spawn(p2.netns, [sys.executable, "-m", "aether.testing.udp_echo", "p2", "9000"], stdout=subprocess.DEVNULL)

    def reply() -> str | None:  # none until the echo is bound (each try waits 3 s for it)
        argv = ["ip", "netns", "exec", p1.netns, sys.executable, "-c", ASK.format(ip=p2.ip)]
        out = subprocess.run(argv, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else None

    assert wait_for(reply, 60, "p2's echo answering p1", interval=0) == "p2|hi"


def test_close_removes_everything_even_after_a_failure() -> None:
    lab = Lab()
    proc = None
    with pytest.raises(RuntimeError, match="boom"), lab:
        node = lab.add_node("n")
        lab.add_pod(node, "p", "10.200.9.2")
        proc = lab.spawn(node.netns, ["sleep", "60"])
        raise RuntimeError("boom")
    assert proc is not None and proc.poll() is not None
    assert leftover_netns(lab.tag) == []
    assert lab.tag not in sh("ip", "netns", "list")


def test_a_session_that_leaks_a_netns_fails(pytester: pytest.Pytester) -> None:
    """The negative control for tests/conftest.py's end-of-session leak check (seen red here on purpose)."""
    pytester.makeconftest((Path(__file__).parents[1] / "conftest.py").read_text())
    pytester.makepyfile(
        test_leaky="""
import atexit
from aether.testing.netlab import Lab

def test_leaks():
    lab = Lab()
    node = lab.add_node("leak")
    atexit.unregister(lab.close)
    with open("leaked.txt", "w") as fh:
        fh.write(node.netns)
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    leaked = (pytester.path / "leaked.txt").read_text()
    sh("ip", "netns", "del", leaked)  # clean up what the leaky session left, by its exact name
    assert result.ret != 0
    assert "network namespaces left behind by this test session" in result.stdout.str()
    assert leaked in result.stdout.str()


# a test process that starts a `sleep` the way tests start Envoys (Lab.spawn) and control planes (Process.start)
CHILDREN = {
    "lab": """
import sys, time
from aether.testing.netlab import Lab
lab = Lab()
proc = lab.spawn({netns!r}, ["sleep", "300"])
print(proc.pid, flush=True)
time.sleep(300)
""",
    "controlplane": """
import sys, tempfile, time
from pathlib import Path
from aether.testing.controlplane.cluster import Process
proc = Process("sleep", ["sleep", "300"], Path(tempfile.mkdtemp()) / "sleep.log")
proc.start()
print(proc.proc.pid, flush=True)
time.sleep(300)
""",
}


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


@pytest.mark.parametrize(
    ("starter", "in_netns"),
    [("lab", False), ("lab", True), ("controlplane", False)],
    ids=["lab-host", "lab-netns", "controlplane"],
)
def test_a_process_a_test_started_dies_with_the_test_process_however_it_dies(starter: str, in_netns: bool) -> None:
    """A test run killed with SIGKILL runs no finalizer (no close(), no atexit), and the processes it started sit
    in sessions of their own: each must still die with the process that started it (netlab.die_with_parent, a
    `setpriv --pdeathsig KILL --` prefix; an Envoy left by a killed bench run was running 35 minutes later before
    it). Seen red with the prefix taken out: the sleep outlived its parent."""
    with Lab() as lab:
        netns = lab.add_node("orphan").netns if in_netns else None
        code = CHILDREN[starter].format(netns=netns)
        parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            assert parent.stdout is not None
            pid = int(parent.stdout.readline())
            wait_for(lambda: Path(f"/proc/{pid}/comm").read_text().strip() == "sleep", 10, "the sleep to exec")
        finally:
            parent.kill()
            parent.wait()
        try:
            wait_for(lambda: _gone(pid), 10, f"the sleep (pid {pid}) to die with its parent")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
