"""The capture contract: port roles, fwmarks and the routing table, one table pinned by tests.

One number per role for both transports (R3): a second number would be a second capture rule, a second
Service port and a second capture path.
"""

from __future__ import annotations

TYPE_CHECKING = False  # on the CNI plugin's start-up path: see aether.netns.lite
if TYPE_CHECKING:
    from enum import StrEnum as StrChoice
    from typing import Final
    from typing import NamedTuple as Record
else:
    from aether.netns.lite import Record, StrChoice


class Transport(StrChoice):
    TCP = "tcp"
    UDP = "udp"


class CaptureMode(StrChoice):
    """`tproxy` is mark-and-divert (the only mode deployed); `redirect` is the negative control (R6)."""

    TPROXY = "tproxy"
    REDIRECT = "redirect"


class InboundMode(StrChoice):
    """What may reach a meshed pod. `strict` (the default): new inbound TCP connections and UDP flows only on the
    mesh's inbound port (18008) or from the mesh's proxies (loopback, and the sources the node proxies deliver
    from); everything else dropped and counted. `permissive`: anything, as before (for migration)."""

    STRICT = "strict"
    PERMISSIVE = "permissive"


class InboundPolicy(Record):
    """The inbound enforcement of one pod: its mode and the source prefixes (`a.b.c.d[/len]`, IPv6 too) the node
    proxies deliver from: the pod's gateway on its own node, the nodes' addresses across nodes."""

    mode: InboundMode
    mesh_sources: tuple[str, ...] = ()


# The pod annotation that picks the inbound mode, read by the CNI plugin from the runtime's pod annotations
# (containerd passes them in runtimeConfig when the conflist entry declares the capability below).
INBOUND_ANNOTATION: Final = "mesh.aether.dev/inbound"
POD_ANNOTATIONS_CAPABILITY: Final = "io.kubernetes.cri.pod-annotations"


class PortRole(Record):
    name: str
    number: int
    transports: frozenset[Transport]
    meaning: dict[Transport, str]


L4_OUTBOUND_PORT: Final = 18082
INBOUND_PORT: Final = 18008
EAST_WEST_PORT: Final = 18009
HTTP_OUTBOUND_PORT: Final = 18080

PORT_ROLES: Final[tuple[PortRole, ...]] = (
    PortRole(
        "L4_OUTBOUND_PORT",
        L4_OUTBOUND_PORT,
        frozenset({Transport.TCP, Transport.UDP}),
        {
            Transport.TCP: "raw TCP, per service by destination IP",
            Transport.UDP: "plaintext UDP, per service by destination IP",
        },
    ),
    PortRole(
        "INBOUND_PORT",
        INBOUND_PORT,
        frozenset({Transport.TCP, Transport.UDP}),
        {Transport.TCP: "mTLS HTTP/2", Transport.UDP: "QUIC, mTLS"},
    ),
    PortRole(
        "EAST_WEST_PORT",
        EAST_WEST_PORT,
        frozenset({Transport.TCP, Transport.UDP}),
        {Transport.TCP: "mTLS SNI tunnel", Transport.UDP: "QUIC SNI passthrough"},
    ),
    PortRole(
        "HTTP_OUTBOUND_PORT",
        HTTP_OUTBOUND_PORT,
        frozenset({Transport.TCP}),
        {Transport.TCP: "HTTP from pods, routed by Host to h2/h3 mTLS"},
    ),
)

# Ports the capture diverts in the pod netns, per transport. Inbound (18008) is not diverted: it arrives
# on the pod's interface addressed to the pod IP and is bound directly there.
CAPTURED_PORTS: Final[dict[Transport, tuple[int, ...]]] = {
    Transport.UDP: (L4_OUTBOUND_PORT,),
    Transport.TCP: (L4_OUTBOUND_PORT, HTTP_OUTBOUND_PORT),
}

CAPTURE_DIVERT_FWMARK: Final = 0xAE71
CAPTURE_PASSTHROUGH_FWMARK: Final = 0xAE7E
# set by the in-kernel UDP path's table on datagrams to its VIPs before the capture's divert, which skips them
# (aether.netns.kernel_udp): a filter-chain mark, so setting it re-routes nothing
KERNEL_UDP_FWMARK: Final = 0xAE82
CAPTURE_ROUTE_TABLE: Final = 0xAE71  # 44657: the policy-routing table holding `local default dev lo`
CAPTURE_RULE_PRIORITY: Final = 100
NFT_TABLE_NAME: Final = "aether"
NFT_TABLE_FAMILY: Final = "inet"


def role_for(port: int) -> PortRole:
    for role in PORT_ROLES:
        if role.number == port:
            return role
    raise KeyError(f"port {port} has no role in the capture contract")
