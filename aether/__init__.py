"""aether: a service mesh with per-service plaintext UDP and east-west HTTP/3 with per-source identity.

The code lives in the repository's `netns/`, `api/`, `operator/`, `xds/`, `testing/` and `e2e/` folders and is
imported as `aether.<folder>` (the folders are linked under this package). Dependencies flow one way:
netns <- api <- {operator, xds} <- {testing, e2e}; docs/architecture.md has the table.
"""

__version__ = "0.1.0"
