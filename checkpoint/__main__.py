"""``python -m checkpoint inspect LOCATION [--version N] [--verify] [--json] [--no-key-groups]``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from .debug import describe, format_description
from .errors import CheckpointError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m checkpoint", description="Look into an opbuffer checkpoint.")
    sub = parser.add_subparsers(dest="command", required=True)
    inspect = sub.add_parser("inspect", help="list versions and describe one (the latest by default)")
    inspect.add_argument("location", help="checkpoint location: a local path or an fsspec URL")
    inspect.add_argument("--version", type=int, default=None, help="the version to describe (default: latest)")
    inspect.add_argument("--verify", action="store_true", help="read every section of the version and check its checksum")
    inspect.add_argument("--json", action="store_true", help="print the description as JSON")
    inspect.add_argument("--no-key-groups", action="store_true", help="omit the per-key-group table")
    args = parser.parse_args(argv)
    try:
        info = describe(args.location, args.version, verify=args.verify)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(info, indent=1) if args.json else format_description(info, key_groups=not args.no_key_groups)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # e.g. piped into head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
