"""``python -m checkpoint COMMAND``: look into a checkpoint, move state in and out of one.

* ``inspect LOCATION [--version N] [--verify] [--json] [--no-key-groups]``: what a location holds;
* ``export LOCATION OUTPUT [--version N] [--state-schema DDL] [--timeout-column NAME] [--format parquet|csv]``:
  a version's state as a table, one row per key (key columns, then the state's fields); with
  ``--processor MODULE:NAME`` a processor's state, one file per state variable in the directory OUTPUT;
* ``import-spark SPARK_CHECKPOINT LOCATION [--key COL] [--state-schema DDL] [--operator-id N] [--batch-id N]
  [--parallelism N] [--max-parallelism N] [--watermark-delay-ms MS] [--master URL | --remote sc://...]``:
  [--processor MODULE:NAME]: a stopped applyInPandasWithState or transformWithStateInPandas query's state
  as version 0 of a new checkpoint
  (:func:`buffering.spark.import_state`; the only command that needs pyspark, imported then);

each with ``[--checkpoint-key-file F] [--storage-options JSON|@FILE] [--storage-option KEY=VALUE ...]``.

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


def _add_access_options(parser: argparse.ArgumentParser, key_help: str) -> None:
    """The options every command shares: the checkpoint key file and the storage options."""
    parser.add_argument("--checkpoint-key-file", default=None, metavar="FILE", help=key_help)
    parser.add_argument(
        "--storage-options", default=None, metavar="JSON|@FILE",
        help="fsspec storage options of a URL location: a JSON object, or @FILE holding one",
    )
    parser.add_argument(
        "--storage-option", action="append", default=[], metavar="KEY=VALUE",
        help="one storage option (repeatable, after --storage-options); a dotted KEY sets a nested one, "
        "e.g. client_kwargs.endpoint_url=http://127.0.0.1:9000; a VALUE that is JSON is read as JSON",
    )


def _access(args: argparse.Namespace) -> tuple[dict[str, Any] | None, bytes | None]:
    """The storage options and checkpoint key the arguments give; _UsageError naming the bad one."""
    storage_options = storage_options_of(args.storage_options, args.storage_option)
    key = None
    if args.checkpoint_key_file is not None:
        try:
            with open(args.checkpoint_key_file, "rb") as f:
                key = f.read()
        except OSError as exc:
            raise _UsageError(f"--checkpoint-key-file {args.checkpoint_key_file!r}: {exc}") from None
        key = key[:-1] if key.endswith(b"\n") else key
        if not key:
            raise _UsageError(f"--checkpoint-key-file {args.checkpoint_key_file!r} is empty")
    return storage_options, key


def _print(text: str) -> None:
    try:
        print(text, flush=True)
    except BrokenPipeError:  # e.g. piped into head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m checkpoint",
        description="Look into an opbuffer checkpoint, import a Spark query's state into one, export its state.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    inspect = sub.add_parser("inspect", help="list versions and describe one (the latest by default)")
    inspect.add_argument("location", help="checkpoint location: a local path or an fsspec URL")
    inspect.add_argument("--version", type=int, default=None, help="the version to describe (default: latest)")
    inspect.add_argument("--verify", action="store_true", help="read every section of the version and check its checksum")
    inspect.add_argument("--json", action="store_true", help="print the description as JSON")
    inspect.add_argument("--no-key-groups", action="store_true", help="omit the per-key-group table")
    _add_access_options(
        inspect, "verify manifest signatures with the key in FILE (default: $OPBUFFER_CHECKPOINT_KEY, if set)"
    )

    export = sub.add_parser(
        "export",
        help="write a version's state as parquet or CSV: one row per key, key columns then state fields",
        description="Write the state of a version (the latest by default) as a table with one row per key: the "
        "key columns, then one column per field of the state (the tuple an applyInPandasWithState-shaped "
        "function gave state.update), optionally each key's timeout. The shape Spark's "
        "transformWithStateInPandas(initialState=...) takes, grouped by the key.",
    )
    export.add_argument("location", help="checkpoint location: a local path or an fsspec URL")
    export.add_argument("output", help="the file to write (.parquet or .csv, or see --format)")
    export.add_argument("--version", type=int, default=None, help="the version to export (default: latest)")
    export.add_argument(
        "--state-schema", default=None, metavar="DDL",
        help="the state's fields, e.g. 'views long, total double' (default: what an imported version recorded)",
    )
    export.add_argument("--timeout-column", default=None, metavar="NAME", help="add each key's timeout (epoch ms) as NAME")
    export.add_argument("--format", choices=("parquet", "csv"), default=None, help="default: from OUTPUT's suffix")
    export.add_argument(
        "--processor", default=None, metavar="MODULE:NAME",
        help="a transformWithStateInPandas processor's checkpoint: the StatefulProcessor class (or instance); "
        "OUTPUT is then a directory that gets one file per state variable, and timers.<format> (needs pyspark)",
    )
    _add_access_options(
        export, "verify the manifest's signature with the key in FILE (default: $OPBUFFER_CHECKPOINT_KEY, if set)"
    )

    imp = sub.add_parser(
        "import-spark",
        help="write the state of a stopped applyInPandasWithState or transformWithStateInPandas query as version 0 "
        "of a new checkpoint (needs pyspark)",
        description="Read the state of a stopped applyInPandasWithState or transformWithStateInPandas query from its "
        "Spark checkpoint (Spark's state data source) and write it, with its timeouts or timers, as version 0 of a "
        "new opbuffer checkpoint; run_stream (with a new Spark checkpoint) or LocalRunner then go on from it. Runs a "
        "Spark application (--master, or --remote for Spark Connect).",
    )
    imp.add_argument("spark_checkpoint", help="the stopped query's checkpointLocation")
    imp.add_argument("location", help="the new opbuffer checkpoint: a local path or an fsspec URL (must hold no version)")
    imp.add_argument("--key", action="append", default=None, metavar="COLUMN", help="check the grouping column(s) (repeatable)")
    imp.add_argument("--state-schema", default=None, metavar="DDL", help="check the state schema, e.g. 'views long'")
    imp.add_argument(
        "--processor", default=None, metavar="MODULE:NAME",
        help="for a transformWithStateInPandas query: the StatefulProcessor class (or instance) the job runs, "
        "imported from MODULE (e.g. jobs.counts:CountsProcessor)",
    )
    imp.add_argument(
        "--ttl-ms", type=int, default=None,
        help="the cached_state(ttl_ms=...) the function will run with: imported keys expire that long after the import",
    )
    imp.add_argument("--operator-id", type=int, default=0, help="the stateful operator of the query (default: 0)")
    imp.add_argument("--batch-id", type=int, default=None, help="the committed Spark batch to read (default: latest)")
    imp.add_argument("--parallelism", type=int, default=None, help="instances written (default: Spark's partitions)")
    imp.add_argument("--max-parallelism", type=int, default=None, help="key groups of the new checkpoint (default: opbuffer's)")
    imp.add_argument(
        "--watermark-delay-ms", type=int, default=0, help="the watermark delay the new runner will run with (default: 0)"
    )
    imp.add_argument("--master", default=None, help="Spark master of the application (default: Spark's, local[*])")
    imp.add_argument("--remote", default=None, metavar="sc://HOST:PORT", help="use a Spark Connect server instead")
    _add_access_options(imp, "sign the new manifest with the key in FILE (default: $OPBUFFER_CHECKPOINT_KEY, if set)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        storage_options, key = _access(args)
    except _UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "export":
        return _export(args, storage_options, key)
    if args.command == "import-spark":
        return _import_spark(args, storage_options, key)
    try:
        info = describe(
            args.location, args.version, verify=args.verify, checkpoint_key=key, storage_options=storage_options
        )
    except (CheckpointError, ValueError, TypeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _print(json.dumps(info, indent=1) if args.json else format_description(info, key_groups=not args.no_key_groups))
    return 0


def _export(args: argparse.Namespace, storage_options: dict[str, Any] | None, key: bytes | None) -> int:
    from .export import export_state, write_table

    if args.processor is not None:
        return _export_processor(args, storage_options, key)
    try:
        frame = export_state(
            args.location,
            args.version,
            state_schema=args.state_schema,
            timeout_column=args.timeout_column,
            storage_options=storage_options,
            checkpoint_key=key,
        )
        fmt = write_table(frame, args.output, args.format)
    except (CheckpointError, ValueError, TypeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _print(f"wrote {len(frame)} keys ({', '.join(map(str, frame.columns))}) to {args.output} ({fmt})")
    return 0


def _export_processor(args: argparse.Namespace, storage_options: dict[str, Any] | None, key: bytes | None) -> int:
    from .export import write_table

    if args.state_schema is not None or args.timeout_column is not None:
        print("error: --state-schema and --timeout-column are for function state, not with --processor", file=sys.stderr)
        return 2
    try:
        from buffering.spark.migrate import TIMERS_EXPORT, processor_state_frames

        processor = _load_processor(args.processor)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        print(f"error: --processor {args.processor!r}: {exc}", file=sys.stderr)
        return 2
    fmt = args.format or "parquet"
    try:
        frames = processor_state_frames(
            args.location, processor, args.version, storage_options=storage_options, checkpoint_key=key
        )
        names = {name: ("timers" if name == TIMERS_EXPORT else name) for name in frames}
        if len(set(names.values())) != len(names):
            raise ValueError(f"a state variable is named 'timers', as the timers' file: {sorted(frames)}")
        os.makedirs(args.output, exist_ok=True)
        lines = []
        for name, frame in frames.items():
            path = os.path.join(args.output, f"{names[name]}.{fmt}")
            write_table(frame, path, fmt)
            lines.append(f"wrote {len(frame)} rows of {name} ({', '.join(map(str, frame.columns))}) to {path}")
    except (CheckpointError, ValueError, TypeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _print("\n".join(lines))
    return 0


def _load_processor(text: str) -> Any:
    """``MODULE:NAME``: the object NAME of MODULE, instantiated when it is a class."""
    import importlib

    module_name, sep, name = text.partition(":")
    if not sep or not module_name or not name:
        raise ValueError("give MODULE:NAME, e.g. jobs.counts:CountsProcessor")
    value = importlib.import_module(module_name)
    for part in name.split("."):
        value = getattr(value, part)
    return value() if isinstance(value, type) else value


def _import_spark(args: argparse.Namespace, storage_options: dict[str, Any] | None, key: bytes | None) -> int:
    try:
        from pyspark.sql import SparkSession

        from buffering.spark import import_state
    except ImportError as exc:
        print(f"error: import-spark needs pyspark and opbuffer's buffering package: {exc}", file=sys.stderr)
        return 2
    if args.master is not None and args.remote is not None:
        print("error: give --master or --remote, not both", file=sys.stderr)
        return 2
    # In a process that already has a session (a notebook, the tests), use it and leave it running.
    spark = SparkSession.getActiveSession() if args.remote is None else None
    owned = spark is None
    if spark is None:
        builder = SparkSession.builder.appName("opbuffer import-spark")
        if args.remote is not None:
            builder = builder.remote(args.remote)
        elif args.master is not None:
            builder = builder.master(args.master)
        spark = builder.getOrCreate()
    options: dict[str, Any] = {}
    if args.processor is not None:
        try:
            options["processor"] = _load_processor(args.processor)
        except (ImportError, AttributeError, ValueError, TypeError) as exc:
            if owned:
                spark.stop()
            print(f"error: --processor {args.processor!r}: {exc}", file=sys.stderr)
            return 2
    if args.max_parallelism is not None:
        options["max_parallelism"] = args.max_parallelism
    if args.ttl_ms is not None:
        options["ttl_ms"] = args.ttl_ms
    try:
        manifest = import_state(
            spark,
            args.spark_checkpoint,
            args.location,
            key=args.key,
            state_schema=args.state_schema,
            operator_id=args.operator_id,
            batch_id=args.batch_id,
            parallelism=args.parallelism,
            watermark_delay_ms=args.watermark_delay_ms,
            storage_options=storage_options,
            checkpoint_key=key,
            **options,
        )
    except (CheckpointError, ValueError, TypeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if owned:
            spark.stop()
    meta = manifest.metadata
    source = meta.get("imported_from", {})
    records = sum(int(t.get("records", 0)) for t in manifest.tasks)
    fields = meta.get("state_schema")
    state = f"state ({', '.join(f'{n} {t}' for n, t in fields)}), " if fields else ""
    _print(
        f"imported {records} records (states and timers) of Spark batch {source.get('batch_id')} "
        f"(operator {source.get('operator_id')}, watermark {source.get('spark_watermark_ms')} ms) as version "
        f"{manifest.version} of {args.location}: key {meta.get('key_columns')} ({', '.join(meta.get('key_types', []))}), "
        f"{state}{manifest.max_parallelism} key groups"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
