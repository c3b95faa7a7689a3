"""`aether`: one console script; each subcommand lives with the folder that owns it.

Subcommand modules expose `main(argv: list[str]) -> int` and are imported only when used, so
`aether capture` never pays for grpc and `aether xds` never pays for kopf.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module, one-line help): what a node or the operator runs
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "operator": ("aether.operator.cli", "run the kopf operator (--kubeconfig F, in-cluster config otherwise)"),
    "xds": ("aether.xds.sidecar.cli", "the node xDS sidecar; also `xds render` and `xds bootstrap`"),
    "capture": ("aether.netns.capture_cli", "install or check the capture in a netns, outside the CNI runtime"),
    "node-return": (
        "aether.netns.node_return",
        "the node's return path for --udp-preserve-source (install|check|remove)",
    ),
    "node-guard": (
        "aether.netns.node_guard",
        "the node's guard of the mesh sources: a strict reverse-path check (install|check|remove)",
    ),
}
# development commands: they live in the test support (aether.testing, aether.e2e) and need the `dev` extra
# (kmock, jsonschema); a production install or image answers them with how to get them
DEVELOPMENT: dict[str, tuple[str, str]] = {
    "dev-api": (
        "aether.testing.devapi",
        "a local API server (the real control plane or the test bed) and a kubeconfig",
    ),
    "demo": ("aether.e2e.demo", "the whole mesh locally: API server, operator, sidecar, real Envoy, netns pods"),
}
DEV_EXTRA = "pip install 'aether-mesh[dev]' from a checkout of the repository"


def usage() -> str:
    lines = ["usage: aether <command> [options]", "", "commands:"]
    for name, (_, help_text) in SUBCOMMANDS.items():
        lines.append(f"  {name:<10} {help_text}")
    lines += ["", f"development commands ({DEV_EXTRA}):"]
    for name, (_, help_text) in DEVELOPMENT.items():
        lines.append(f"  {name:<10} {help_text}")
    lines.append("")
    lines.append("`aether <command> --help` shows each command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS and name not in DEVELOPMENT:
        print(f"aether: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, _ = SUBCOMMANDS.get(name) or DEVELOPMENT[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if name not in DEVELOPMENT:
            raise
        print(
            f"aether {name}: a development command, not in this install ({exc.name} is missing): {DEV_EXTRA}",
            file=sys.stderr,
        )
        return 2
    code: int = module.main(rest)
    return code


if __name__ == "__main__":
    sys.exit(main())
