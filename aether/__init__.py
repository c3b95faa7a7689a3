"""aether: a service mesh with per-service plaintext UDP and east-west HTTP/3 with per-source identity.

The code lives in the repository's `netns/`, `operator/`, `xds/` and `e2e/` folders and is imported as
`aether.netns`, `aether.operator`, `aether.xds` and `aether.e2e` (the folders are linked under this package).
"""

__version__ = "0.1.0"
