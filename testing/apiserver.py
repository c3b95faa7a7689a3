"""Which API server a test, the demo or `aether dev-api` runs against: the real control plane (the default for
tests: `aether.testing.controlplane`, built by `make k8s`) or the API test bed (`aether.testing.apitestbed`, the
emulator, kept where the emulator itself is the point and as the zero-build default of the demo).

    with api_server("real") as server:   # -> Server: .kubeconfig, .bed (TestBed | None), .control_plane
        ...

`AETHER_CONTROL_PLANE=real|emulated` picks the tests' default (`real`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from aether.testing import controlplane
from aether.testing.apitestbed import TestBed
from aether.testing.apitestbed import start as start_bed
from aether.testing.apitestbed.faults import Faults
from aether.testing.controlplane.families import IpFamily
from aether.testing.controlplane.faultproxy import FaultProxy

Kind = Literal["real", "emulated"]
KINDS: tuple[Kind, ...] = ("real", "emulated")


def default_kind() -> Kind:
    value = os.environ.get("AETHER_CONTROL_PLANE", "real")
    if value not in KINDS:
        raise ValueError(f"AETHER_CONTROL_PLANE={value!r}: expected one of {', '.join(KINDS)}")
    return "real" if value == "real" else "emulated"


@dataclass(frozen=True)
class Server:
    kubeconfig: str
    bed: TestBed | None = None
    control_plane: controlplane.ControlPlane | None = None
    proxy: FaultProxy | None = None  # real, with faults: `kubeconfig` goes through it

    @property
    def faults(self) -> Faults | None:
        return self.bed if self.bed is not None else self.proxy

    @property
    def version(self) -> str:
        """What answers: `kube-apiserver v1.35.4`, or the API test bed."""
        if self.control_plane is not None:
            return f"kube-apiserver {self.control_plane.version}"
        return "the API test bed (kmock + aether's emulator layer)"


@contextlib.contextmanager
def api_server(
    kind: Kind,
    *,
    kubeconfig: Path | None = None,
    channel: str | None = None,
    crds: bool = True,
    port: int = 0,
    audit: Path | None = None,
    faults: bool = False,
    ip_family: IpFamily = "ipv4",
) -> Iterator[Server]:
    """Start one; stop it (and remove what it made) on exit. A real control plane that is not built raises
    controlplane.ControlPlaneMissing, never falls back to the emulator. `faults`: on the real one, the kubeconfig
    goes through a FaultProxy (the emulator injects faults itself). `ip_family` (ipv4, ipv6, dual): the real one's
    service CIDRs (controlplane.families); the emulator allocates no ClusterIP, so only ipv4 is served by it."""
    if kind == "real":
        cp = controlplane.start(crds=crds, channel=channel or "experimental", ip_family=ip_family)
        proxy: FaultProxy | None = None
        try:
            proxy = FaultProxy(cp) if faults else None
            source = proxy.kubeconfig_path if proxy is not None else cp.kubeconfig_path
            path = str(source)
            if kubeconfig is not None:
                kubeconfig.write_text(source.read_text())
                path = str(kubeconfig)
            yield Server(path, control_plane=cp, proxy=proxy)
        finally:
            if proxy is not None:
                proxy.stop()
            cp.stop()
        return
    if ip_family != "ipv4":
        raise ValueError(
            f"ip_family {ip_family!r}: the API test bed allocates no ClusterIP; use the real control plane"
        )
    bed = start_bed(port, kubeconfig, audit, crds=crds, channel=channel)
    try:
        yield Server(str(bed.kubeconfig_path), bed=bed)
    finally:
        bed.stop()
