"""The container runtime's part of pod networking: call the real `aether-cni` executable the way a runtime does
(CNI 1.0.0: environment + network configuration on stdin, chained after a primary plugin whose result is
`prevResult`). The primary plugin here is the netns Lab, which already made eth0 and its address."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aether.netns import node_guard
from aether.netns.contract import POD_ANNOTATIONS_CAPABILITY
from aether.testing.netlab import GATEWAY_LL

CNI_VERSION = "1.0.0"
NODE_LINKS = "10.250.0.0/16"
NODE_ADDRESSES6 = "fd00:10:250::/64"  # a dual-stack mesh's node IPv6 addresses (e2e/addresses.py)


class CniFailed(RuntimeError):
    pass


def plugin_path() -> str:
    """`aether-cni` beside the running interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / "aether-cni"
    if beside.is_file():
        return str(beside)
    found = shutil.which("aether-cni")
    if found is None:
        raise CniFailed("the aether-cni executable was not found (pip install -e . puts it beside python)")
    return found


@dataclass(frozen=True)
class PodSandbox:
    namespace: str
    name: str
    uid: str
    netns_path: str
    ip: str
    container_id: str
    # the pod's annotations, passed the way containerd does for an entry declaring the capability (runtimeConfig)
    annotations: tuple[tuple[str, str], ...] = ()
    ip6: str | None = None  # a dual-stack pod's IPv6 address (prevResult lists it; no gateway: see _config)


def _config(sandbox: PodSandbox) -> dict[str, Any]:
    prev = {
        "cniVersion": CNI_VERSION,
        "interfaces": [{"name": "eth0", "sandbox": sandbox.netns_path}],
        # the Lab's pods route via GATEWAY_LL on every node: the pod's own node proxy reaches it from there
        "ips": [{"address": f"{sandbox.ip}/32", "gateway": GATEWAY_LL, "interface": 0}],
    }
    sources = [NODE_LINKS]
    if ":" in sandbox.ip:  # an IPv6-only pod: its one address, no IPv4 gateway
        prev["ips"] = [{"address": f"{sandbox.ip}/128", "interface": 0}]
        sources.append(NODE_ADDRESSES6)
    elif sandbox.ip6:  # its node proxy reaches it from the node's ULA (NODE_ADDRESSES6), never from a link-local one
        prev["ips"] = [*prev["ips"], {"address": f"{sandbox.ip6}/128", "interface": 0}]
        sources.append(NODE_ADDRESSES6)
    # meshSources: the harness links nodes on 10.250.<n>.0/30 (e2e/harness.py), and a node proxy delivers plaintext
    # UDP/TCP services to another node's pods from its own address there; STRICT inbound drops anything else
    return {
        "cniVersion": CNI_VERSION,
        "name": "aether-e2e",
        "type": "aether-cni",
        "meshSources": sources,
        "capabilities": {POD_ANNOTATIONS_CAPABILITY: True},
        "runtimeConfig": {POD_ANNOTATIONS_CAPABILITY: dict(sandbox.annotations)},
        "prevResult": prev,
    }


def guard_node(node_netns: str) -> None:
    """The node's mesh-source guard for this runtime's mesh sources (the pods' gateway and the node links), in the
    node's netns, as `aether node-guard install` on a node: no pod there poses as a mesh source."""
    node_guard.install((GATEWAY_LL, NODE_LINKS), node_netns)


def _env(command: str, sandbox: PodSandbox, state_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": sandbox.container_id,
        "CNI_NETNS": sandbox.netns_path,
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": (
            f"IgnoreUnknown=1;K8S_POD_NAMESPACE={sandbox.namespace};K8S_POD_NAME={sandbox.name};"
            f"K8S_POD_INFRA_CONTAINER_ID={sandbox.container_id};K8S_POD_UID={sandbox.uid}"
        ),
        "CNI_PATH": str(Path(plugin_path()).parent),
        "AETHER_STATE_DIR": str(state_dir),
    }


def invoke(command: str, sandbox: PodSandbox, state_dir: Path) -> dict[str, Any] | None:
    """Run the plugin once; return its JSON result (ADD), None (DEL/CHECK); raise CniFailed on an error."""
    proc = subprocess.run(
        [plugin_path()],
        input=json.dumps(_config(sandbox)).encode(),
        env=_env(command, sandbox, state_dir),
        capture_output=True,
        timeout=60,
    )
    out = proc.stdout.decode().strip()
    if proc.returncode != 0:
        raise CniFailed(f"aether-cni {command} for {sandbox.namespace}/{sandbox.name} failed: {out or proc.stderr!r}")
    if not out:
        return None
    result: dict[str, Any] = json.loads(out)
    return result


def add(sandbox: PodSandbox, state_dir: Path) -> dict[str, Any]:
    result = invoke("ADD", sandbox, state_dir)
    if result is None:
        raise CniFailed("aether-cni ADD printed no result")
    return result


def delete(sandbox: PodSandbox, state_dir: Path) -> None:
    invoke("DEL", sandbox, state_dir)
