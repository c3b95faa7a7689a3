"""The e2e harness's addresses: pods', nodes' and Services' IPs per IP family of the mesh, in ranges that exist
nowhere on this machine. A dual-stack mesh gives every pod an IPv6 ULA (RFC 4193) beside its IPv4 address and
every UDP Service an IPv6 ClusterIP beside its IPv4 one (in the IPv6 service CIDR of controlplane.families); an
IPv6-only mesh gives pods and Services the IPv6 address alone. Nodes of both get a ULA on lo and on each link."""

from __future__ import annotations

from aether.testing.controlplane.families import IpFamily
from aether.testing.netlab import Pod, sh

VIP_PREFIX = "10.96.77."  # ClusterIPs
VIP_PREFIX6 = "fd00:10:96::77"  # + two hex digits: a dual-stack mesh's IPv6 ClusterIPs (inside the /108)
POD_PREFIX6 = "fd00:10:200:"  # + "<node>::<pod>": a dual-stack mesh's pod IPv6 addresses
NODE_PREFIX6 = "fd00:10:250::"  # + "<node>": a dual-stack mesh's node addresses (in cni_runtime.NODE_ADDRESSES6)
HARNESS_FAMILIES: tuple[IpFamily, ...] = ("ipv4", "dual", "ipv6")  # what the harness builds


def check_family(family: IpFamily) -> IpFamily:
    if family not in HARNESS_FAMILIES:
        raise ValueError(f"ip_family {family!r}: the e2e harness builds {' and '.join(HARNESS_FAMILIES)} meshes")
    return family


def pod_ips(pod: Pod) -> tuple[str, ...]:
    """A lab pod's addresses as the API knows them (its podIPs): IPv4, and IPv6 when the lab gave it one."""
    return (pod.ip, pod.ip6) if pod.ip6 and pod.ip6 != pod.ip else (pod.ip,)  # an IPv6-only pod: ip == ip6


def echo_flags(pod: Pod) -> tuple[str, ...]:
    """The UDP echo app's flags for the pod: a dual-stack pod's answers both families (it binds [::])."""
    return ("--dual-stack",) if pod.ip6 else ()


def give_node_address6(family: IpFamily, netns: str, node: int) -> None:
    """A dual-stack node's own IPv6 address (a /128 on its lo): what its node proxy sends to pods from. Without a
    global address the node's only IPv6 source is link-local (fe80::1), and a pod answers a link-local source from
    its own link-local address (RFC 6724 source selection), which the proxy's socket, connected to the pod's ULA,
    never takes for the reply."""
    if family != "ipv4":
        sh("ip", "-6", "addr", "add", f"{NODE_PREFIX6}{node:x}/128", "dev", "lo", netns=netns)


def pod_addresses(family: IpFamily, node: int, pod: int) -> tuple[str, str | None]:
    """(IPv4, IPv6 or None) of pod number `pod` on node number `node` (both from 1); an IPv6-only mesh's pod:
    (its IPv6 address, None), which the lab makes an IPv6-only pod."""
    ip6 = f"{POD_PREFIX6}{node}::{pod:x}"
    if family == "ipv6":
        return ip6, None
    return f"10.200.{node}.{pod}", ip6 if family == "dual" else None


def node_link6(family: IpFamily, link: int) -> tuple[str | None, str | None]:
    """The IPv6 addresses of node link number `link` (from 1) on each end, inside NODE_PREFIX6's /64 (a pod's
    meshSources), or (None, None) on an IPv4 mesh. Without them a node has no IPv6 route to another node's pods."""
    if family == "ipv4":
        return None, None
    return f"{NODE_PREFIX6}{link:x}:1", f"{NODE_PREFIX6}{link:x}:2"


def service_vips(family: IpFamily, n: int) -> tuple[str, str | None]:
    """(IPv4 VIP, IPv6 VIP or None) of the n-th Service; an IPv6-only mesh's: (its IPv6 VIP, None)."""
    if family == "ipv6":
        return f"{VIP_PREFIX6}{n:02x}", None
    return f"{VIP_PREFIX}{n}", f"{VIP_PREFIX6}{n:02x}" if family == "dual" else None
