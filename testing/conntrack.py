"""A netns's conntrack table as tests read it: `/proc/net/nf_conntrack` inside the netns (one line per entry; read
with `ip netns exec`, since /proc/net is the reading process's netns). Parsing 100,000 entries takes well under a
second this way, where a ctnetlink dump through pyroute2 took about 35 s."""

from __future__ import annotations

from dataclasses import dataclass

from aether.testing.netlab import sh


@dataclass(frozen=True)
class CtEntry:
    """One UDP or TCP conntrack entry: the original direction's tuple, the reply direction's, the seconds left."""

    proto: str
    timeout: int
    src: str
    dst: str
    sport: int
    dport: int
    reply_src: str
    reply_dst: str
    reply_sport: int
    reply_dport: int
    replied: bool  # False: [UNREPLIED], nothing came back yet


def entries(netns: str, proto: str = "udp") -> list[CtEntry]:
    """The netns's conntrack entries of `proto` (udp or tcp)."""
    out = []
    for line in sh("cat", "/proc/net/nf_conntrack", netns=netns).splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[2] != proto:
            continue
        kv = [f.split("=", 1)[1] for f in fields if f.startswith(("src=", "dst=", "sport=", "dport="))]
        if len(kv) < 8:
            continue
        src, dst, sport, dport, r_src, r_dst, r_sport, r_dport = kv[:8]
        out.append(
            CtEntry(
                proto,
                int(fields[4]),
                src,
                dst,
                int(sport),
                int(dport),
                r_src,
                r_dst,
                int(r_sport),
                int(r_dport),
                "[UNREPLIED]" not in fields,
            )
        )
    return out
