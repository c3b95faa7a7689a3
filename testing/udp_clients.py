"""Real UDP programs as pod apps and clients: dnsmasq and socat backends, dig and dnsperf clients, and the
fresh-socket lookup storm a stub resolver makes (a new source port per query).

The programs are Debian's (`dnsmasq-base`, `dnsutils`, `dnsperf`, `socat`), installed by the README's set-up.
Backends are argv lists for `Lab.spawn` in the backend pod's netns; clients run inside a pod's netns.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import shutil
import socket
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aether.netns.nsthread import run_in_netns
from aether.testing.nodebed import NodeBed, Service

# A TXT answer of ~3 KB: 12 strings of 250 characters (one string holds at most 255)
BIG_TXT_NAME = "big.test"
BIG_TXT = tuple(f"{i:02d}" + chr(ord("a") + i) * 248 for i in range(12))
WHO_NAME = "who.test"


class MissingProgram(RuntimeError):
    pass


def program(name: str) -> str:
    """The path of a Debian program the tests need, or a clear error naming the package."""
    found = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)), None
    )
    if not found:
        package = {"dnsmasq": "dnsmasq-base", "dig": "dnsutils"}.get(name, name)
        raise MissingProgram(f"{name} not found: apt-get install {package} (the README's `make setup` does)")
    return found


# ---- backends --------------------------------------------------------------------------------------------
def dnsmasq_argv(ip: str, port: int, answer_ip: str, workdir: Path, answer_ip6: str | None = None) -> list[str]:
    """An authoritative-only dnsmasq on ip:port (IPv4 or IPv6): `who.test` A -> answer_ip (and AAAA -> answer_ip6
    when given), `big.test` TXT of ~3 KB."""
    txt = ",".join(BIG_TXT)  # no quotes: there is no shell, dnsmasq would keep them
    return [
        program("dnsmasq"),
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--no-resolv",
        "--no-hosts",
        "--no-poll",
        "--bind-interfaces",
        f"--listen-address={ip}",
        f"--port={port}",
        f"--pid-file={workdir / f'dnsmasq-{ip}.pid'}",
        "--user=root",
        # and its group: dnsmasq's default group (dip) changed the process's gid, which clears the parent-death
        # signal the lab sets (prctl(2)), so a dnsmasq outlived a test killed before its cleanup
        "--group=root",
        "--edns-packet-max=4096",
        f"--address=/{WHO_NAME}/{answer_ip}",
        *([f"--address=/{WHO_NAME}/{answer_ip6}"] if answer_ip6 else []),
        f"--txt-record={BIG_TXT_NAME},{txt}",
    ]


def socat_echo_argv(ip: str, port: int) -> list[str]:
    """Every datagram back to its sender, byte for byte (64 KiB buffers: any UDP size). socat forks a child per
    datagram; `-T 0.2` ends each child after 0.2 s idle, so a long run does not pile up thousands of them (and a
    child, which shares the listening socket, has little time to read a datagram meant for the next one)."""
    return [program("socat"), "-T", "0.2", "-b", "65536", f"{_udp_recvfrom(ip, port)},fork", "PIPE"]


def _udp_recvfrom(ip: str, port: int) -> str:
    """socat's listening address for ip:port, IPv4 or IPv6."""
    return f"UDP6-RECVFROM:{port},bind=[{ip}]" if ":" in ip else f"UDP4-RECVFROM:{port},bind={ip}"


def socat_peer_argv(ip: str, port: int) -> list[str]:
    """Answers each datagram with the sender's address as the backend saw it, and a newline."""
    return [program("socat"), "-T", "0.2", f"UDP4-RECVFROM:{port},bind={ip},fork", "SYSTEM:echo $SOCAT_PEERADDR"]


def socat_count_argv(ip: str, port: int) -> list[str]:
    """Answers each datagram with its length in ASCII: a large request and a small reply."""
    return [program("socat"), "-T", "0.2", "-b", "65536", f"{_udp_recvfrom(ip, port)},fork", "SYSTEM:wc -c"]


def add_app_backend(bed: NodeBed, name: str, vip: str, ip: str, port: int, argv: list[str]) -> Service:
    """A backend pod on the bed's node running `argv` (a real program) and a Service `default/<name>` at `vip`
    in front of it; the program's output goes to `<workdir>/<name>.log`."""
    pod = bed.lab.add_pod(bed.node, f"be-{name}", ip)
    log = open(bed.workdir / f"{name}.log", "ab")  # noqa: SIM115 (the child process owns it)
    bed.lab.spawn(pod.netns, argv, stdout=log, stderr=log)
    service = Service(f"default/{name}", vip, pod, port)
    bed.services[name] = service
    return service


def iperf3_server_argv(ip: str, port: int) -> list[str]:
    """An iperf3 server on ip:port (its control connection is TCP on the same port, the test stream UDP)."""
    return [program("iperf3"), "-s", "-B", ip, "-p", str(port)]


@dataclass
class Iperf:
    received_bps: float  # at the receiver: the server, or the client with `reverse`
    lost_percent: float
    packets: int
    error: str = ""


def iperf3(
    netns: str, host: str, port: int, size: int, seconds: float, rate: str = "50M", reverse: bool = False
) -> Iperf:
    """An iperf3 UDP run of `size`-byte datagrams at `rate` (reverse: the server sends, the client receives).
    iperf3 takes whole seconds (`-t 0` would run forever): `seconds` is rounded up to at least 1."""
    whole = max(1, math.ceil(seconds))
    argv = [program("iperf3"), "-c", host, "-p", str(port), "-u", "-l", str(size), "-b", rate, "-t", str(whole)]
    argv += ["--json", "--connect-timeout", "3000", *(["-R"] if reverse else [])]
    try:
        out = subprocess.run(["ip", "netns", "exec", netns, *argv], capture_output=True, text=True, timeout=whole + 30)
    except subprocess.TimeoutExpired:
        return Iperf(0.0, 100.0, 0, f"iperf3 did not finish within {whole + 30} s")
    try:
        doc = json.loads(out.stdout)
    except ValueError:
        return Iperf(0.0, 100.0, 0, out.stderr.strip() or "no output")
    if "error" in doc:
        return Iperf(0.0, 100.0, 0, str(doc["error"]))
    got = doc["end"]["sum_received"]
    return Iperf(float(got["bits_per_second"]), float(got["lost_percent"]), int(got["packets"]))


def exchange(
    netns_path: str, host: str, port: int, payload: bytes, timeout: float = 1.0
) -> tuple[bytes, tuple[str, int]] | None:
    """One datagram from a fresh socket made inside the pod's netns; the reply and where it came from, or None."""

    def make() -> socket.socket:
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(timeout)
        return s

    sock = run_in_netns(netns_path, make)
    try:
        sock.sendto(payload, (host, port))
        data, src = sock.recvfrom(65535)
        return data, src
    except TimeoutError:
        return None
    finally:
        sock.close()


# ---- DNS on the wire (just what the storm needs) --------------------------------------------------------------
def dns_query(qid: int, name: str, qtype: int = 1, edns: int | None = None) -> bytes:
    header = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 1 if edns else 0)
    qname = b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0"
    opt = b"\0" + struct.pack("!HHIH", 41, edns, 0, 0) if edns else b""
    return header + qname + struct.pack("!HH", qtype, 1) + opt


def dns_answer_count(reply: bytes, qid: int) -> int:
    """ANCOUNT of a reply to `qid` with RCODE 0, else -1."""
    if len(reply) < 12:
        return -1
    rid, flags, _, ancount = struct.unpack("!HHHH", reply[:8])
    return ancount if rid == qid and flags & 0x8000 and flags & 0xF == 0 else -1


@dataclass
class Storm:
    sent: int
    answered: int


def fresh_socket_lookups(
    netns_path: str, server: str, port: int, count: int, batch: int = 500, timeout: float = 3.0
) -> Storm:
    """`count` A lookups of who.test, each from a new socket (new source port) made inside the pod's netns,
    `batch` in flight at a time; each socket is closed once answered or timed out. Like a stub resolver."""
    answered = 0
    qid = 0
    for start in range(0, count, batch):
        n = min(batch, count - start)

        def make(n: int = n) -> list[socket.socket]:
            return [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]

        socks = run_in_netns(netns_path, make)
        try:
            ids: dict[int, int] = {}
            for s in socks:
                qid = (qid + 1) & 0xFFFF
                s.setblocking(False)
                s.sendto(dns_query(qid, WHO_NAME), (server, port))
                ids[s.fileno()] = qid
            pending = {s.fileno(): s for s in socks}
            poller = select.poll()
            for fd in pending:
                poller.register(fd, select.POLLIN)
            deadline = timeout * 1000
            while pending and deadline > 0:
                events = poller.poll(min(deadline, 200))
                if not events:
                    deadline -= 200
                    continue
                for fd, _ in events:
                    data = pending[fd].recv(65535)
                    if dns_answer_count(data, ids[fd]) >= 1:
                        answered += 1
                    poller.unregister(fd)
                    del pending[fd]
        finally:
            for s in socks:
                s.close()
    return Storm(count, answered)


# ---- dig, dnsperf -----------------------------------------------------------------------------------------
@dataclass
class Dig:
    status: str
    flags: list[str]
    answers: list[str]
    size: int  # bytes received
    output: str


def dig(netns: str, server: str, port: int, name: str, qtype: str = "A", bufsize: int = 4096) -> Dig:
    """dig over UDP only (+ignore: a truncated answer is not retried over TCP, so TC shows)."""
    argv = [program("dig"), f"@{server}", "-p", str(port), "+time=2", "+tries=1", "+ignore", f"+bufsize={bufsize}"]
    out = subprocess.run(
        ["ip", "netns", "exec", netns, *argv, name, qtype], capture_output=True, text=True, timeout=30
    ).stdout
    status = re.search(r"status: (\w+)", out)
    flags = re.search(r";; flags: ([^;]*);", out)
    size = re.search(r"MSG SIZE\s+rcvd: (\d+)", out)
    section = out.split(";; ANSWER SECTION:\n", 1)
    answers = [ln for ln in section[1].split("\n\n", 1)[0].splitlines() if ln] if len(section) == 2 else []
    return Dig(
        status.group(1) if status else "NO-REPLY",
        flags.group(1).split() if flags else [],
        answers,
        int(size.group(1)) if size else 0,
        out,
    )


def txt_strings(answers: Sequence[str]) -> list[str]:
    return [s for line in answers for s in re.findall(r'"([^"]*)"', line)]


@dataclass
class Dnsperf:
    sent: int
    completed: int
    lost: int
    qps: float
    output: str


def dnsperf(
    netns: str, server: str, port: int, datafile: Path, seconds: float, clients: int = 8, extra: Sequence[str] = ()
) -> Dnsperf:
    """dnsperf for `seconds` with `clients` sockets and 64 queries outstanding (2 s timeout counts as lost)."""
    argv = [program("dnsperf"), "-s", server, "-p", str(port), "-d", str(datafile), "-l", str(seconds)]
    argv += ["-c", str(clients), "-q", "64", "-t", "2", *extra]
    out = subprocess.run(
        ["ip", "netns", "exec", netns, *argv], capture_output=True, text=True, timeout=seconds + 60
    ).stdout

    def num(pattern: str) -> float:
        m = re.search(pattern, out)
        return float(m.group(1)) if m else 0.0

    return Dnsperf(
        int(num(r"Queries sent:\s+(\d+)")),
        int(num(r"Queries completed:\s+(\d+)")),
        int(num(r"Queries lost:\s+(\d+)")),
        num(r"Queries per second:\s+([\d.]+)"),
        out,
    )
