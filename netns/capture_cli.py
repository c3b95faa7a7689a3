"""`aether capture install|check|remove --netns PATH [--mode tproxy|redirect]`: the capture outside the CNI runtime."""

from __future__ import annotations

import argparse
import sys

from aether.netns.contract import CaptureMode
from aether.netns.install import CaptureDrift, CaptureError, check_capture, install_capture, remove_capture


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aether capture", description="install, check or remove the capture in a netns")
    p.add_argument("action", choices=["install", "check", "remove"])
    p.add_argument(
        "--netns", required=True, metavar="PATH", help="the netns file, e.g. /run/netns/pod or /proc/PID/ns/net"
    )
    p.add_argument(
        "--mode",
        choices=[m.value for m in CaptureMode],
        default=CaptureMode.TPROXY.value,
        help="tproxy (mark-and-divert, deployed) or redirect (the negative control)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    mode = CaptureMode(args.mode)
    try:
        if args.action == "install":
            install_capture(args.netns, mode)
            print(f"capture {mode.value} installed in {args.netns}")
        elif args.action == "check":
            check_capture(args.netns, mode)
            print(f"capture {mode.value} in {args.netns}: ok")
        else:
            removed = remove_capture(args.netns)
            print(f"capture removed from {args.netns}" if removed else f"{args.netns} is gone: nothing to remove")
    except CaptureDrift as exc:
        print(f"aether capture check: {args.netns} drifted from {mode.value}:", file=sys.stderr)
        for reason in exc.reasons:
            print(f"  - {reason}", file=sys.stderr)
        return 1
    except CaptureError as exc:
        print(f"aether capture {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0
