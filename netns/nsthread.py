"""Run a function with its thread inside a network namespace given by path.

Python 3.11 has no `os.setns`; `libc.setns` acts on the calling thread only. Two ways to use it:

- `run_in_netns(path, fn)`: a fresh, dedicated thread enters the netns, runs `fn` and ends (it never returns to a
  pool in the wrong netns). Sockets and netlink contexts created there stay bound to that netns afterwards.
- `call_in_netns(path, fn)`: the calling thread enters the netns, runs `fn` and goes back to the netns it came from
  (held open by fd). No thread hand-off: on these VMs a cross-thread wake-up can cost a whole 4 ms timer tick,
  which the CNI plugin's 50 ms budget cannot afford. If going back ever fails the thread is in the wrong netns, so
  that raises `NetnsRestoreError` (callers must treat it as fatal).

A path is a netns when it is an nsfs file whose `NS_GET_NSTYPE` is `CLONE_NEWNET`; anything else (a missing path, a
regular file, another kind of namespace) is refused with a clear error before any setns.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os

TYPE_CHECKING = False  # on the CNI plugin's start-up path: see aether.netns.lite
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Final, TypeVar

    T = TypeVar("T")

CLONE_NEWNET: Final = 0x40000000
NS_GET_NSTYPE: Final = 0xB703  # _IO(0xb7, 0x3), Linux >= 4.11

_libc: ctypes.CDLL | None = None


class NetnsError(OSError):
    """The path does not name a network namespace."""


class NetnsMissing(NetnsError):
    """Nothing exists at the path (a vanished pod netns)."""


def libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6", use_errno=True)  # not ctypes.util.find_library: it may spawn ldconfig
        except OSError:
            from ctypes.util import find_library

            _libc = ctypes.CDLL(find_library("c"), use_errno=True)
    return _libc


def open_netns(path: str | os.PathLike[str]) -> int:
    """An O_RDONLY fd on the netns at `path`; raises NetnsMissing / NetnsError for anything that is not one."""
    p = os.fspath(path)
    if not p:
        raise NetnsError(errno.EINVAL, "empty netns path")
    try:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise NetnsMissing(errno.ENOENT, f"netns {p} does not exist") from exc
    except IsADirectoryError as exc:
        raise NetnsError(errno.EINVAL, f"{p} is a directory, not a network namespace") from exc
    except OSError as exc:
        raise NetnsError(exc.errno or errno.EINVAL, f"cannot open netns {p}: {exc.strerror}") from exc
    try:
        nstype = fcntl.ioctl(fd, NS_GET_NSTYPE)
    except OSError as exc:
        os.close(fd)
        raise NetnsError(errno.EINVAL, f"{p} is not a network namespace (not an nsfs file)") from exc
    if nstype != CLONE_NEWNET:
        os.close(fd)
        raise NetnsError(errno.EINVAL, f"{p} is a namespace but not a network namespace (type {nstype:#x})")
    return fd


def check_netns(path: str | os.PathLike[str]) -> None:
    os.close(open_netns(path))


def setns_current_thread(fd: int) -> None:
    if libc().setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class NetnsRestoreError(RuntimeError):
    """The calling thread could not go back to its own netns: it must not be used any further."""


def call_in_netns(path: str | os.PathLike[str], fn: Callable[[], T]) -> T:
    """Call `fn()` with the calling thread inside the netns at `path`, then return the thread to its own netns."""
    target = open_netns(path)
    try:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except BaseException:
        os.close(target)
        raise
    try:
        setns_current_thread(target)
        try:
            return fn()
        finally:
            try:
                setns_current_thread(home)
            except OSError as exc:
                raise NetnsRestoreError(f"could not return to the thread's own netns after {path}: {exc}") from exc
    finally:
        os.close(target)
        os.close(home)


def run_in_netns(path: str | os.PathLike[str], fn: Callable[[], T]) -> T:
    """Call `fn()` on a fresh thread that first enters the netns at `path`; return its result or re-raise."""
    import threading  # only here: the CNI path (call_in_netns) does not pay for it

    fd = open_netns(path)
    box: dict[str, object] = {}

    def body() -> None:
        try:
            setns_current_thread(fd)
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    try:
        thread = threading.Thread(target=body, name=f"netns:{os.fspath(path)}", daemon=True)
        thread.start()
        thread.join()
    finally:
        os.close(fd)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
