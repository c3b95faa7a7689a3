"""Which IP families a control plane's Services get: the service CIDRs kube-apiserver allocates ClusterIPs from.

    service_cidrs("dual")  # -> ("10.96.0.0/12", "fd00:10:96::/108")

`--service-cluster-ip-range` takes one CIDR per family, at most two; the first is the cluster's primary family (a
Service with `ipFamilyPolicy: SingleStack` and no `ipFamilies` gets it, and the `kubernetes` Service's ClusterIP is
its first address). IPv6 ranges must be /108 or longer. The IPv6 range is a ULA (RFC 4193) prefix, never routed."""

from __future__ import annotations

import ipaddress
from typing import Literal, get_args

IpFamily = Literal["ipv4", "ipv6", "dual"]
IP_FAMILIES: tuple[IpFamily, ...] = get_args(IpFamily)
SERVICE_CIDR_V4 = "10.96.0.0/12"  # covers the 10.96.x.y VIPs tests and the demo ask for
SERVICE_CIDR_V6 = "fd00:10:96::/108"  # covers fd00:10:96::x VIPs


def check(family: str) -> IpFamily:
    for known in IP_FAMILIES:
        if family == known:
            return known
    raise ValueError(f"unknown IP family {family!r} (known: {', '.join(IP_FAMILIES)})")


def service_cidrs(family: IpFamily) -> tuple[str, ...]:
    """The service CIDRs of a control plane of `family`, the primary first (IPv4 first in a dual-stack one)."""
    return {"ipv4": (SERVICE_CIDR_V4,), "ipv6": (SERVICE_CIDR_V6,), "dual": (SERVICE_CIDR_V4, SERVICE_CIDR_V6)}[
        check(family)
    ]


def kubernetes_vips(family: IpFamily) -> tuple[str, ...]:
    """The first address of each service CIDR: the `kubernetes` Service's ClusterIPs, which the API server's serving
    certificate names."""
    return tuple(str(ipaddress.ip_network(c)[1]) for c in service_cidrs(family))
