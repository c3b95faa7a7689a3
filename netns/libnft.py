"""libnftables through ctypes: the `nft` binary's own library, without a process per call.

A context opens its netlink socket in the netns current on the creating thread and stays bound to it, so create one
per netns, inside it (see `nsthread.run_in_netns`). Input and output are JSON (`nft -j`). The library ships with the
`nftables` package (the `nft` binary links it), so anything that can run `nft` can load it.
"""

from __future__ import annotations

import ctypes

from aether.netns import litejson as json

TYPE_CHECKING = False  # on the CNI plugin's start-up path: see aether.netns.lite
if TYPE_CHECKING:
    from typing import Any, Final
    from typing import NamedTuple as Record
else:
    from aether.netns.lite import Record

NFT_CTX_OUTPUT_JSON: Final = 1 << 4
LIBRARY_NAMES: Final = ("libnftables.so.1", "libnftables.so")

_lib: ctypes.CDLL | None = None


class NftError(RuntimeError):
    pass


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    last: OSError | None = None
    for name in LIBRARY_NAMES:
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            break
        except OSError as exc:
            last = exc
    else:
        raise NftError(f"libnftables not found ({last}): install the nftables package")
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
    _lib = lib
    return lib


class NftResult(Record):
    rc: int
    output: str
    error: str

    def json(self) -> dict[str, Any]:
        if not self.output.strip():
            return {"nftables": []}
        data: dict[str, Any] = json.loads(self.output)
        return data


class Nft:
    """One libnftables context (JSON in, JSON out), bound to the netns of the thread that made it."""

    def __init__(self) -> None:
        self._lib = _library()
        ctx = self._lib.nft_ctx_new(0)
        if not ctx:
            raise NftError("nft_ctx_new failed")
        self._ctx: int | None = ctx
        self._lib.nft_ctx_output_set_flags(ctx, NFT_CTX_OUTPUT_JSON)
        self._lib.nft_ctx_buffer_output(ctx)
        self._lib.nft_ctx_buffer_error(ctx)

    def run(self, command: dict[str, Any] | str) -> NftResult:
        if self._ctx is None:
            raise NftError("context is closed")
        text = command if isinstance(command, str) else json.dumps(command)
        rc = self._lib.nft_run_cmd_from_buffer(self._ctx, text.encode())
        out = self._lib.nft_ctx_get_output_buffer(self._ctx) or b""
        err = self._lib.nft_ctx_get_error_buffer(self._ctx) or b""
        return NftResult(rc, out.decode(errors="replace"), err.decode(errors="replace"))

    def table_rules(self, table: dict[str, Any]) -> list[list[dict[str, Any]]] | None:
        """The rules of `table` (`{"family", "name"}`) as loaded, each its statement list with counters zeroed (so
        they compare equal to the rules as written); None when the table is not there."""
        res = self.run({"nftables": [{"list": {"table": table}}]})
        if res.rc != 0:
            return None
        found = [o["rule"]["expr"] for o in res.json().get("nftables", []) if "rule" in o]
        for expr in found:
            for stmt in expr:
                if "counter" in stmt:
                    stmt["counter"] = {"packets": 0, "bytes": 0}
        return found

    def close(self) -> None:
        if self._ctx is not None:
            self._lib.nft_ctx_free(self._ctx)
            self._ctx = None

    def __enter__(self) -> Nft:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
