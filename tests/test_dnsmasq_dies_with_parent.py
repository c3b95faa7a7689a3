"""A dnsmasq started the way the tests start it (`aether.testing.udp_clients.dnsmasq_argv` under the lab's
parent-death signal) dies with the process that started it, even when that process never runs its cleanup (killed,
a CI job's SIGTERM): before `--group=root`, dnsmasq's switch to its default group cleared the signal (prctl(2)) and
a killed soak left its two dnsmasq processes running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aether.testing.wait import wait_for

pytestmark = pytest.mark.privileged  # dnsmasq --user=root needs root

_STARTER = """
import os, subprocess, sys
from pathlib import Path
from aether.testing.netlab import die_with_parent
from aether.testing.udp_clients import dnsmasq_argv
argv = dnsmasq_argv("127.0.0.1", int(sys.argv[1]), "10.0.0.9", Path(sys.argv[2]))
p = subprocess.Popen(die_with_parent(argv), start_new_session=True)
print(p.pid, flush=True)
sys.stdin.readline()  # the test says when dnsmasq is up
os._exit(0)  # no cleanup: as a killed test
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _free_port() -> int:
    """A port free for both UDP and TCP on 127.0.0.1 (dnsmasq binds both)."""
    import socket

    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u, socket.socket() as t:
            u.bind(("127.0.0.1", 0))
            port: int = u.getsockname()[1]
            try:
                t.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def _serving(pid: int, port: int) -> bool:
    """`pid` is dnsmasq (the exec happened) and a UDP socket on `port` is open in its network namespace."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        udp = Path(f"/proc/{pid}/net/udp").read_text()
    except FileNotFoundError:
        return False
    return comm == "dnsmasq" and f":{port:04X} " in udp


def test_a_dnsmasq_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    port, root = _free_port(), Path(__file__).resolve().parents[1]
    err = tmp_path / "stderr"
    with err.open("w") as errors:  # the starter's and dnsmasq's own complaints, shown if it never serves
        starter = subprocess.Popen(
            [sys.executable, "-c", _STARTER, str(port), str(tmp_path)],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    assert starter.stdout is not None and starter.stdin is not None
    pid = int(starter.stdout.readline() or -1)
    try:
        wait_for(lambda: _serving(pid, port), 15, f"dnsmasq on {port}", diagnose=err.read_text)
        starter.stdin.write("go\n")
        starter.stdin.flush()
        starter.wait(15)
        wait_for(lambda: not _alive(pid), 10, f"dnsmasq {pid} to die with its parent")
    finally:
        if _alive(pid):
            os.kill(pid, 9)
