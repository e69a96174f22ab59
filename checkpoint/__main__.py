"""``python -m checkpoint inspect LOCATION [--version N] [--verify] [--json] [--no-key-groups] [--checkpoint-key-file F]``.

The checkpoint key comes from ``--checkpoint-key-file`` (the file's bytes, one
trailing newline stripped) or from ``$OPBUFFER_CHECKPOINT_KEY``; there is no
option taking the key itself, since a command line is visible to every user
of the machine (``ps``).
"""

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
    inspect.add_argument(
        "--checkpoint-key-file", default=None, metavar="FILE",
        help="verify manifest signatures with the key in FILE (default: $OPBUFFER_CHECKPOINT_KEY, if set)",
    )
    args = parser.parse_args(argv)
    key = None
    if args.checkpoint_key_file is not None:
        try:
            with open(args.checkpoint_key_file, "rb") as f:
                key = f.read()
        except OSError as exc:
            print(f"error: --checkpoint-key-file {args.checkpoint_key_file!r}: {exc}", file=sys.stderr)
            return 2
        key = key[:-1] if key.endswith(b"\n") else key
        if not key:
            print(f"error: --checkpoint-key-file {args.checkpoint_key_file!r} is empty", file=sys.stderr)
            return 2
    try:
        info = describe(args.location, args.version, verify=args.verify, checkpoint_key=key)
    except (CheckpointError, ValueError) as exc:
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
