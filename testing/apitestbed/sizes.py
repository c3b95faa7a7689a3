"""The size walls of a real API server, answered as it answers them (kube-apiserver + etcd defaults):

- A write whose request body is over `MAX_REQUEST_BODY_BYTES` (3 MiB, kube-apiserver's default
  `MaxRequestBodyBytes`, twice etcd's limit to leave room for JSON -> protobuf) is refused before it is decoded:
  413, reason `RequestEntityTooLarge`, message `Request entity too large: limit is 3145728`.
- An object whose stored form is over `ETCD_MAX_REQUEST_BYTES` (1.5 MiB, etcd's default `--max-request-bytes`)
  is refused by etcd with `etcdserver: request is too large`; kube-apiserver does not map that error to an API
  status, so the client sees 500 with an empty reason (`Unknown`, omitted from the JSON) and etcd's text as the
  message. Custom resources are stored as JSON, so the stored size here is the compact JSON of the object plus
  its key.
"""

from __future__ import annotations

import json
from typing import Any

MAX_REQUEST_BODY_BYTES = 3 * 1024 * 1024
ETCD_MAX_REQUEST_BYTES = int(1.5 * 1024 * 1024)
ETCD_TOO_LARGE = "etcdserver: request is too large"


def body_refusal(length: int, limit: int = MAX_REQUEST_BODY_BYTES) -> tuple[int, str, str] | None:
    """(code, reason, message) when a request body of `length` bytes is refused, else None."""
    if length > limit:
        return 413, "RequestEntityTooLarge", f"Request entity too large: limit is {limit}"
    return None


def stored_size(key: str, obj: Any) -> int:
    """The bytes etcd is asked to store for `obj` under `key`: the key and the object's compact JSON."""
    return len(key.encode()) + len(json.dumps(obj, separators=(",", ":")).encode())


def stored_refusal(key: str, obj: Any, limit: int = ETCD_MAX_REQUEST_BYTES) -> tuple[int, str, str] | None:
    """(code, reason, message) when etcd would refuse to store `obj`, else None."""
    if stored_size(key, obj) > limit:
        return 500, "", ETCD_TOO_LARGE
    return None
