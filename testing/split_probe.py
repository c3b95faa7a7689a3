"""Probes of a weighted UDP split, as the Gateway API conformance suite's weighted-route test makes them: many
fresh sockets (a new source port, so a new udp_proxy session, each), a few in flight at a time, each answered by
the echo backend that names itself (`aether.testing.udp_echo`: `<name>|<payload>`). One socket can also be kept
to check that a session sticks to one backend.
"""

from __future__ import annotations

import itertools
import select
import socket
from collections import Counter
from dataclasses import dataclass

from aether.netns.nsthread import run_in_netns

NO_REPLY = "<no reply>"
# the send failed with EPERM: the datagram was dropped in the pod's own output path (the in-kernel UDP path drops an
# invalid backend's share there; Envoy's path drops it in Envoy, which the client sees as NO_REPLY)
SEND_REFUSED = "<send refused>"
# Source ports for probes, never reused by this process and below the kernel's ephemeral range (32768-60999 here):
# udp_proxy keys a session on the client's address and port, so a fresh socket that got the port of an earlier
# probe or of an earlier test's ordinary socket (whose session is still open in Envoy, idle) would join that
# session and its backend instead of making a new one.
_PORTS = itertools.cycle(range(10_000, 32_768))


def _fresh_socket(v6: bool = False) -> socket.socket:
    s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(1000):
        try:
            s.bind(("::" if v6 else "0.0.0.0", next(_PORTS)))
            return s
        except OSError:
            continue
    s.close()
    raise OSError("no free probe source port")


@dataclass(frozen=True)
class Split:
    probes: int
    by_backend: Counter[str]  # backend name (or NO_REPLY) -> probes it answered

    def share(self, backend: str) -> float:
        """Percent of the probes `backend` answered (NO_REPLY for the unanswered ones)."""
        return 100.0 * self.by_backend.get(backend, 0) / self.probes if self.probes else 0.0

    def table(self) -> str:
        rows = [f"{'backend':<16} {'sessions':>8} {'share':>7}"]
        for name, n in sorted(self.by_backend.items(), key=lambda kv: (-kv[1], kv[0])):
            rows.append(f"{name:<16} {n:>8} {100.0 * n / self.probes:>6.1f}%")
        return "\n".join(rows)


def _backend(reply: bytes) -> str:
    name, sep, _ = reply.partition(b"|")
    return name.decode(errors="replace") if sep else f"<bad reply {reply[:16]!r}>"


def probe_split(netns_path: str, host: str, port: int, probes: int, in_flight: int = 10, timeout: float = 1.0) -> Split:
    """`probes` datagrams to host:port (an IPv4 or IPv6 address), each from a fresh socket made in the pod's netns on a source port no
    earlier probe used (a new session each), `in_flight` at a time; a probe unanswered within `timeout` counts as
    NO_REPLY, one whose send failed with EPERM as SEND_REFUSED."""
    counts: Counter[str] = Counter()
    done = 0
    while done < probes:
        n = min(in_flight, probes - done)

        def make(n: int = n) -> list[socket.socket]:
            return [_fresh_socket(":" in host) for _ in range(n)]

        socks = run_in_netns(netns_path, make)
        try:
            pending = {s.fileno(): s for s in socks}
            poller = select.poll()
            for i, s in enumerate(socks):
                s.setblocking(False)
                try:
                    s.sendto(f"probe-{done + i}".encode(), (host, port))
                except PermissionError:
                    counts[SEND_REFUSED] += 1
                    del pending[s.fileno()]
                    continue
                poller.register(s.fileno(), select.POLLIN)
            left_ms = timeout * 1000
            while pending and left_ms > 0:
                events = poller.poll(min(left_ms, 100))
                if not events:
                    left_ms -= 100
                    continue
                for fd, _ in events:
                    counts[_backend(pending[fd].recv(65535))] += 1
                    poller.unregister(fd)
                    del pending[fd]
            counts[NO_REPLY] += len(pending)
        finally:
            for s in socks:
                s.close()
        done += n
    if not counts[NO_REPLY]:
        del counts[NO_REPLY]
    return Split(probes, counts)


def sticky_backends(sock: socket.socket, host: str, port: int, datagrams: int, timeout: float = 1.0) -> Counter[str]:
    """The backends that answered `datagrams` datagrams sent from one socket (one session): one name if sticky."""
    seen: Counter[str] = Counter()
    sock.settimeout(timeout)
    for i in range(datagrams):
        try:
            sock.sendto(f"sticky-{i}".encode(), (host, port))
        except PermissionError:
            seen[SEND_REFUSED] += 1
            continue
        try:
            seen[_backend(sock.recvfrom(65535)[0])] += 1
        except TimeoutError:
            seen[NO_REPLY] += 1
    return seen


def locality_weights(config_dump: dict[str, object], cluster: str) -> dict[str, int]:
    """From Envoy's `/config_dump?include_eds`: the backend (locality sub_zone) -> load_balancing_weight of a split
    cluster's load assignment (0: no weight, a drained backend); the all-drained drop locality is left out."""
    out: dict[str, int] = {}
    configs = config_dump.get("configs")
    for cfg in configs if isinstance(configs, list) else []:
        for ep in cfg.get("dynamic_endpoint_configs", []) if isinstance(cfg, dict) else []:
            cla = ep.get("endpoint_config", {})
            if cla.get("cluster_name") != cluster:
                continue
            for loc in cla.get("endpoints", []):
                name = loc.get("locality", {}).get("sub_zone", "")
                if name != "aether/no-weighted-backend":
                    out[name] = int(loc.get("load_balancing_weight", 0))
    return out
