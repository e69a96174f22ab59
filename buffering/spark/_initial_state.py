"""A processor's initial state at scale: split by operator instance in Spark, read by the tasks.

``run_stream(processor, initial_state=df)`` hands each key's initial rows to
``handleInitialState`` before the first batch of a new checkpoint. The rows are
never collected on the driver (Spark's own benchmark of the feature seeds 10M
keys). Before that batch the driver runs one Spark job over ``df``
(:func:`write_spark_frame`): the JVM computes each row's operator instance with
the expression the stream's rows are routed by (key columns cast to the
stream's types, TIMESTAMPs as epoch microseconds, see ``_instants``),
``repartitionById`` sends it to that partition, and each task streams its
instance's rows into ONE Arrow IPC file in the checkpoint storage,
``initial_state/part-<instance>-<attempt>.arrow``, then yields a report row
(instance, rows, path, SHA-256 of the bytes). The driver collects only those
rows: the task plan carries an :class:`InitialStateFiles`, where each
instance's file is, how many rows it holds and its checksum, never the rows.

An instance without initial rows has no file (its entry is None: Spark runs
no Python for an empty partition of the shuffle, and no report names it); its
task hands ``apply_initial_state`` an empty frame, as before. Files are named
uniquely per task attempt and never renamed: a re-run (a task retry, or a
driver restarted before the first commit, which runs the job again) writes
new files, and only the ones the collected reports name are read. The driver
deletes the other files of ``initial_state/`` (earlier runs', failed
attempts') once its job is done. The files are kept after the first commit: a
re-run of the first batch (a driver that died after the commit but before
Spark's) reads them again. Each task checks the checksum and the row count
before it uses a file.

A pandas ``initial_state`` (already in the driver's memory) is split by the
driver (:func:`write_pandas_frame`) and stored as one pickle per instance,
exactly the rows and dtypes the tasks used to receive; the pickle is read only
after its SHA-256 matched the one the plan (shipped by Spark, not read from
the checkpoint) carries.

The tasks read a file back (:func:`instance_rows`) with pyarrow and convert it
as Spark's ``toPandas()`` did before: dates as ``datetime.date``, maps as
dicts, nanosecond timestamps, TIMESTAMPs restored to naive UTC.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import pickle
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, NamedTuple, Optional, Sequence

import numpy as np
import pandas as pd

from checkpoint import CheckpointCorruptError, CheckpointStorage
from state.keygroups import operator_indexes

from ..local import key_groups_of
from ..processor import check_initial_state
from . import _instants
from ._plan import operator_index_sql, quoted

logger = logging.getLogger("buffering.spark")

#: Where the files live, relative to the checkpoint location.
INITIAL_STATE_DIR = "initial_state"
#: The column the job routes rows by (each row's operator instance).
_INSTANCE_COLUMN = "__opbuffer_initial_instance"
#: The report rows of the job's tasks (the only rows the driver collects).
REPORT_SCHEMA = "instance int, rows long, path string, sha256 string, bytes long"

ARROW, PICKLE = "arrow", "pickle"


class InitialPart(NamedTuple):
    """One operator instance's initial rows: its file, their number, the file's SHA-256 (hex)."""

    path: str
    rows: int
    sha256: str


@dataclass(frozen=True)
class InitialStateFiles:
    """Where a processor's initial state waits for the first batch (what ``TaskPlan.initial_state`` holds)."""

    #: ARROW (the Spark job's Arrow IPC streams) or PICKLE (a pandas frame's parts, written by the driver).
    format: str
    parallelism: int
    max_parallelism: int
    #: Per operator instance: its file, or None when no initial row belongs to it.
    parts: tuple[Optional[InitialPart], ...]
    #: The columns of the initial state (for an instance without rows: an empty frame of them).
    columns: tuple[str, ...]
    #: ARROW: the TIMESTAMP columns, stored as epoch microseconds (restored to naive UTC on reading).
    instant_columns: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts if p is not None)


def check_frame(initial_state: Any, key_columns: Sequence[str]) -> Any:
    """``initial_state`` if it is a static Spark or pandas DataFrame holding the key columns (None stays None)."""
    if initial_state is None:
        return None
    if getattr(initial_state, "isStreaming", False):
        raise ValueError("initial_state must be a static DataFrame, not a streaming one")
    if isinstance(initial_state, pd.DataFrame):
        check_initial_state(initial_state, key_columns)
    else:  # a Spark DataFrame: its columns, without reading a row
        check_initial_state(pd.DataFrame(columns=list(initial_state.columns)), key_columns)
    return initial_state


def first_batch_pending(manifest: Any, storage: CheckpointStorage, batch_offset: int) -> bool:
    """Whether a batch of this query may still run before any committed version: none is committed
    (``manifest`` is None), or only the first one is, which a restarted query re-runs when Spark's
    own checkpoint did not record the batch as done (an imported checkpoint's batches never do)."""
    if manifest is None:
        return True
    return batch_offset == 0 and storage.latest_version(before=manifest.version) is None


def prepare(
    initial_state: Any,
    storage: CheckpointStorage,
    manifest: Any,
    *,
    batch_offset: int,
    key_columns: Sequence[str],
    key_types: Sequence[str],
    stream_key_types: Mapping[str, Any],
    parallelism: int,
    max_parallelism: int,
    location: str,
    storage_options: Mapping[str, Any],
) -> Optional[InitialStateFiles]:
    """The plan's initial state: written into ``storage`` when a first batch may still run, else None."""
    if initial_state is None or not first_batch_pending(manifest, storage, batch_offset):
        return None
    if isinstance(initial_state, pd.DataFrame):
        files = write_pandas_frame(initial_state, storage, key_columns, key_types, parallelism, max_parallelism)
    else:
        files = write_spark_frame(
            initial_state, storage, key_columns, stream_key_types, parallelism, max_parallelism, location, storage_options
        )
    remove_other_files(storage, files)
    return files


# ---------------------------------------------------------------- the driver's side
def instance_column_sql(
    schema: Any, key_columns: Sequence[str], stream_key_types: Mapping[str, Any], parallelism: int, max_parallelism: int
) -> tuple[dict[str, str], str]:
    """The SQL of a row's operator instance over the initial state's ``schema``, as the stream computes it
    for its own rows: ``(helper columns, instance expression)``.

    The stream hashes its key columns as they are, a TIMESTAMP as its epoch microseconds (``_instants``);
    a key column of another type in the initial state is cast to the stream's type first, as the rows
    of that key arrive in the stream.
    """
    fields = {f.name: f.dataType for f in schema.fields}
    helpers: dict[str, str] = {}
    hashed = []
    for i, name in enumerate(key_columns):
        expr, target = quoted(name), stream_key_types.get(name, fields[name])
        if fields[name] != target:
            expr = f"cast({expr} as {target.simpleString()})"
        if target.typeName() == "timestamp":
            expr = f"unix_micros({expr})"
        if expr == quoted(name):
            hashed.append(name)
        else:
            helper = f"__opbuffer_initial_key{i}"
            helpers[helper] = expr
            hashed.append(helper)
    return helpers, operator_index_sql(hashed, parallelism, max_parallelism)


@dataclass(frozen=True)
class _Target:
    """Where the job's tasks write (pickled into the mapInArrow closure): no credentials but storage_options."""

    location: str
    storage_options: dict[str, Any]
    #: Arrow IPC compression of the files (None: none).
    compression: Optional[str]


def write_spark_frame(
    frame: Any,
    storage: CheckpointStorage,
    key_columns: Sequence[str],
    stream_key_types: Mapping[str, Any],
    parallelism: int,
    max_parallelism: int,
    location: str,
    storage_options: Mapping[str, Any],
) -> InitialStateFiles:
    """One Spark job: each initial row routed to its instance's partition, each partition's rows into one
    file by its task; the driver collects one report row per instance that has rows."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    started = time.perf_counter()
    instants = _instants.instant_columns(frame.schema)
    columns = tuple(frame.columns)
    helpers, instance = instance_column_sql(frame.schema, key_columns, stream_key_types, parallelism, max_parallelism)
    routed = frame.withColumns({name: F.expr(sql) for name, sql in helpers.items()}) if helpers else frame
    routed = routed.withColumn(_INSTANCE_COLUMN, F.expr(instance))
    if helpers:
        routed = routed.drop(*helpers)
    routed = _instants.as_micros(routed, instants).repartitionById(parallelism, _INSTANCE_COLUMN)
    compression = "zstd" if pa.Codec.is_available("zstd") else None
    target = _Target(location, dict(storage_options), compression)
    reports = routed.mapInArrow(functools.partial(write_partition, target), REPORT_SCHEMA).collect()
    parts: list[Optional[InitialPart]] = [None] * parallelism
    for row in reports:
        index = int(row["instance"])
        if not 0 <= index < parallelism or parts[index] is not None:
            raise RuntimeError(
                f"initial state: a report of instance {index} that is out of 0..{parallelism - 1} or the second one "
                f"(reports: {[(r['instance'], r['path']) for r in reports]})"
            )
        parts[index] = InitialPart(str(row["path"]), int(row["rows"]), str(row["sha256"]))
    files = InitialStateFiles(ARROW, parallelism, max_parallelism, tuple(parts), columns, instants)
    logger.info(
        "initial state: %d rows of %d instances written to %s/%s in %.2fs (%d bytes)",
        files.rows, sum(p is not None for p in parts), storage.location, INITIAL_STATE_DIR,
        time.perf_counter() - started, sum(int(r["bytes"]) for r in reports),
    )
    return files


def write_pandas_frame(
    frame: pd.DataFrame,
    storage: CheckpointStorage,
    key_columns: Sequence[str],
    key_types: Sequence[str],
    parallelism: int,
    max_parallelism: int,
) -> InitialStateFiles:
    """A pandas initial state (in the driver's memory already), split by instance and written by the driver."""
    parts: list[Optional[InitialPart]] = [None] * parallelism
    if len(frame):
        groups = key_groups_of(frame, list(key_columns), list(key_types), max_parallelism)
        owners = operator_indexes(groups, parallelism, max_parallelism)
        for index in np.unique(owners).tolist():
            rows = frame.loc[owners == index].reset_index(drop=True)
            data = pickle.dumps(rows, protocol=5)
            path = _new_path(int(index), PICKLE)
            with storage.open_new_file(path) as f:
                f.write(data)
            parts[int(index)] = InitialPart(path, len(rows), hashlib.sha256(data).hexdigest())
    return InitialStateFiles(PICKLE, parallelism, max_parallelism, tuple(parts), tuple(frame.columns))


def remove_other_files(storage: CheckpointStorage, files: InitialStateFiles) -> None:
    """Delete the files of ``initial_state/`` that ``files`` does not name (earlier runs', failed attempts')."""
    keep = {p.path for p in files.parts if p is not None}
    for path in storage.files_in(INITIAL_STATE_DIR):
        if path not in keep:
            storage.delete(path)


def _new_path(instance: int, kind: str) -> str:
    return f"{INITIAL_STATE_DIR}/part-{instance:05d}-{uuid.uuid4().hex[:16]}.{kind}"


class _HashingWriter:
    """A write-only file that passes bytes on to ``raw`` and hashes and counts them (pyarrow writes to it)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.hash = hashlib.sha256()
        self.bytes = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.hash.update(view)
        self.raw.write(view)
        self.bytes += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self.raw.flush()

    def tell(self) -> int:
        return self.bytes

    def writable(self) -> bool:
        return True

    def close(self) -> None:  # the storage's context manager closes (and syncs) ``raw``
        self.closed = True


def write_partition(target: _Target, batches: Iterator[Any]) -> Iterator[Any]:
    """The job's task (mapInArrow): this partition's rows, one Arrow IPC stream per instance, then the reports.

    ``repartitionById`` puts exactly one instance's rows in a partition; the
    rows are split by their instance column all the same, so a partition that
    held two instances would write a file for each. A report row is yielded
    only once every file of the task is complete.
    """
    import contextlib

    import pyarrow as pa
    import pyarrow.compute as pc

    storage = CheckpointStorage.of(target.location, storage_options=target.storage_options, create=False)
    options = pa.ipc.IpcWriteOptions(compression=target.compression)
    open_files: dict[int, tuple[str, _HashingWriter, Any, list[int]]] = {}
    with contextlib.ExitStack() as stack:

        def writer_for(index: int, schema: Any) -> tuple[str, _HashingWriter, Any, list[int]]:
            if index not in open_files:
                path = _new_path(index, ARROW)
                sink = _HashingWriter(stack.enter_context(storage.open_new_file(path)))
                open_files[index] = (path, sink, pa.ipc.new_stream(sink, schema, options=options), [0])
            return open_files[index]

        for batch in batches:
            if not batch.num_rows:
                continue
            position = batch.schema.get_field_index(_INSTANCE_COLUMN)
            ops = batch.column(position)
            data = batch.remove_column(position)
            first, last = ops[0].as_py(), ops[len(ops) - 1].as_py()
            if first == last and pc.all(pc.equal(ops, first)).as_py():
                pieces = [(int(first), data)]
            else:
                pieces = [(int(v), data.filter(pc.equal(ops, v))) for v in pc.unique(ops).to_pylist()]
            for index, piece in pieces:
                _, _, writer, rows = writer_for(index, piece.schema)
                writer.write_batch(piece)
                rows[0] += piece.num_rows
        for _, _, writer, _ in open_files.values():
            writer.close()
    # The files are closed (local: synced) here: only now may a report name them.
    if open_files:
        indexes = sorted(open_files)
        yield pa.RecordBatch.from_pydict(
            {
                "instance": pa.array(indexes, pa.int32()),
                "rows": pa.array([open_files[i][3][0] for i in indexes], pa.int64()),
                "path": pa.array([open_files[i][0] for i in indexes], pa.string()),
                "sha256": pa.array([open_files[i][1].hash.hexdigest() for i in indexes], pa.string()),
                "bytes": pa.array([open_files[i][1].bytes for i in indexes], pa.int64()),
            }
        )


# ---------------------------------------------------------------- the tasks' side
def instance_rows(storage: CheckpointStorage, files: InitialStateFiles, index: int, parallelism: int) -> pd.DataFrame:
    """Operator instance ``index``'s initial rows, as a pandas frame (empty, with the columns, when it has none)."""
    if files.parallelism != parallelism:
        raise RuntimeError(
            f"the initial state was split for {files.parallelism} operator instances, the batch runs {parallelism}"
        )
    part = files.parts[index]
    if part is None:
        return pd.DataFrame({name: pd.Series([], dtype=object) for name in files.columns})
    data = storage.read_small_file(part.path)
    if data is None:
        raise CheckpointCorruptError(
            f"initial state file {part.path!r} of instance {index} is missing from {storage!r}", file=part.path
        )
    if hashlib.sha256(data).hexdigest() != part.sha256:
        raise CheckpointCorruptError(
            f"initial state file {part.path!r} of instance {index} in {storage!r} is not the file its writer "
            "reported (its SHA-256 differs)",
            file=part.path,
        )
    if files.format == PICKLE:
        frame = pickle.loads(data)
    else:
        frame = _arrow_frame(data, files.columns)
        frame = _instants.restore(frame, files.instant_columns)
    if len(frame) != part.rows:
        raise CheckpointCorruptError(
            f"initial state file {part.path!r} of instance {index} holds {len(frame)} rows, its writer wrote {part.rows}",
            file=part.path,
        )
    return frame


def _arrow_frame(data: bytes, columns: Sequence[str]) -> pd.DataFrame:
    """An Arrow IPC stream's rows as pandas, converted as Spark's ``toPandas()`` converts them."""
    import pyarrow as pa

    table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    frame = table.to_pandas(date_as_object=True, coerce_temporal_nanoseconds=True, maps_as_pydicts="strict")
    if list(frame.columns) != list(columns):  # duplicate or odd names: keep the initial state's own
        frame.columns = list(columns)
    return frame
