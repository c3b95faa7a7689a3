"""Pod record files with the standard library only: paths, atomic write, removal.

The CNI plugin writes records on its hot path, where importing pydantic (~250 ms), pathlib or tempfile would eat the
50 ms budget, so the file handling lives here on plain `str` paths and `records` (the validated `PodRecord` model
and the `Path`-returning helpers readers use) builds on it. The JSON written here has exactly `PodRecord`'s fields;
a test reads it back through the model.
"""

from __future__ import annotations

import os

from aether.atomicfile import write_text_atomic
from aether.netns import litejson as json

TYPE_CHECKING = False  # on the CNI plugin's start-up path: see aether.netns.lite
if TYPE_CHECKING:
    from typing import Any

DEFAULT_STATE_DIR = "/run/aether/pods"
STATE_DIR_ENV = "AETHER_STATE_DIR"
RECORD_FIELDS = ("uid", "namespace", "name", "netns", "ips", "container_id", "ifname")

StrPath = str | os.PathLike[str]


class RecordError(ValueError):
    pass


def state_dir_str(override: StrPath | None = None) -> str:
    return os.fspath(override or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def record_path_str(uid: str, directory: StrPath | None = None) -> str:
    if not uid or "/" in uid or uid in (".", "..") or "\x00" in uid:
        raise RecordError(f"pod uid {uid!r} cannot name a record file")
    return os.path.join(state_dir_str(directory), f"{uid}.json")


def write_record_fields(fields: dict[str, Any], directory: StrPath | None = None) -> str:
    """Write a record given as plain fields (exactly RECORD_FIELDS; checked here without pydantic)."""
    if set(fields) != set(RECORD_FIELDS):
        raise RecordError(f"record fields {sorted(fields)} are not {sorted(RECORD_FIELDS)}")
    for key in ("uid", "namespace", "name", "netns"):
        if not isinstance(fields[key], str) or not fields[key]:
            raise RecordError(f"record field {key!r} must be a non-empty string")
    if not isinstance(fields["ips"], list) or not all(isinstance(ip, str) for ip in fields["ips"]):
        raise RecordError("record field 'ips' must be a list of strings")
    path = record_path_str(fields["uid"], directory)
    write_text_atomic(path, json.dumps({k: fields[k] for k in RECORD_FIELDS}) + "\n")
    return path


def read_record_fields(path: StrPath) -> dict[str, Any]:
    try:
        with open(path) as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError) as exc:  # ValueError: json.JSONDecodeError, UnicodeDecodeError
        raise RecordError(f"{os.fspath(path)}: {exc}") from exc
    if not isinstance(data, dict):
        raise RecordError(f"{os.fspath(path)}: not a JSON object")
    return data


def remove_record(uid: str, directory: StrPath | None = None) -> bool:
    try:
        os.unlink(record_path_str(uid, directory))
    except FileNotFoundError:
        return False
    return True
