"""`aether demo` as CI and a user run it (a subprocess): it completes, shows per-service selection, the route
change and the per-source identities over HTTP/3, and leaves no netns, process or file behind, also when stopped
with Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import secrets
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from aether.e2e import demo
from aether.testing.commands import command
from aether.testing.netlab import NETNS_DIR
from aether.testing.wait import wait_for

DEMO_TIMEOUT = 240


def _marked(mark: str) -> list[int]:
    """PIDs of processes carrying the demo's environment mark (everything it started inherits it)."""
    needle = f"AETHER_DEMO_MARK={mark}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "environ").read_bytes().split(b"\0"):
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def _header(out: str) -> tuple[str, Path]:
    m = re.search(r"aether demo: lab tag (\S+), working directory (\S+)", out)
    assert m, out
    return m.group(1), Path(m.group(2))


def _assert_nothing_left(out: str, mark: str, reap: float = 10.0) -> None:
    tag, workdir = _header(out)
    assert not workdir.exists(), f"{workdir} left behind"
    left = sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(tag)) if NETNS_DIR.is_dir() else []
    assert left == [], f"netns left behind: {left}"
    with contextlib.suppress(TimeoutError):  # a SIGKILLed process may take a moment to be reaped by init
        wait_for(lambda: not _marked(mark), reap, "marked processes to be gone", interval=0.2)
    assert _marked(mark) == [], "processes left behind"


class Running:
    """A demo subprocess whose stdout is read line by line in the background."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.mark = secrets.token_hex(8)
        self.proc = subprocess.Popen(
            [*command(), "demo", *args],
            env={**os.environ, **(env or {}), "AETHER_DEMO_MARK": self.mark},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, as in a terminal
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for_line(self, pattern: str, timeout: float = DEMO_TIMEOUT) -> str:
        def next_match() -> str | None:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    raise AssertionError(
                        f"the demo exited without a line matching {pattern!r}:\n{self.text()}"
                    ) from None
                return None
            self.out.append(line)
            return line if re.search(pattern, line) else None

        return wait_for(next_match, timeout, f"a line matching {pattern!r}", interval=0, diagnose=self.text)

    def finish(self, timeout: float = DEMO_TIMEOUT) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(timeout)  # every line it printed is queued: the reader has seen its stdout close
        while not self.lines.empty():
            self.out.append(self.lines.get())
        return code

    def text(self) -> str:
        return "".join(self.out)


@pytest.mark.privileged
@pytest.mark.envoy
@pytest.mark.slow
def test_demo_completes_shows_selection_and_leaves_nothing_behind() -> None:
    run = Running()
    code = run.finish()
    out = run.text()
    assert code == 0, out
    for svc, backend in demo.SERVICES.items():  # table 1: each VIP answered by its own backend, from VIP:18082
        assert re.search(rf"demo/client +demo/{svc} +(\S+):18082 +{backend} +\1:18082 +as expected\n", out), out
    assert re.search(r"demo/client +demo/bravo +\S+ +echo-charlie +\S+ +as expected \(was echo-bravo\)", out), out
    assert len(re.findall(r"demo/client-redirect +demo/\w+ +\S+ +no reply +- +as expected", out)) == 3, out
    # the weighted split after the re-point: 70/30/0 over fresh sessions, each within 5 points, the drained one 0
    for backend, weight in (("echo-charlie", 70), ("echo-alpha", 30)):
        m = re.search(rf"\n +{backend} +{weight} +{weight}% +(\d+) +([\d.]+)% +as expected\n", out)
        assert m and abs(float(m.group(2)) - weight) <= 5, out
    assert re.search(r"\n +echo-bravo +0 +0% +0 +0\.0% +as expected\n", out), out
    assert "no reply" not in out.split("3. Weighted split")[1].split("4. The negative control")[0], out
    for pod, sa in demo.HTTP_CLIENTS.items():  # table 4: each source's own identity over its own HTTP/3 twin
        twin, sid = f"quic:demo/web@{sa}", f"spiffe://cluster.local/ns/demo/sa/{sa}"
        assert re.search(
            rf"demo/{pod} +\S+ +web-0 \(200\) +{re.escape(twin)} HTTP/3 +{re.escape(sid)} +as expected", out
        ), out
    for sa in demo.HTTP_CLIENTS.values():  # table 5: the pair each source's first request recorded
        twin, sid = f"quic:demo/web@{sa}", f"spiffe://cluster.local/ns/demo/sa/{sa}"
        assert re.search(rf"{re.escape(sid)} +demo/web +{re.escape(twin)} +Fetch +\w+ +as expected", out), out
    # table 7: the app port called directly is dropped (STRICT); the policy lets client in and turns reporter away
    assert re.search(r"demo/reporter +[\d.]+:8080 directly +no answer +STRICT +as expected", out), out
    assert re.search(r"demo/client +web\.demo\.\S+ \(mesh\) +200 \(app saw \S+/sa/client\) +allowed by", out), out
    assert re.search(r"demo/reporter +web\.demo\.\S+ \(mesh\) +403 +not in web-callers: RBAC +as expected", out), out
    assert "Accepted=True/Accepted" in out
    assert "UNEXPECTED" not in out and "result: every VIP reached the backend it should" in out
    _assert_nothing_left(out, run.mark)


def _run_on(api_kind: str, family: str) -> tuple[Running, str, str, str]:
    """The demo on `family` (the real control plane only): (the run, its output, section 1, what follows it)."""
    if api_kind != "real":
        pytest.skip(f"--ip-family {family} needs the real control plane")
    run = Running("--ip-family", family)
    code = run.finish()
    out = run.text()
    assert code == 0, out
    section1, rest = out.split("1. Per-service selection")[1].split("2. UDPRoute")
    return run, out, section1, rest


@pytest.mark.privileged
@pytest.mark.envoy
@pytest.mark.slow
def test_demo_on_a_dual_stack_mesh_selects_on_each_ipv6_vip_too(api_kind: str) -> None:
    """`--ip-family dual`: the real control plane with both service CIDRs, pods with an IPv6 ULA, dual-stack
    Services: each IPv6 VIP is answered by its own backend from VIP:18082, also after the route's re-point; the
    IPv4 sections as ever."""
    run, out, section1, rest = _run_on(api_kind, "dual")
    section2 = rest.split("3. Weighted split")[0]
    for svc, backend in demo.SERVICES.items():
        six = rf"demo/client +demo/{svc} +(fd00:10:96::77[0-9a-f]{{2}}):18082 +{backend} +\1:18082 +as expected\n"
        assert re.search(six, section1), out
        assert re.search(rf"demo/client +demo/{svc} +(\S+):18082 +{backend} +\1:18082 +as expected\n", section1), out
    assert re.search(r"demo/client +demo/bravo +fd00:\S+ +echo-charlie +fd00:\S+ +as expected", section2), out
    assert "UNEXPECTED" not in out and "result: every VIP reached the backend it should" in out
    _assert_nothing_left(out, run.mark)


@pytest.mark.privileged
@pytest.mark.envoy
@pytest.mark.slow
def test_demo_on_an_ipv6_only_mesh_runs_every_section_over_ipv6(api_kind: str) -> None:
    """`--ip-family ipv6`: the real control plane with the IPv6 service CIDR alone, IPv6-only pods and Services:
    selection and the re-point on IPv6 VIPs, the split, the REDIRECT control, HTTP/3 identity, STRICT inbound."""
    run, out, section1, rest = _run_on(api_kind, "ipv6")
    assert "listener on [::]:18082" in section1, out
    for svc, backend in demo.SERVICES.items():
        six = rf"demo/client +demo/{svc} +(fd00:10:96::77[0-9a-f]{{2}}):18082 +{backend} +\1:18082 +as expected\n"
        assert re.search(six, section1), out
    assert re.search(r"demo/client +demo/bravo +fd00:\S+ +echo-charlie +fd00:\S+ +as expected", rest), out
    assert re.search(r"demo/reporter +\[fd00:\S+\]:8080 directly +no answer +STRICT +as expected", out), out
    for sa in demo.HTTP_CLIENTS.values():
        assert re.search(rf"quic:demo/web@{sa} HTTP/3 +spiffe://cluster.local/ns/demo/sa/{sa} +as expected", out), out
    assert "UNEXPECTED" not in out and "result: every VIP reached the backend it should" in out
    _assert_nothing_left(out, run.mark)


def test_demo_refuses_ipv6_on_the_api_test_bed() -> None:
    argv = [*command(), "demo", "--ip-family", "ipv6", "--control-plane", "emulated"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out
    assert "--ip-family ipv6 needs the real control plane" in out.stderr, out.stderr


@pytest.mark.privileged
@pytest.mark.envoy
@pytest.mark.slow
def test_demo_keep_runs_until_ctrl_c_and_its_instructions_work() -> None:
    run = Running("--keep")
    try:
        line = run.wait_for_line(r"export KUBECONFIG=")
        kubeconfig = line.split("=", 1)[1].strip()
        send = run.wait_for_line(r"ip netns exec .* -c ").strip()
        call = run.wait_for_line(r"ip netns exec .*http\.client").strip()
        run.wait_for_line(r"Press Ctrl-C")
        assert run.proc.poll() is None, "--keep must keep running"
        # the leftover check can see what the demo runs: itself, operator, sidecar, Envoy, four backends
        assert len(_marked(run.mark)) >= 8, _marked(run.mark)
        got = subprocess.run(["bash", "-c", send], capture_output=True, text=True, timeout=60)
        assert "echo-alpha|hello" in got.stdout, got.stdout + got.stderr  # the instruction reaches a backend
        got = subprocess.run(["bash", "-c", call], capture_output=True, text=True, timeout=60)
        assert "URI=spiffe://cluster.local/ns/demo/sa/client" in got.stdout, got.stdout + got.stderr
        if (kubectl := shutil.which("kubectl")) is not None:
            nodes = subprocess.run(
                [kubectl, "--kubeconfig", kubeconfig, "get", "meshnodes"], capture_output=True, text=True
            )
            assert "node-1" in nodes.stdout, nodes.stdout + nodes.stderr
    finally:
        os.killpg(run.proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    assert run.finish() == 0, run.text()
    _assert_nothing_left(run.text(), run.mark)


@pytest.mark.privileged
@pytest.mark.envoy
@pytest.mark.slow
def test_demo_sigterm_while_starting_cleans_up() -> None:
    run = Running()
    try:
        run.wait_for_line(r"pod client-redirect on node-1")  # mid-way: processes, netns and files exist
    finally:
        run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 130, run.text()
    assert "interrupted (SIGTERM)" in run.text()
    _assert_nothing_left(run.text(), run.mark)


@pytest.mark.privileged
@pytest.mark.slow
def test_demo_that_fails_says_why_and_cleans_up() -> None:
    """A real failure mid-way (the 'Envoy' exits at once) after the API, operator, sidecar and netns exist."""
    run = Running(env={"AETHER_ENVOY": "/bin/false"})
    code = run.finish()
    out = run.text()
    assert code == 1, out
    assert "aether demo: failed: RuntimeError: Envoy on node-1 exited" in out
    assert "--- operator.log ---" in out  # the logs are shown before they are removed
    _assert_nothing_left(out, run.mark)


def test_demo_refuses_to_run_without_root(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(demo, "is_root", lambda: False)
    assert demo.main([]) == 1
    err = capsys.readouterr().err
    assert "aether demo: needs root" in err


@pytest.mark.privileged
def test_leftover_check_sees_a_netns_a_process_and_a_directory(tmp_path: Path) -> None:
    """Negative control for `_assert_nothing_left`: each kind of leftover alone makes it fail.
    Seen red: all three `pytest.raises` blocks caught the failure they expect."""
    tag, mark = "ae" + secrets.token_hex(3), secrets.token_hex(8)
    workdir = tmp_path / "aether-demo-x"
    out = f"aether demo: lab tag {tag}, working directory {workdir}\n"
    _assert_nothing_left(out, mark)  # nothing there: passes
    workdir.mkdir()
    with pytest.raises(AssertionError, match="left behind"):
        _assert_nothing_left(out, mark)
    workdir.rmdir()
    subprocess.run(["ip", "netns", "add", f"{tag}-x"], check=True)
    try:
        with pytest.raises(AssertionError, match="netns left behind"):
            _assert_nothing_left(out, mark)
    finally:
        subprocess.run(["ip", "netns", "del", f"{tag}-x"], check=True)
    sleeper = subprocess.Popen(["sleep", "60"], env={**os.environ, "AETHER_DEMO_MARK": mark})
    try:
        # Popen returns once the child has begun exec (vfork), which may be before the kernel has laid out the new
        # environment; /proc/PID/environ reads empty in that window, so wait until the mark is visible.
        wait_for(lambda: sleeper.pid in _marked(mark), 10.0, "the sleeper's mark to be visible", interval=0.05)
        with pytest.raises(AssertionError, match="processes left behind"):
            _assert_nothing_left(out, mark, reap=0.5)
    finally:
        sleeper.kill()
        sleeper.wait()
    _assert_nothing_left(out, mark)


def _ran_ok(*args: str) -> tuple[Running, str]:
    """The demo run to its end with `args`, having exited 0 (else the assertion shows what it printed)."""
    run = Running(*args)
    code, out = run.finish(), run.text()
    assert code == 0, out
    return run, out


@pytest.mark.privileged
@pytest.mark.envoy
@pytest.mark.slow
def test_demo_clusters_2_shows_the_cross_cluster_table_and_leaves_nothing_behind(api_kind: str) -> None:
    """`aether demo --clusters 2` (e2e/demo_clusters.py): B's client-0 calls A's web through A's gateway with its
    own SPIFFE ID, A's policy denies it across, and no pod route joins the clusters; nothing left behind."""
    if api_kind != "real":
        pytest.skip("--clusters 2 runs two real control planes")
    run, out = _ran_ok("--clusters", "2")
    sid = re.escape("spiffe://cluster.local/ns/shop/sa/client")
    via = re.escape("HTTP/3, quic:shop/web@client via UDP 18009")
    assert re.search(
        rf"B shop/client-0 +shop/web in cluster-a \(\S+\) +{via} +web-0 \(200\), XFCC {sid} +as expected", out
    )
    assert re.search(rf"policy in A +{via} +403 \(RBAC in cluster-a\) +as expected", out), out
    assert re.search(r"directly \(cluster-a\) +- \(pod to pod\) +no route \(ENETUNREACH\) +as expected", out), out
    assert re.search(
        rf"SVID \(curl\) +shop/web in cluster-a \(\S+\) +h2 via TCP 18009 +web-0 \(200\), XFCC {sid} +as expected", out
    )
    h2_only = r"shop/api in cluster-a-h2 \(transports: \[h2\]\) +h2 via TCP 18009"  # the source proxy over h2
    assert re.search(rf"B shop/client-0 +{h2_only} +web-0 \(200\), XFCC {sid} +as expected", out), out
    assert "UNEXPECTED" not in out and "result: the caller's own SPIFFE ID crossed the gateway" in out
    m = re.search(r"lab tags (\S+) (\S+)\n.*working directories (\S+) (\S+)\n", out, re.S)
    assert m, out
    left = [p.name for p in NETNS_DIR.iterdir() if p.name.startswith(m.group(1)) or p.name.startswith(m.group(2))]
    assert left == [] and not Path(m.group(3)).exists() and not Path(m.group(4)).exists(), (left, out)
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: not _marked(run.mark), 10, "marked processes to be gone", interval=0.2)
    assert _marked(run.mark) == [], "processes left behind"
