"""`aether-cni`: the chained CNI plugin (spec 1.0.0) that installs the capture and records the pod.

- ADD: install the tproxy capture in CNI_NETNS with the pod's inbound enforcement (`CniRequest.inbound_policy`:
  STRICT unless the pod annotation `mesh.aether.dev/inbound: permissive` or the entry's `inbound` says otherwise), write `<state dir>/<pod uid>.json` (AETHER_STATE_DIR, default
  /run/aether/pods), print prevResult unchanged. A failure leaves nothing behind (the record is written after the
  capture, and a failed record write removes the capture again).
- CHECK: the capture is exactly right and the record names this netns and container; any drift is an error.
- DEL: remove the record (only if it belongs to this container: a re-created sandbox of the same pod keeps its new
  record) and the capture; idempotent, and a vanished netns is not an error.
- VERSION: the versions this plugin speaks.

This module is on the runtime's hot path (50 ms budget): it imports only the standard library and the stdlib-only
parts of aether.netns (no pydantic, no pyroute2, no grpc). The pure request parsing is in `cni_request`.
"""

from __future__ import annotations

import os
import sys

from aether.netns import litejson as json
from aether.netns.cni_request import (
    ERR_CAPTURE_DRIFT,
    ERR_CAPTURE_INSTALL,
    ERR_INVALID_ENV,
    ERR_RECORD,
    ERR_UNKNOWN_CONTAINER,
    CniError,
    CniRequest,
    Command,
    parse_request,
    version_result,
)
from aether.netns.contract import CaptureMode
from aether.netns.install import CaptureDrift, CaptureError, check_capture, install_capture, remove_capture
from aether.netns.nsthread import NetnsError, NetnsMissing, check_netns
from aether.netns.record_file import (
    RecordError,
    read_record_fields,
    record_path_str,
    remove_record,
    state_dir_str,
    write_record_fields,
)

TYPE_CHECKING = False  # the CNI plugin's start-up path: see aether.netns.lite
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def _require_netns(req: CniRequest) -> None:
    try:
        check_netns(req.netns)
    except NetnsMissing as exc:
        raise CniError(
            ERR_UNKNOWN_CONTAINER, f"CNI_NETNS {req.netns} does not exist", str(exc), req.cni_version
        ) from exc
    except NetnsError as exc:
        raise CniError(
            ERR_INVALID_ENV, f"CNI_NETNS {req.netns} is not a network namespace", exc.strerror or "", req.cni_version
        ) from exc


def _record_fields(req: CniRequest) -> dict[str, Any]:
    assert req.pod is not None  # parse_request guarantees it for ADD and CHECK
    return {
        "uid": req.pod.uid,
        "namespace": req.pod.namespace,
        "name": req.pod.name,
        "netns": req.netns,
        "ips": req.pod_ips(),
        "container_id": req.container_id,
        "ifname": req.ifname,
    }


def cmd_add(req: CniRequest, directory: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    _require_netns(req)
    try:
        install_capture(req.netns, CaptureMode.TPROXY, inbound=req.inbound_policy())
    except CaptureError as exc:
        raise CniError(
            ERR_CAPTURE_INSTALL, f"installing the capture in {req.netns} failed", str(exc), req.cni_version
        ) from exc
    try:
        write_record_fields(_record_fields(req), directory)
    except (OSError, RecordError) as exc:
        try:
            remove_capture(req.netns)
        except CaptureError as undo:
            raise CniError(
                ERR_RECORD, "writing the pod record failed and removing the capture failed too", f"{exc}; {undo}"
            ) from exc
        raise CniError(
            ERR_RECORD, "writing the pod record failed (capture removed again)", str(exc), req.cni_version
        ) from exc
    assert req.prev_result is not None
    return req.prev_result


def cmd_check(req: CniRequest, directory: str | os.PathLike[str] | None = None) -> None:
    _require_netns(req)
    try:
        check_capture(req.netns, CaptureMode.TPROXY, inbound=req.inbound_policy())
    except CaptureDrift as exc:
        raise CniError(
            ERR_CAPTURE_DRIFT, f"the capture in {req.netns} drifted", "; ".join(exc.reasons), req.cni_version
        ) from exc
    except CaptureError as exc:
        raise CniError(
            ERR_CAPTURE_DRIFT, f"the capture in {req.netns} cannot be read", str(exc), req.cni_version
        ) from exc
    want = _record_fields(req)
    path = record_path_str(want["uid"], directory)
    try:
        have = read_record_fields(path)
    except RecordError as exc:
        raise CniError(
            ERR_RECORD, f"the pod record {path} is missing or unreadable", str(exc), req.cni_version
        ) from exc
    wrong = [k for k in ("uid", "namespace", "name", "netns", "container_id") if have.get(k) != want[k]]
    if wrong:
        details = ", ".join(f"{k}: recorded {have.get(k)!r}, expected {want[k]!r}" for k in wrong)
        raise CniError(ERR_RECORD, f"the pod record {path} does not match this container", details, req.cni_version)


def _owned_by(path: str, container_id: str) -> bool:
    try:
        recorded = read_record_fields(path).get("container_id")
    except RecordError:
        return True  # unreadable: nothing else can use it either
    return not recorded or recorded == container_id


def cmd_del(req: CniRequest, directory: str | os.PathLike[str] | None = None) -> None:
    if req.netns:
        try:
            remove_capture(req.netns)
        except CaptureError as exc:
            if not isinstance(exc.__cause__, NetnsError):
                raise CniError(
                    ERR_CAPTURE_INSTALL, f"removing the capture from {req.netns} failed", str(exc), req.cni_version
                ) from exc
            # a path that is no netns holds no capture of ours: nothing to remove there
    candidates: list[str] = []
    if req.pod is not None:
        candidates.append(record_path_str(req.pod.uid, directory))
    else:  # no pod identity: find this container's records by scanning the (node-local, small) state dir
        d = state_dir_str(directory)
        names = sorted(os.listdir(d)) if os.path.isdir(d) else []
        candidates += [os.path.join(d, n) for n in names if n.endswith(".json") and not n.startswith(".")]
    for path in candidates:
        if os.path.exists(path) and _owned_by(path, req.container_id):
            try:
                if req.pod is not None:
                    remove_record(req.pod.uid, directory)
                elif read_record_fields(path).get("container_id") == req.container_id:
                    os.unlink(path)
            except (OSError, RecordError) as exc:
                raise CniError(ERR_RECORD, f"removing the pod record {path} failed", str(exc), req.cni_version) from exc


def run(req: CniRequest, directory: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """Carry out a parsed request; returns what to print on stdout (None: nothing). Raises CniError."""
    if req.command is Command.VERSION:
        return version_result()
    if req.command is Command.ADD:
        return cmd_add(req, directory)
    if req.command is Command.CHECK:
        cmd_check(req, directory)
    else:
        cmd_del(req, directory)
    return None


def invoke(env: Mapping[str, str], stdin: bytes, directory: str | os.PathLike[str] | None = None) -> tuple[int, str]:
    """The whole plugin as a function: (exit code, stdout text). Used by `main` and by in-process callers."""
    try:
        out = run(parse_request(env, stdin), directory)
    except CniError as exc:
        return 1, json.dumps(exc.to_json())
    return 0, "" if out is None else json.dumps(out)


def main() -> int:
    stdin = b"" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    code, text = invoke(os.environ, stdin)
    if text:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
