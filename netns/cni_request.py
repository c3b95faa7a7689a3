"""The pure half of the CNI plugin: environment + stdin -> a typed request, or a CNI error. No effects here.

CNI spec 1.0.0 (containernetworking/cni SPEC.md): the runtime passes CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS,
CNI_IFNAME, CNI_ARGS and CNI_PATH in the environment and the network configuration as JSON on stdin; a chained
plugin gets the previous plugin's result as `prevResult`. Errors are `{"cniVersion", "code", "msg", "details"}`
on stdout with a non-zero exit; codes 1-99 are the spec's, 100+ are this plugin's.
"""

from __future__ import annotations

from aether.netns import litejson as json
from aether.netns.contract import INBOUND_ANNOTATION, POD_ANNOTATIONS_CAPABILITY, InboundMode, InboundPolicy

TYPE_CHECKING = False  # on the CNI plugin's start-up path: see aether.netns.lite
if TYPE_CHECKING:
    from collections.abc import Mapping
    from enum import StrEnum as StrChoice
    from typing import Any, Final
    from typing import NamedTuple as Record
else:
    from aether.netns.lite import Record, StrChoice

SPEC_VERSION: Final = "1.0.0"
# We echo prevResult and read only `ips[].address`, which every version since 0.3.0 has; 0.3.x is what kindnet and
# stock Calico conflists still say. CHECK exists since 0.4.0 (refused for 0.3.x).
SUPPORTED_VERSIONS: Final = ("0.3.0", "0.3.1", "0.4.0", "1.0.0")
CHECK_SINCE: Final = ("0.4.0", "1.0.0")

# The spec's error codes.
ERR_INCOMPATIBLE_VERSION: Final = 1
ERR_UNSUPPORTED_FIELD: Final = 2
ERR_UNKNOWN_CONTAINER: Final = 3
ERR_INVALID_ENV: Final = 4
ERR_IO: Final = 5
ERR_DECODE: Final = 6
ERR_INVALID_CONFIG: Final = 7
ERR_TRY_AGAIN: Final = 11
# This plugin's.
ERR_CAPTURE_INSTALL: Final = 100
ERR_CAPTURE_DRIFT: Final = 101
ERR_RECORD: Final = 102


class Command(StrChoice):
    ADD = "ADD"
    DEL = "DEL"
    CHECK = "CHECK"
    VERSION = "VERSION"


class CniError(Exception):
    def __init__(self, code: int, msg: str, details: str = "", cni_version: str = SPEC_VERSION) -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details
        self.cni_version = cni_version

    def to_json(self) -> dict[str, Any]:
        return {"cniVersion": self.cni_version, "code": self.code, "msg": self.msg, "details": self.details}


class PodIdentity(Record):
    namespace: str
    name: str
    uid: str


class CniRequest(Record):
    command: Command
    cni_version: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    config: Mapping[str, Any] | None = None
    prev_result: dict[str, Any] | None = None
    cni_args: Mapping[str, str] | None = None
    pod: PodIdentity | None = None

    def inbound_policy(self) -> InboundPolicy:
        """The pod's inbound enforcement: the pod annotation `mesh.aether.dev/inbound` (from the runtime's pod
        annotations in `runtimeConfig`, which containerd fills when the conflist entry declares the
        `io.kubernetes.cri.pod-annotations` capability), else the entry's `inbound` (node-wide), else `strict`.
        Mesh sources: the entry's `meshSources` (the nodes' addresses: remote node proxies deliver plaintext UDP/TCP
        services from them) and the pod's gateways from prevResult (its own node proxy's source), except an IPv6
        link-local one (fe80::/10: the node sends to a pod's global IPv6 address from a global address of its own,
        so such a gateway is no proxy's source, and admitting it would admit anything the node sends from the
        pod's veth). Raises CniError(7)
        on a value it does not know: a typo must not silently open or close a pod."""
        config = self.config or {}
        runtime = config.get("runtimeConfig")
        annotations = runtime.get(POD_ANNOTATIONS_CAPABILITY) if isinstance(runtime, dict) else None
        raw = annotations.get(INBOUND_ANNOTATION) if isinstance(annotations, dict) else None
        where = f"pod annotation {INBOUND_ANNOTATION}"
        if raw is None:
            raw, where = config.get("inbound", InboundMode.STRICT.value), "the aether-cni entry's 'inbound'"
        try:
            mode = InboundMode(str(raw).lower())
        except ValueError:
            raise CniError(
                ERR_INVALID_CONFIG,
                f"{where} is {raw!r}",
                f"expected one of {', '.join(m.value for m in InboundMode)}",
                self.cni_version,
            ) from None
        sources = config.get("meshSources", [])
        if not isinstance(sources, list) or not all(isinstance(x, str) for x in sources):
            raise CniError(
                ERR_INVALID_CONFIG,
                "the aether-cni entry's 'meshSources' must be a list of strings",
                "",
                self.cni_version,
            )
        out = list(sources)
        for entry in (self.prev_result or {}).get("ips") or []:
            gateway = entry.get("gateway") if isinstance(entry, dict) else None
            if isinstance(gateway, str) and gateway and gateway not in out and not _ipv6_link_local(gateway):
                out.append(gateway)
        return InboundPolicy(mode, tuple(out))

    def pod_ips(self) -> list[str]:
        """Addresses from prevResult (`ips[].address`, prefix length dropped), in order, without duplicates."""
        out: list[str] = []
        for entry in (self.prev_result or {}).get("ips") or []:
            if isinstance(entry, dict) and isinstance(entry.get("address"), str):
                ip = entry["address"].split("/", 1)[0]
                if ip and ip not in out:
                    out.append(ip)
        return out


def _ipv6_link_local(address: str) -> bool:
    """fe80::/10 (fe80:: to febf::), without `ipaddress` (it imports functools: see aether.netns.lite)."""
    head = address.split(":", 1)[0].lower()
    return ":" in address and len(head) == 4 and head[:2] == "fe" and head[2] in "89ab"


def parse_cni_args(raw: str) -> dict[str, str]:
    """`K=V;K=V` (CNI_ARGS). Raises CniError(4) on an item without `=`."""
    out: dict[str, str] = {}
    for item in raw.split(";"):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CniError(ERR_INVALID_ENV, f"CNI_ARGS item {item!r} is not KEY=VALUE", f"CNI_ARGS={raw!r}")
        out[key.strip()] = value.strip()
    return out


def _decode_config(stdin: bytes) -> dict[str, Any]:
    try:
        config = json.loads(stdin.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError and json.JSONDecodeError
        raise CniError(ERR_DECODE, "the network configuration on stdin is not valid JSON", str(exc)) from exc
    if not isinstance(config, dict):
        raise CniError(
            ERR_DECODE, "the network configuration on stdin must be a JSON object", f"got {type(config).__name__}"
        )
    return config


def _version_of(config: Mapping[str, Any]) -> str:
    version = config.get("cniVersion")
    if not isinstance(version, str) or not version:
        raise CniError(ERR_INVALID_CONFIG, "the network configuration has no cniVersion", json.dumps(config)[:200])
    if version not in SUPPORTED_VERSIONS:
        raise CniError(
            ERR_INCOMPATIBLE_VERSION,
            f"cniVersion {version} is not supported by aether-cni",
            f"supported: {', '.join(SUPPORTED_VERSIONS)}",
        )
    return version


def _env(env: Mapping[str, str], name: str, command: Command, version: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise CniError(
            ERR_INVALID_ENV, f"{name} is required for {command.value}", f"{name} is missing or empty", version
        )
    return value


def parse_request(env: Mapping[str, str], stdin: bytes) -> CniRequest:
    """Validate everything that can be validated without touching the system. Raises CniError."""
    raw_command = env.get("CNI_COMMAND", "").strip()
    if not raw_command:
        raise CniError(ERR_INVALID_ENV, "CNI_COMMAND is required", "expected one of ADD, DEL, CHECK, VERSION")
    try:
        command = Command(raw_command)
    except ValueError:
        raise CniError(
            ERR_INVALID_ENV, f"unknown CNI_COMMAND {raw_command!r}", "expected one of ADD, DEL, CHECK, VERSION"
        ) from None
    if command is Command.VERSION:
        # stdin holds only {"cniVersion": ...}; an unreadable one does not stop us from saying what we support
        return CniRequest(command=command, cni_version=SPEC_VERSION)
    config = _decode_config(stdin)
    version = _version_of(config)
    if command is Command.CHECK and version not in CHECK_SINCE:
        raise CniError(
            ERR_INCOMPATIBLE_VERSION,
            f"CHECK is not defined for cniVersion {version}",
            f"CHECK exists since cniVersion 0.4.0; supported for CHECK: {', '.join(CHECK_SINCE)}",
            version,
        )
    for key in ("name", "type"):
        if not isinstance(config.get(key), str) or not config[key]:
            raise CniError(ERR_INVALID_CONFIG, f"the network configuration has no {key!r}", "", version)
    container_id = _env(env, "CNI_CONTAINERID", command, version)
    ifname = _env(env, "CNI_IFNAME", command, version)
    netns = env.get("CNI_NETNS", "").strip()
    if command is not Command.DEL and not netns:
        raise CniError(
            ERR_INVALID_ENV, f"CNI_NETNS is required for {command.value}", "CNI_NETNS is missing or empty", version
        )
    try:
        cni_args = parse_cni_args(env.get("CNI_ARGS", ""))
    except CniError as exc:
        exc.cni_version = version
        raise
    prev = config.get("prevResult")
    if prev is not None and not isinstance(prev, dict):
        raise CniError(ERR_INVALID_CONFIG, "prevResult must be a JSON object", f"got {type(prev).__name__}", version)
    if command is not Command.DEL and prev is None:
        raise CniError(
            ERR_INVALID_CONFIG,
            f"aether-cni is a chained plugin: {command.value} needs prevResult from the primary plugin",
            "list aether-cni after the plugin that creates the pod's interface in the conflist",
            version,
        )
    pod = None
    keys = ("K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_UID")
    if command is not Command.DEL:
        missing = [k for k in keys if not cni_args.get(k)]
        if missing:
            raise CniError(
                ERR_INVALID_ENV,
                f"CNI_ARGS lacks {', '.join(missing)}: the pod cannot be recorded for the node proxy",
                f"CNI_ARGS={env.get('CNI_ARGS', '')!r}",
                version,
            )
    if all(cni_args.get(k) for k in keys):
        pod = PodIdentity(cni_args["K8S_POD_NAMESPACE"], cni_args["K8S_POD_NAME"], cni_args["K8S_POD_UID"])
        if "/" in pod.uid or pod.uid in (".", ".."):
            raise CniError(ERR_INVALID_ENV, f"K8S_POD_UID {pod.uid!r} is not a pod uid", "", version)
    return CniRequest(
        command=command,
        cni_version=version,
        container_id=container_id,
        netns=netns,
        ifname=ifname,
        config=config,
        prev_result=prev,
        cni_args=cni_args,
        pod=pod,
    )


def version_result() -> dict[str, Any]:
    return {"cniVersion": SPEC_VERSION, "supportedVersions": list(SUPPORTED_VERSIONS)}
