"""The pod records through which the node proxy finds each pod's netns.

The CNI plugin writes `<state dir>/<pod uid>.json` on ADD and removes it on DEL; the xds sidecar binds a
pod's listeners only when both its MeshNode lists the pod and this record exists.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aether.atomicfile import write_text_atomic
from aether.netns.record_file import (
    DEFAULT_STATE_DIR,
    STATE_DIR_ENV,
    RecordError,
    record_path_str,
    remove_record,
    state_dir_str,
)

__all__ = [
    "DEFAULT_STATE_DIR",
    "STATE_DIR_ENV",
    "PodRecord",
    "RecordError",
    "load_records",
    "read_record",
    "record_path",
    "remove_record",
    "state_dir",
    "write_record",
]


def state_dir(override: str | os.PathLike[str] | None = None) -> Path:
    return Path(state_dir_str(override))


def record_path(uid: str, directory: str | os.PathLike[str] | None = None) -> Path:
    return Path(record_path_str(uid, directory))


class PodRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    uid: str = Field(min_length=1)
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    netns: str = Field(min_length=1, description="path of the pod's network namespace")
    ips: list[str] = Field(default_factory=list)
    container_id: str = ""
    ifname: str = ""


def write_record(record: PodRecord, directory: str | os.PathLike[str] | None = None) -> Path:
    """Write atomically (temp file + rename), so a reader never sees half a record."""
    path = record_path(record.uid, directory)
    write_text_atomic(path, record.model_dump_json(indent=2))
    return path


def read_record(path: str | os.PathLike[str]) -> PodRecord:
    try:
        with open(path, encoding="utf-8") as f:
            return PodRecord.model_validate(json.loads(f.read()))
    except (OSError, json.JSONDecodeError, ValidationError) as exc:
        raise RecordError(f"{path}: {exc}") from exc


def load_records(directory: str | os.PathLike[str] | None = None) -> dict[str, PodRecord]:
    """All valid records by pod uid; unreadable files are skipped (the caller logs what is missing)."""
    out: dict[str, PodRecord] = {}
    d = state_dir_str(directory)
    try:
        names = sorted(e.name for e in os.scandir(d) if e.name.endswith(".json"))
    except (FileNotFoundError, NotADirectoryError):
        return out
    for name in names:
        try:
            rec = read_record(os.path.join(d, name))
        except RecordError:
            continue
        out[rec.uid] = rec
    return out
