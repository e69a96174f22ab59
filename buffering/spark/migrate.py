"""Moving a live job's state in and out: Spark's ``applyInPandasWithState`` checkpoint <-> opbuffer's.

* :func:`import_state` reads the state of an ``applyInPandasWithState`` query from
  its Spark checkpoint with Spark's state data source (``format("statestore")``)
  and writes it as a version of an opbuffer checkpoint, the way run_stream's
  tasks write theirs (one task file per operator instance, written by Spark
  tasks, then a manifest committed by the driver). ``run_stream`` (with a new
  Spark checkpoint) and ``LocalRunner`` then go on from it.
* :func:`export_state` gives an opbuffer checkpoint's state as a Spark DataFrame
  with one row per key (key columns, then the state's fields): what a job groups
  by its key for ``transformWithStateInPandas(initialState=...)``.

Only public Spark APIs (no ``_jvm``/``sparkContext``), so both run under Spark Connect.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional, Sequence

from checkpoint import CheckpointStorage, Manifest, TaskReport, commit
from checkpoint.export import STATE_SCHEMA_FIELD, state_rows
from state.group_state import NO_TIMESTAMP, GroupStateTimeout
from state.keygroups import DEFAULT_MAX_PARALLELISM, check_max_parallelism
from state.keys import normalize_key
from state.state_schema import StateSchema

from ..decorators import OperatorSpec
from ..operator import STATE_TABLE, TIMERS_TABLE, OperatorInstance
from ..protocol import commit_metadata
from ._plan import key_types_of, operator_index_sql
from .stream import BATCH_OFFSET_FIELD

#: The metadata field of an imported version that says where it came from.
IMPORTED_FIELD = "imported_from"
#: Spark's name of the operator whose state import_state reads.
APPLY_IN_PANDAS_WITH_STATE = "applyInPandasWithState"

_KEY_PREFIX = "__opbuffer_k"
_STATE_PREFIX = "__opbuffer_s"
_TIMEOUT = "__opbuffer_timeout"
_REPORT = "report"


@dataclass(frozen=True)
class _ImportSettings:
    """What every import task needs (pickled into the mapInArrow closure); a RunnerSettings for OperatorInstance."""

    key_columns: list[str]
    key_types: tuple[str, ...]
    state_fields: int
    parallelism: int
    max_parallelism: int
    version: int
    location: str
    storage_options: dict[str, Any] = field(repr=False)
    checkpoint_key: Optional[bytes] = field(repr=False)
    workdir: Optional[str]
    #: Spark's stateStructType of the state; what a state reads back as, as under Spark.
    state_schema: Optional[StateSchema] = None
    spec: OperatorSpec = field(default_factory=lambda: OperatorSpec(function=None))
    timeout_conf: str = GroupStateTimeout.NoTimeout
    event_time: Optional[str] = None


def _python_value(value: Any) -> Any:
    """A state item as the user's function saw it under Spark (a timestamp: a naive local datetime)."""
    if isinstance(value, _dt.datetime) and value.tzinfo is not None:
        # Spark's TimestampType.fromInternal: local wall time without a zone.
        return value.astimezone().replace(tzinfo=None)
    return value


def _write_instances(settings: _ImportSettings, batches: Iterator[Any]) -> Iterator[Any]:
    """One import task: put its rows' state and timeouts in operator instance ``partitionId()``, checkpoint it.

    Yields one row: the instance's TaskReport as JSON, which the driver commits.
    """
    import pyarrow as pa
    from pyspark import TaskContext

    task = TaskContext.get()
    index = task.partitionId() if task is not None else 0
    storage = CheckpointStorage.of(
        settings.location, storage_options=settings.storage_options, checkpoint_key=settings.checkpoint_key
    )
    workdir = None
    if settings.workdir is not None:
        workdir = os.path.join(settings.workdir, f"import-{index}-of-{settings.parallelism}-{os.getpid()}")
    instance = OperatorInstance.for_runner(settings, index, storage=storage, manager=None, workdir=workdir)
    try:
        # Straight into the working RocksDB tables, not through the cache: the state of a
        # partition need not fit in memory. The timers' in-memory index is rebuilt on restore.
        states = instance.tables[STATE_TABLE]
        timers = instance.tables[TIMERS_TABLE]
        n_keys = len(settings.key_columns)
        for batch in batches:
            columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
            keys = [normalize_key(k) for k in zip(*columns[:n_keys])]
            values = columns[n_keys : n_keys + settings.state_fields]
            timeouts = columns[-1]
            present = columns[n_keys + settings.state_fields]  # value.groupState is not null
            put = []
            for i, nkey in enumerate(keys):
                if present[i]:
                    put.append((nkey, tuple(_python_value(column[i]) for column in values)))
            if put:
                states.put_many(put)
            due = [(nkey, int(ts)) for nkey, ts in zip(keys, timeouts) if ts is not None and ts != NO_TIMESTAMP]
            if due:
                timers.put_many(due)
        report = instance.checkpoint(settings.version, None)
    finally:
        instance.close()
    yield pa.RecordBatch.from_pydict({_REPORT: [json.dumps(report.to_dict())]})


def _read_spark_watermark(spark: Any, spark_checkpoint_location: str, batch_id: int) -> int:
    """``nextBatchWatermarkMs`` of Spark's commit log entry ``batch_id``: the watermark of the batch after it."""
    path = spark_checkpoint_location.rstrip("/") + f"/commits/{batch_id}"
    try:
        lines = [row[0] for row in spark.read.text(path).collect()]
    except Exception as exc:  # noqa: BLE001 - Spark raises its own AnalysisException types
        raise ValueError(f"cannot read Spark's commit log entry {path!r}: {exc}") from exc
    for line in lines[1:]:  # the first line is the log's format version ("v1")
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            return int(entry.get("nextBatchWatermarkMs", 0))
    raise ValueError(f"Spark's commit log entry {path!r} holds no watermark: {lines!r:.200}")


def _operator(spark: Any, spark_checkpoint_location: str, operator_id: int) -> Any:
    """The row of Spark's state metadata (``format("state-metadata")``) for ``operator_id``."""
    try:
        rows = spark.read.format("state-metadata").load(spark_checkpoint_location).collect()
    except Exception as exc:  # noqa: BLE001
        raise ValueError(
            f"{spark_checkpoint_location!r} is not the checkpoint of a stateful Spark query "
            f"(Spark's state metadata cannot be read: {exc})"
        ) from exc
    operators = {int(r["operatorId"]): r for r in rows}
    if not operators:
        raise ValueError(
            f"{spark_checkpoint_location!r} holds no state of a stateful Spark query (Spark's state metadata "
            "lists no operator): give the checkpointLocation of the applyInPandasWithState query"
        )
    if operator_id not in operators:
        raise ValueError(
            f"the Spark checkpoint {spark_checkpoint_location!r} has no stateful operator {operator_id}; it has "
            f"{sorted((i, r['operatorName']) for i, r in operators.items())}"
        )
    row = operators[operator_id]
    if row["operatorName"] != APPLY_IN_PANDAS_WITH_STATE:
        raise ValueError(
            f"operator {operator_id} of {spark_checkpoint_location!r} is {row['operatorName']!r}; import_state "
            f"reads the state of {APPLY_IN_PANDAS_WITH_STATE!r} (give operator_id= of that operator)"
        )
    return row


def import_state(
    spark: Any,
    spark_checkpoint_location: str,
    checkpoint_location: Any,
    *,
    key: Sequence[str] | str | None = None,
    state_schema: Any = None,
    operator_id: int = 0,
    batch_id: Optional[int] = None,
    parallelism: Optional[int] = None,
    max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    watermark_delay_ms: int = 0,
    storage_options: Optional[Mapping[str, Any]] = None,
    checkpoint_key: str | bytes | None = None,
    workdir: Optional[str] = None,
) -> Manifest:
    """Write the state of a stopped ``applyInPandasWithState`` query as version 0 of a new opbuffer checkpoint.

    Reads Spark's checkpoint with the state data source (``spark.read.format("statestore")``):
    each key's state (the tuple the function gave ``state.update``, as it read it back
    under Spark) and its GroupState timeout, which becomes the key's timer. The
    version is written as run_stream writes a batch: Spark tasks (one per operator
    instance) each write their task file, then this driver commits the manifest
    (signed with ``checkpoint_key``). Then:

    * ``run_stream(df, fn, ..., checkpoint_location=checkpoint_location)`` goes on
      from it with a **new** Spark checkpoint (its default
      ``{checkpoint_location}/_spark``, or another ``spark_checkpoint_location``):
      Spark refuses the old one once its stateful operator is gone
      (STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA). Its micro-batch 0
      commits version 1 (the manifest records ``spark_batch_offset``), and the
      sink is handed the versions as batch ids. Start the new query's source
      where the old one stopped (e.g. Kafka ``startingOffsets``).
    * ``LocalRunner(fn, key=..., checkpoint_location=checkpoint_location)`` goes on
      from it too.

    The event-time watermark goes on from Spark's: the watermark Spark recorded for
    the batch after ``batch_id`` (``nextBatchWatermarkMs`` of its commit log) is
    the new runner's first watermark, given the new runner's ``watermark_delay_ms``.

    Args:
        spark: a SparkSession (classic or Connect) that can read both checkpoints.
        spark_checkpoint_location: the stopped query's ``checkpointLocation``.
        checkpoint_location: the new opbuffer checkpoint (local path or fsspec URL, seen
            by Spark's executors as by this driver); it must hold no version yet.
        key: the grouping columns, to check against Spark's (default: Spark's key names).
        state_schema: the query's state schema (StructType or DDL), to check against the
            one Spark stored (default: Spark's). It is recorded with the version, so
            :func:`export_state` needs none for it.
        operator_id: which stateful operator of the query (Spark's numbering, from 0).
        batch_id: the committed Spark batch whose state to read (default: the latest).
        parallelism: operator instances of the written version (default: the Spark
            operator's partitions, at most ``max_parallelism``); the runners restore
            it at any parallelism.
        max_parallelism: key groups, fixed for the life of the new checkpoint: the runner
            must use the same (default: opbuffer's default).
        watermark_delay_ms: the delay the new runner runs with (its ``watermark_delay_ms``).
        storage_options: fsspec options of a URL ``checkpoint_location`` (the tasks get them too).
        checkpoint_key: sign the manifest with this key (default: ``$OPBUFFER_CHECKPOINT_KEY``).
        workdir: where the tasks' temporary RocksDB stores go (default: the temp dir).

    Returns the committed manifest (version 0). Raises ValueError naming the
    offending value when the Spark checkpoint has no such operator, the operator
    is not applyInPandasWithState, ``key``/``state_schema`` differ from Spark's, or
    ``checkpoint_location`` already holds versions.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    check_max_parallelism(max_parallelism)
    location = checkpoint_location if isinstance(checkpoint_location, str) else os.fspath(checkpoint_location)
    storage = CheckpointStorage.of(location, storage_options=dict(storage_options or {}), checkpoint_key=checkpoint_key)
    if storage.highest_version() is not None:
        raise ValueError(
            f"checkpoint_location {location!r} already holds versions {storage.versions()}: import_state writes "
            "the first version of a new checkpoint"
        )
    operator = _operator(spark, spark_checkpoint_location, operator_id)
    if batch_id is None:
        batch_id = int(operator["maxBatchId"])
    if parallelism is None:
        parallelism = min(int(operator["numPartitions"]), max_parallelism)
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or not 1 <= parallelism <= max_parallelism:
        raise ValueError(f"parallelism must be an int in [1, max_parallelism={max_parallelism}], got {parallelism!r}")
    frame = (
        spark.read.format("statestore")
        .option("operatorId", operator_id)
        .option("batchId", batch_id)
        .load(spark_checkpoint_location)
    )
    fields = {f.name: f.dataType for f in frame.schema.fields}
    value_type = fields.get("value")
    if not isinstance(fields.get("key"), StructType) or not isinstance(value_type, StructType) or "groupState" not in value_type.fieldNames():
        raise ValueError(
            f"the state of operator {operator_id} in {spark_checkpoint_location!r} is not shaped as "
            f"applyInPandasWithState's (key, value.groupState, value.timeoutTimestamp): {frame.schema.simpleString()}"
        )
    key_type: StructType = fields["key"]
    spark_key = key_type.fieldNames()
    if key is not None:
        wanted = [key] if isinstance(key, str) else list(key)
        if wanted != spark_key:
            raise ValueError(f"key={wanted!r}, but the Spark query grouped by {spark_key!r}")
    group_state = value_type["groupState"].dataType
    spark_schema = StateSchema.of(group_state)
    if state_schema is not None:
        given = StateSchema.of(state_schema)
        if [(n, _canonical_type(t)) for n, t in given.fields] != [(n, _canonical_type(t)) for n, t in spark_schema.fields]:
            raise ValueError(f"state_schema={state_schema!r}, but Spark stored the state as {group_state.simpleString()}")
    key_types = key_types_of(key_type, spark_key)
    timed = "timeoutTimestamp" in value_type.fieldNames()
    key_aliases = [f"{_KEY_PREFIX}{i}" for i in range(len(spark_key))]
    state_names = group_state.fieldNames()
    columns = [F.col("key").getField(name).alias(alias) for name, alias in zip(spark_key, key_aliases)]
    columns += [F.col("value.groupState").getField(name).alias(f"{_STATE_PREFIX}{i}") for i, name in enumerate(state_names)]
    columns.append(F.col("value.groupState").isNotNull().alias(f"{_STATE_PREFIX}present"))
    columns.append((F.col("value.timeoutTimestamp") if timed else F.lit(NO_TIMESTAMP)).cast("long").alias(_TIMEOUT))
    flat = frame.select(*columns)
    settings = _ImportSettings(
        key_columns=spark_key,
        key_types=key_types,
        state_fields=len(state_names),
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        version=0,
        location=location,
        storage_options=dict(storage_options or {}),
        checkpoint_key=storage.checkpoint_key,
        workdir=workdir,
    )
    # Each row to the partition of its operator instance, as run_stream routes a batch's rows.
    routed = flat.withColumn("__opbuffer_op", F.expr(operator_index_sql(key_aliases, parallelism, max_parallelism)))
    routed = routed.repartitionById(parallelism, "__opbuffer_op").drop("__opbuffer_op")
    reports_df = routed.mapInArrow(functools.partial(_write_instances, settings), f"{_REPORT} string")
    reports = [TaskReport.from_dict(json.loads(r[0])) for r in reports_df.collect()]
    if len(reports) != parallelism:
        raise RuntimeError(f"expected one report from each of the {parallelism} import tasks, got {len(reports)}")
    watermark = _read_spark_watermark(spark, spark_checkpoint_location, batch_id)
    # run_stream's first watermark is max event time - delay: give it the one Spark would use next.
    max_event = NO_TIMESTAMP if watermark <= 0 else watermark + int(watermark_delay_ms)
    return commit(
        storage,
        0,
        reports,
        metadata=commit_metadata(
            max_event_time_ms=max_event,
            processing_time_ms=int(time.time() * 1000),
            key_columns=spark_key,
            key_types=key_types,
            parallelism=parallelism,
            # No placement yet: the run_stream that goes on from here chooses it.
            placement=None,
            **{
                # Spark's micro-batch 0 of the new query is version 1.
                BATCH_OFFSET_FIELD: 1,
                STATE_SCHEMA_FIELD: [list(f) for f in spark_schema.fields],
                IMPORTED_FIELD: {
                    "spark_checkpoint_location": spark_checkpoint_location,
                    "operator_id": operator_id,
                    "batch_id": batch_id,
                    "spark_watermark_ms": watermark,
                },
            },
        ),
        max_parallelism=max_parallelism,
    )


def _canonical_type(type_name: str) -> str:
    from state.state_schema import _ALIASES

    return _ALIASES.get(type_name, type_name)


def export_state(
    spark: Any,
    checkpoint_location: Any,
    version: Optional[int] = None,
    *,
    state_schema: Any = None,
    timeout_column: Optional[str] = None,
    storage_options: Optional[Mapping[str, Any]] = None,
    checkpoint_key: str | bytes | None = None,
) -> Any:
    """An opbuffer checkpoint's state as a Spark DataFrame: one row per key, key columns then state fields.

    The shape ``transformWithStateInPandas(initialState=...)`` takes once grouped
    by the key (``export_state(...).groupBy(*key)``), so a job can move back to
    Spark's own operators. The rows are read on this driver
    (:func:`checkpoint.export.state_rows`), so the state must fit in its memory.

    Args:
        spark: the SparkSession the DataFrame belongs to.
        checkpoint_location: the opbuffer checkpoint (local path or fsspec URL).
        version: the committed version (default: the latest).
        state_schema: the state's fields (StructType or DDL string, as applyInPandasWithState
            takes it); default: the one an imported version recorded.
        timeout_column: also a long column of this name with each key's timeout (epoch ms).
        storage_options: fsspec options of a URL location.
        checkpoint_key: verify the manifest's signature (default: ``$OPBUFFER_CHECKPOINT_KEY``).
    """
    from pyspark.sql.types import LongType, StructField, StructType

    read = state_rows(
        checkpoint_location,
        version,
        state_schema=state_schema,
        timeout_column=timeout_column,
        storage_options=dict(storage_options) if storage_options else None,
        checkpoint_key=checkpoint_key,
    )
    if len(read.key_types) != len(read.key_columns):
        raise ValueError(f"version {read.version} of {checkpoint_location!r} does not record the key types")
    ddl = ", ".join(f"`{n}` {t}" for n, t in zip(read.key_columns, read.key_types))
    ddl += ", " + ", ".join(f"`{n}` {t}" for n, t in read.state_fields)
    schema = StructType.fromDDL(ddl)
    if timeout_column is not None:
        schema = StructType([*schema.fields, StructField(timeout_column, LongType(), True)])
    return spark.createDataFrame(read.rows, schema)


__all__ = ["export_state", "import_state"]
