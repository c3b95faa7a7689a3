"""A recording stand-in for the kernel UDP path's effects (`aether.netns.kernel_udp_install.KernelUdpEffects`): it
keeps one netns's table `ip aether_udp` (as the objects of the last transaction that loaded) and its UDP flows in
memory, records every call in order, and refuses an nft transaction where a test says. It checks no nft syntax:
the privileged tests do that against the kernel."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aether.netns.libnft import NftResult

Flow = tuple[str, int, str, int]  # (vip, vip port, backend ip, backend port)


@dataclass
class RecordingKernelUdp:
    table: list[dict[str, Any]] | None = None
    flows: list[Flow] = field(default_factory=list)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    refuse: bool = False
    closed: bool = False

    def nft(self, command: dict[str, Any]) -> NftResult:
        items = command["nftables"]
        if "list" in items[0]:
            self.calls.append(("nft", "list"))
            if self.table is None:
                return NftResult(1, "", "Error: No such file or directory\n")
            return NftResult(0, json.dumps({"nftables": self.table}), "")
        op = "delete" if len(items) == 2 else "replace"
        self.calls.append(("nft", op))
        if self.refuse:
            return NftResult(1, "", "Error: Could not process rule: Operation not supported\n")
        self.table = None if op == "delete" else [dict(i["add"]) for i in items[2:]]
        return NftResult(0, "", "")

    def forget_flows(self, vip: str, vip_port: int, backend_ip: str, backend_port: int) -> int:
        self.calls.append(("forget_flows", vip, backend_ip, backend_port))
        gone = [f for f in self.flows if f == (vip, vip_port, backend_ip, backend_port)]
        self.flows = [f for f in self.flows if f not in gone]
        return len(gone)

    def close(self) -> None:
        self.calls.append(("close",))
        self.closed = True
