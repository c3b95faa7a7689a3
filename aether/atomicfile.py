"""Replace a file atomically: a temp file in the same directory, renamed over the target, so a reader never sees
half a file. Standard library only (the CNI plugin's hot path uses it)."""

from __future__ import annotations

import os

StrPath = str | os.PathLike[str]


def write_text_atomic(path: StrPath, text: str, mode: int = 0o644) -> None:
    p = os.fspath(path)
    d, base = os.path.split(p)
    os.makedirs(d or ".", exist_ok=True)
    tmp = os.path.join(d, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # exactly `mode`, whatever the umask
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
