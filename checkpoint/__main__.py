"""``python -m checkpoint inspect LOCATION [--version N] [--verify] [--json] [--no-key-groups] [--checkpoint-key-file F]
[--storage-options JSON|@FILE] [--storage-option KEY=VALUE ...]``.

The checkpoint key comes from ``--checkpoint-key-file`` (the file's bytes, one
trailing newline stripped) or from ``$OPBUFFER_CHECKPOINT_KEY``; there is no
option taking the key itself, since a command line is visible to every user
of the machine (``ps``).

The fsspec storage options of a URL location (what ``storage_options=`` is in
Python) come from ``--storage-options`` (a JSON object, or ``@FILE`` holding
one) and ``--storage-option KEY=VALUE`` (repeatable, applied after it; a
dotted KEY reaches into a nested mapping, a VALUE that parses as JSON is that
JSON, else the text), e.g. for an S3 API server::

    python -m checkpoint inspect s3://bucket/ckpt --storage-option client_kwargs.endpoint_url=http://127.0.0.1:9000

Credentials are better left to the environment (``AWS_ACCESS_KEY_ID``, ...)
or put in an ``@FILE`` than written on a command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from .debug import describe, format_description
from .errors import CheckpointError


class _UsageError(Exception):
    pass


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise _UsageError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise _UsageError(f"{what} must be a JSON object, got {type(value).__name__}: {text[:200]!r}")
    return value


def storage_options_of(options_json: str | None, pairs: Sequence[str]) -> dict[str, Any] | None:
    """The storage options ``--storage-options`` (JSON or ``@FILE``) and ``--storage-option KEY=VALUE`` give.

    None when neither is given. Raises _UsageError naming the offending argument.
    """
    if options_json is None and not pairs:
        return None
    options: dict[str, Any] = {}
    if options_json is not None:
        if options_json.startswith("@"):
            try:
                with open(options_json[1:], encoding="utf-8") as f:
                    text = f.read()
            except OSError as exc:
                raise _UsageError(f"--storage-options {options_json!r}: {exc}") from None
        else:
            text = options_json
        options = _json_object(text, f"--storage-options {options_json!r}")
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        path = name.split(".")
        if not sep or not all(path):
            raise _UsageError(f"--storage-option {pair!r} must be KEY=VALUE (KEY may be dotted: a.b=VALUE)")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw  # plain text: an endpoint URL, a region, a profile name
        target = options
        for part in path[:-1]:
            inner = target.setdefault(part, {})
            if not isinstance(inner, dict):
                raise _UsageError(f"--storage-option {pair!r}: {part!r} is already set to {inner!r}, not a mapping")
            target = inner
        target[path[-1]] = value
    return options


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
    inspect.add_argument(
        "--storage-options", default=None, metavar="JSON|@FILE",
        help="fsspec storage options of a URL location: a JSON object, or @FILE holding one",
    )
    inspect.add_argument(
        "--storage-option", action="append", default=[], metavar="KEY=VALUE",
        help="one storage option (repeatable, after --storage-options); a dotted KEY sets a nested one, "
        "e.g. client_kwargs.endpoint_url=http://127.0.0.1:9000; a VALUE that is JSON is read as JSON",
    )
    args = parser.parse_args(argv)
    try:
        storage_options = storage_options_of(args.storage_options, args.storage_option)
    except _UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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
        info = describe(
            args.location, args.version, verify=args.verify, checkpoint_key=key, storage_options=storage_options
        )
    except (CheckpointError, ValueError, TypeError, OSError) as exc:
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
