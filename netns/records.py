"""The pod records through which the node proxy finds each pod's netns.

The CNI plugin writes `<state dir>/<pod uid>.json` on ADD and removes it on DEL; the xds sidecar binds a
pod's listeners only when both its MeshNode lists the pod and this record exists.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_STATE_DIR = "/run/aether/pods"
STATE_DIR_ENV = "AETHER_STATE_DIR"


class PodRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    uid: str = Field(min_length=1)
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    netns: str = Field(min_length=1, description="path of the pod's network namespace")
    ips: list[str] = Field(default_factory=list)
    container_id: str = ""
    ifname: str = ""


class RecordError(ValueError):
    pass


def state_dir(override: str | os.PathLike[str] | None = None) -> Path:
    return Path(override or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def record_path(uid: str, directory: str | os.PathLike[str] | None = None) -> Path:
    if not uid or "/" in uid or uid in (".", ".."):
        raise RecordError(f"pod uid {uid!r} cannot name a record file")
    return state_dir(directory) / f"{uid}.json"


def write_record(record: PodRecord, directory: str | os.PathLike[str] | None = None) -> Path:
    """Write atomically (temp file + rename), so a reader never sees half a record."""
    path = record_path(record.uid, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{record.uid}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(record.model_dump_json(indent=2))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def remove_record(uid: str, directory: str | os.PathLike[str] | None = None) -> bool:
    path = record_path(uid, directory)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def read_record(path: Path) -> PodRecord:
    try:
        return PodRecord.model_validate(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError, ValidationError) as exc:
        raise RecordError(f"{path}: {exc}") from exc


def load_records(directory: str | os.PathLike[str] | None = None) -> dict[str, PodRecord]:
    """All valid records by pod uid; unreadable files are skipped (the caller logs what is missing)."""
    out: dict[str, PodRecord] = {}
    d = state_dir(directory)
    if not d.is_dir():
        return out
    for path in sorted(d.glob("*.json")):
        try:
            rec = read_record(path)
        except RecordError:
            continue
        out[rec.uid] = rec
    return out
