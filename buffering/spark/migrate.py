"""Moving a live job's state in and out: a Spark query's checkpoint <-> opbuffer's.

* :func:`import_state` reads the state of an ``applyInPandasWithState`` or
  ``transformWithStateInPandas`` query from its Spark checkpoint with Spark's
  state data source (``format("statestore")``)
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
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional, Sequence

from checkpoint import CheckpointStorage, Manifest, TaskReport, commit
from checkpoint.export import STATE_SCHEMA_FIELD, state_rows
from state.group_state import NO_TIMESTAMP, GroupStateTimeout
from state.keygroups import DEFAULT_MAX_PARALLELISM, check_max_parallelism
from state.keys import normalize_key
from state.state_schema import StateSchema, canonical_type_name
from state.ttl import expiry_for

from ..decorators import OperatorSpec, StateConfig
from ..operator import STATE_TABLE, TIMERS_TABLE, OperatorInstance
from ..protocol import commit_metadata
from ._plan import key_types_of, operator_index_sql
from .stream import BATCH_OFFSET_FIELD

#: The metadata field of an imported version that says where it came from.
IMPORTED_FIELD = "imported_from"
#: Spark's names of the operators whose state import_state reads.
APPLY_IN_PANDAS_WITH_STATE = "applyInPandasWithState"
TRANSFORM_WITH_STATE_IN_PANDAS = "transformWithStateInPandasExec"
_OPERATORS = (APPLY_IN_PANDAS_WITH_STATE, TRANSFORM_WITH_STATE_IN_PANDAS)

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
    #: For a processor: (column, state variable name) of each variable's column.
    variables: tuple[tuple[str, str], ...] = ()
    #: The import's processing time (chosen once, on the driver): TTLs start from it.
    processing_time_ms: int = 0
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
        if instance.processor is not None:
            # Through the handle API, as the processor writes: each variable's table and layout.
            instance.processor.set_times(settings.processing_time_ms, NO_TIMESTAMP)  # TTLs run from the import
            for batch in batches:
                _write_processor_rows(settings, instance, batch)
            report = instance.checkpoint(settings.version, None)
            yield pa.RecordBatch.from_pydict({_REPORT: [json.dumps(report.to_dict())]})
            return
        # Straight into the working RocksDB tables, not through the cache: the state of a
        # partition need not fit in memory. The timers' in-memory index is rebuilt on restore.
        states = instance.tables[STATE_TABLE]
        timers = instance.tables[TIMERS_TABLE]
        n_keys = len(settings.key_columns)
        for batch in batches:
            # Maps as dicts (Arrow's default is a list of pairs): the state schema reads them as Spark hands them.
            columns = [batch.column(i).to_pylist(maps_as_pydicts="strict") for i in range(batch.num_columns)]
            keys = [normalize_key(k) for k in zip(*columns[:n_keys])]
            values = columns[n_keys : n_keys + settings.state_fields]
            timeouts = columns[-1]
            present = columns[n_keys + settings.state_fields]  # value.groupState is not null
            put = []
            for i, nkey in enumerate(keys):
                if present[i]:
                    value = tuple(_python_value(column[i]) for column in values)
                    # Arrow hands structs as dicts: stored as Spark reads them back (Rows).
                    put.append((nkey, settings.state_schema.convert(value) if settings.state_schema is not None else value))
            if put:
                states.put_many(put)
                if instance.ttl is not None:  # cached_state(ttl_ms=): each key's TTL starts at the import
                    expires_at = expiry_for(settings.processing_time_ms, instance.ttl_ms)  # type: ignore[arg-type]
                    instance.ttl.set_many((nkey, expires_at) for nkey, _ in put)
            due = [(nkey, int(ts)) for nkey, ts in zip(keys, timeouts) if ts is not None and ts != NO_TIMESTAMP]
            if due:
                timers.put_many(due)
        report = instance.checkpoint(settings.version, None)
    finally:
        instance.close()
    yield pa.RecordBatch.from_pydict({_REPORT: [json.dumps(report.to_dict())]})


def _check_key(key: Sequence[str] | str | None, spark_key: list[str]) -> None:
    if key is not None:
        wanted = [key] if isinstance(key, str) else list(key)
        if wanted != spark_key:
            raise ValueError(f"key={wanted!r}, but the Spark query grouped by {spark_key!r}")


def _function_import(
    reader: Any, where: str, operator_id: int, key: Any, state_schema: Any, common: dict[str, Any]
) -> tuple[Any, list[str], list[str], tuple[str, ...], "_ImportSettings", list[tuple[str, str]]]:
    """The rows of an applyInPandasWithState operator's state: key columns, state items, present, timeout."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    frame = reader().load(where)
    fields = {f.name: f.dataType for f in frame.schema.fields}
    value_type = fields.get("value")
    if not isinstance(fields.get("key"), StructType) or not isinstance(value_type, StructType) or "groupState" not in value_type.fieldNames():
        raise ValueError(
            f"the state of operator {operator_id} in {where!r} is not shaped as "
            f"applyInPandasWithState's (key, value.groupState, value.timeoutTimestamp): {frame.schema.simpleString()}"
        )
    key_type: StructType = fields["key"]
    spark_key = key_type.fieldNames()
    _check_key(key, spark_key)
    group_state = value_type["groupState"].dataType
    spark_schema = StateSchema.of(group_state)
    if state_schema is not None:
        given = StateSchema.of(state_schema)
        if [(n, canonical_type_name(t)) for n, t in given.fields] != [(n, canonical_type_name(t)) for n, t in spark_schema.fields]:
            raise ValueError(f"state_schema={state_schema!r}, but Spark stored the state as {group_state.simpleString()}")
    key_types = key_types_of(key_type, spark_key)
    timed = "timeoutTimestamp" in value_type.fieldNames()
    key_aliases = [f"{_KEY_PREFIX}{i}" for i in range(len(spark_key))]
    state_names = group_state.fieldNames()
    columns = [F.col("key").getField(name).alias(alias) for name, alias in zip(spark_key, key_aliases)]
    columns += [F.col("value.groupState").getField(name).alias(f"{_STATE_PREFIX}{i}") for i, name in enumerate(state_names)]
    columns.append(F.col("value.groupState").isNotNull().alias(f"{_STATE_PREFIX}present"))
    columns.append((F.col("value.timeoutTimestamp") if timed else F.lit(NO_TIMESTAMP)).cast("long").alias(_TIMEOUT))
    ttl_ms = common.pop("ttl_ms", None)
    spec = OperatorSpec(function=None, state=StateConfig(ttl_ms=ttl_ms))  # validates ttl_ms
    settings = _ImportSettings(
        key_columns=spark_key, key_types=key_types, state_fields=len(state_names), spec=spec,
        **{"state_schema": spark_schema, **common},
    )
    return frame.select(*columns), spark_key, key_aliases, key_types, settings, list(spark_schema.fields)


#: Spark's state variable types (state-metadata's operatorProperties) and opbuffer's variable kinds.
_VARIABLE_KINDS = {"ValueState": "value", "ListState": "list", "MapState": "map"}
_VARIABLE_COLUMN = "__opbuffer_var"
_TIMER_VARIABLE = "$timers"


def _processor_import(
    reader: Any, where: str, operator: Any, processor: Any, key: Any, common: dict[str, Any]
) -> tuple[Any, list[str], list[str], tuple[str, ...], "_ImportSettings"]:
    """One DataFrame of a transformWithStateInPandas operator's state: a row per value, list, map entry and timer.

    Each row has the key columns, the variable's name (``_VARIABLE_COLUMN``) and the
    variable's own column(s) (``__opbuffer_s{i}``: a value, a whole list, or a map
    entry's key; ``__opbuffer_s{i}v``: the map entry's value); the other variables'
    columns are null.
    """
    from pyspark.sql import functions as F
    from ..decorators import spec_of
    from ..processor import processor_timeout
    from state.group_state import timeout_conf

    props = json.loads(operator["operatorProperties"] or "{}")
    time_mode = str(props.get("timeMode", "None"))
    variables = [(str(v["stateName"]), str(v["stateVariableType"]), bool(v.get("ttlEnabled"))) for v in props.get("stateVariables", [])]
    spec = spec_of(processor)
    if spec.processor is None:
        raise TypeError(f"processor= must be a pyspark StatefulProcessor, got {type(processor).__name__}")
    timeout = timeout_conf(processor_timeout(spec, "none", time_mode, None))
    kinds = {name: kind for name, (kind, _) in _processor_variables(spec).items()}
    frames = []
    spark_key: Optional[list[str]] = None
    key_type = None
    for i, (name, var_type, _ttl) in enumerate(variables):
        if var_type == "TimerState":
            frame = reader().option("readRegisteredTimers", "true").load(where)
            body = [F.col("expiration_timestamp_ms").cast("long").alias(_TIMEOUT)]
            label = _TIMER_VARIABLE
        else:
            kind = _VARIABLE_KINDS.get(var_type)
            if kind is None:
                raise ValueError(f"state variable {name!r} of {where!r} is a {var_type}, which import_state cannot read")
            if kinds.get(name) != kind:
                raise ValueError(
                    f"the Spark query's state variable {name!r} is a {var_type}, but the processor's init() "
                    f"creates {({n: k + ' state' for n, k in kinds.items()})!r}"
                )
            frame = reader().option("stateVarName", name)
            if kind == "list":  # one row per key with its whole list, in order
                frame = frame.option("flattenCollectionTypes", "false")
            frame = frame.load(where)
            names = [f.name for f in frame.schema.fields if f.name not in ("key", "partition_id")]
            if kind == "map":
                body = [F.col("user_map_key").alias(f"{_STATE_PREFIX}{i}"), F.col("user_map_value").alias(f"{_STATE_PREFIX}{i}v")]
            else:
                body = [F.col(names[0]).alias(f"{_STATE_PREFIX}{i}")]
            label = name
        if spark_key is None:
            key_type = frame.schema["key"].dataType
            spark_key = key_type.fieldNames()
        key_aliases = [f"{_KEY_PREFIX}{j}" for j in range(len(spark_key))]
        keys = [F.col("key").getField(n).alias(a) for n, a in zip(spark_key, key_aliases)]
        frames.append(frame.select(*keys, F.lit(label).alias(_VARIABLE_COLUMN), *body))
    if not frames or spark_key is None:
        raise ValueError(f"operator {operator['operatorId']} of {where!r} has no state variables to import")
    _check_key(key, spark_key)
    missing = sorted(set(kinds) - {name for name, _, _ in variables})
    if missing:
        raise ValueError(f"the processor's state variables {missing} are not in the Spark query's state {[v[0] for v in variables]}")
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame, allowMissingColumns=True)
    # A fixed column order, whatever the union made of it: keys, variable, then by name.
    key_aliases = [f"{_KEY_PREFIX}{j}" for j in range(len(spark_key))]
    rest = sorted(c for c in union.columns if c not in key_aliases and c != _VARIABLE_COLUMN)
    union = union.select(*key_aliases, _VARIABLE_COLUMN, *rest)
    key_types = key_types_of(key_type, spark_key)
    settings = _ImportSettings(
        key_columns=spark_key,
        key_types=key_types,
        state_fields=0,
        spec=spec,
        timeout_conf=timeout,
        variables=tuple((f"{_STATE_PREFIX}{i}", name) for i, (name, var_type, _) in enumerate(variables) if var_type != "TimerState"),
        **common,
    )
    return union, spark_key, key_aliases, key_types, settings


def _processor_variables(spec: OperatorSpec) -> dict[str, tuple[str, tuple[StateSchema, ...]]]:
    """The state variables the processor's ``init()`` creates: kind ("value", "list", "map") and schemas, by name.

    Learned by calling ``init`` of a copy of the processor with a handle that
    only records what is asked of it.
    """
    from pyspark.sql.streaming.stateful_processor import StatefulProcessorHandle

    found: dict[str, tuple[str, tuple[StateSchema, ...]]] = {}

    class _Recorder(StatefulProcessorHandle):
        def __init__(self) -> None:  # no state server behind it
            pass

        def getValueState(self, stateName: str, schema: Any, ttlDurationMs: Optional[int] = None) -> Any:
            found[stateName] = ("value", (StateSchema.of(schema),))

        def getListState(self, stateName: str, schema: Any, ttlDurationMs: Optional[int] = None) -> Any:
            found[stateName] = ("list", (StateSchema.of(schema),))

        def getMapState(self, stateName: str, userKeySchema: Any, valueSchema: Any, ttlDurationMs: Optional[int] = None) -> Any:
            found[stateName] = ("map", (StateSchema.of(userKeySchema), StateSchema.of(valueSchema)))

        def registerTimer(self, expiryTimestampMs: int) -> None:
            pass

        def deleteTimer(self, expiryTimestampMs: int) -> None:
            pass

        def listTimers(self) -> Iterator[int]:
            return iter(())

        def deleteIfExists(self, stateName: str) -> None:
            pass

    import copy

    copy.deepcopy(spec.processor).init(_Recorder())
    return found


def _write_processor_rows(settings: "_ImportSettings", instance: OperatorInstance, batch: Any) -> None:
    """Put one Arrow batch of :func:`_processor_import` rows through the processor's handle API."""
    runtime = instance.processor
    assert runtime is not None
    names = batch.schema.names
    n_keys = len(settings.key_columns)
    data = {name: batch.column(i).to_pylist() for i, name in enumerate(names)}
    keys = [normalize_key(k) for k in zip(*(data[names[j]] for j in range(n_keys)))]
    columns = dict(settings.variables)  # variable name by its column
    by_name = {name: column for column, name in settings.variables}
    for row, nkey in enumerate(keys):
        label = data[_VARIABLE_COLUMN][row]
        if label == _TIMER_VARIABLE:
            runtime.timers.register(nkey, int(data[_TIMEOUT][row]))
            continue
        column = by_name[label]
        variable = runtime.variables[columns[column]]
        runtime.set_key(nkey)
        value = data[column][row]
        if variable.kind == "value":
            variable.update(_row_tuple(value))
        elif variable.kind == "list":
            variable.put([_row_tuple(v) for v in value or []])
        else:
            variable.updateValue(_row_tuple(value), _row_tuple(data[column + "v"][row]))


def _row_tuple(value: Any) -> tuple:
    """A struct read through Arrow (a dict) as the tuple the processor saw under Spark."""
    return tuple(_python_value(v) for v in value.values()) if isinstance(value, dict) else tuple(value)


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
    if row["operatorName"] not in _OPERATORS:
        raise ValueError(
            f"operator {operator_id} of {spark_checkpoint_location!r} is {row['operatorName']!r}; import_state "
            f"reads the state of {' or '.join(map(repr, _OPERATORS))} (give operator_id= of such an operator)"
        )
    return row


def import_state(
    spark: Any,
    spark_checkpoint_location: str,
    checkpoint_location: Any,
    *,
    key: Sequence[str] | str | None = None,
    state_schema: Any = None,
    processor: Any = None,
    ttl_ms: Optional[int] = None,
    operator_id: int = 0,
    batch_id: Optional[int] = None,
    parallelism: Optional[int] = None,
    max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    watermark_delay_ms: int = 0,
    storage_options: Optional[Mapping[str, Any]] = None,
    checkpoint_key: str | bytes | None = None,
    workdir: Optional[str] = None,
) -> Manifest:
    """Write the state of a stopped Spark query as version 0 of a new opbuffer checkpoint.

    Reads Spark's checkpoint with the state data source (``spark.read.format("statestore")``).
    Of an ``applyInPandasWithState`` operator: each key's state (the tuple the function
    gave ``state.update``, as it read it back under Spark) and its GroupState timeout,
    which becomes the key's timer. Of a ``transformWithStateInPandas`` operator
    (``processor=``): every state variable Spark's state metadata lists (each
    ValueState value, each ListState list whole and in order, each MapState entry)
    and every registered timer, written through the processor's own handle
    (``update``, ``put``, ``updateValue``, ``registerTimer``) on the operator
    instances; a variable with a TTL starts its TTL at the import. The
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
            :func:`export_state` needs none for it. (applyInPandasWithState only.)
        processor: for a transformWithStateInPandas query: the ``StatefulProcessor`` the
            job runs (decorated with ``cached_state`` or not). Its ``init()`` must create
            the variables Spark's state holds, of the same kinds.
        ttl_ms: for an applyInPandasWithState query whose function will run with
            ``cached_state(ttl_ms=...)``: the same TTL, so that each imported key expires
            ``ttl_ms`` after the import unless updated (without it, a key never updated
            again would never expire). A processor's variables take their TTLs from it.
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
    offending value when the Spark checkpoint has no such operator, the operator is
    neither applyInPandasWithState nor transformWithStateInPandas, ``key``,
    ``state_schema`` or the processor's variables differ from Spark's, a processor's
    state comes without ``processor=``, or ``checkpoint_location`` already holds versions.
    """
    from pyspark.sql import functions as F

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
    def reader() -> Any:
        # A new reader each time: a DataFrameReader's option() changes the reader itself.
        return spark.read.format("statestore").option("operatorId", operator_id).option("batchId", batch_id)

    if ttl_ms is not None and processor is not None:
        raise ValueError(f"ttl_ms={ttl_ms!r} is for a function's state; a processor's variables have their own TTLs")
    common = dict(
        processing_time_ms=int(time.time() * 1000),
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        version=0,
        location=location,
        storage_options=dict(storage_options or {}),
        checkpoint_key=storage.checkpoint_key,
        workdir=workdir,
    )
    if operator["operatorName"] == TRANSFORM_WITH_STATE_IN_PANDAS:
        if processor is None:
            raise ValueError(
                f"operator {operator_id} of {spark_checkpoint_location!r} is a transformWithStateInPandas "
                "processor's: give processor= (the StatefulProcessor the job runs)"
            )
        flat, spark_key, key_aliases, key_types, settings = _processor_import(
            reader, spark_checkpoint_location, operator, processor, key, common
        )
        schema_fields = None
    else:
        if processor is not None:
            raise ValueError(
                f"processor= is for a transformWithStateInPandas query; operator {operator_id} of "
                f"{spark_checkpoint_location!r} is {operator['operatorName']!r}"
            )
        flat, spark_key, key_aliases, key_types, settings, schema_fields = _function_import(
            reader, spark_checkpoint_location, operator_id, key, state_schema, {**common, "ttl_ms": ttl_ms}
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
            processing_time_ms=int(common["processing_time_ms"]),  # type: ignore[arg-type]
            key_columns=spark_key,
            key_types=key_types,
            parallelism=parallelism,
            # No placement yet: the run_stream that goes on from here chooses it.
            placement=None,
            **{
                # Spark's micro-batch 0 of the new query is version 1.
                BATCH_OFFSET_FIELD: 1,
                **({STATE_SCHEMA_FIELD: [list(f) for f in schema_fields]} if schema_fields else {}),
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


#: The name of the timers in :func:`processor_state_frames`' answer (Spark's own start with "$" too).
TIMERS_EXPORT = "$timers"
#: Its column of each timer's expiry (epoch ms), as Spark's state reader names it.
EXPIRY_COLUMN = "expiration_timestamp_ms"


def _processor_columns(key_columns: list[str], kind: str, schemas: tuple[StateSchema, ...], name: str) -> list[str]:
    columns = list(key_columns) + [field for schema in schemas for field, _ in schema.fields]
    if len(set(columns)) != len(columns):
        raise ValueError(f"state variable {name!r}: its fields {columns[len(key_columns):]} repeat a key column or each other")
    return columns


def processor_state_frames(
    checkpoint_location: Any,
    processor: Any,
    version: Optional[int] = None,
    *,
    storage_options: Optional[Mapping[str, Any]] = None,
    checkpoint_key: str | bytes | None = None,
) -> dict[str, Any]:
    """A processor's state in an opbuffer checkpoint as pandas DataFrames: one per state variable, and the timers.

    By variable name: a ValueState gives one row per key (key columns, then the
    value's fields), a ListState one row per element in list order (key columns,
    element fields), a MapState one row per entry (key columns, user key fields,
    value fields); :data:`TIMERS_EXPORT` gives the timers (key columns,
    :data:`EXPIRY_COLUMN`). Column names come from the schemas the processor's
    ``init()`` gives its handle. What TTL has expired by now is left out. The
    state is read in this process (the version restored into a temporary RocksDB).
    """
    import pandas as pd

    from ..decorators import spec_of

    spec = spec_of(processor)
    if spec.processor is None:
        raise TypeError(f"processor must be a pyspark StatefulProcessor, got {type(processor).__name__}")
    variables = _processor_variables(spec)
    location = checkpoint_location if isinstance(checkpoint_location, str) else os.fspath(checkpoint_location)
    storage = CheckpointStorage.of(
        location, storage_options=dict(storage_options or {}), create=False, checkpoint_key=checkpoint_key
    )
    manifest = storage.read_manifest(version)
    meta = manifest.metadata
    key_columns = [str(c) for c in meta.get("key_columns") or []]
    if not key_columns:
        raise ValueError(f"version {manifest.version} of {location!r} does not record its key columns")
    settings = _ImportSettings(
        key_columns=key_columns,
        key_types=tuple(meta.get("key_types") or ()) or None,  # type: ignore[arg-type]
        state_fields=0,
        parallelism=1,
        max_parallelism=manifest.max_parallelism,
        version=manifest.version,
        location=location,
        storage_options={},
        checkpoint_key=None,
        workdir=None,
        spec=spec,
    )
    n = len(key_columns)
    out: dict[str, pd.DataFrame] = {}
    instance = OperatorInstance.for_runner(settings, 0, storage=storage, manager=None)
    try:
        instance.restore(manifest)
        runtime = instance.processor
        assert runtime is not None
        runtime.set_times(int(time.time() * 1000), NO_TIMESTAMP)  # TTL: what expired by now is gone
        for name, (kind, schemas) in variables.items():
            variable = runtime.variables[name]
            groups = list(dict.fromkeys(tuple(k)[:n] for k, _ in variable.table.items()))  # keys come as tuples
            rows: list[tuple] = []
            for group in groups:
                runtime.set_key(normalize_key(group))
                if kind == "value":
                    value = variable.get()
                    if value is not None:
                        rows.append(group + tuple(value))
                elif kind == "list":
                    rows.extend(group + tuple(element) for element in variable.get())
                else:
                    rows.extend(group + tuple(k) + tuple(v) for k, v in variable.iterator())
            out[name] = _frame_of(_processor_columns(key_columns, kind, schemas, name), rows)
        timers = [tuple(k) for k, _ in runtime.timers.table.items()]
        out[TIMERS_EXPORT] = _frame_of(key_columns + [EXPIRY_COLUMN], [t[:n] + (int(t[n]),) for t in timers])
    finally:
        instance.close()
    return out


def _frame_of(columns: list[str], rows: list[tuple]) -> Any:
    """A pandas DataFrame of ``rows``; a column holding a null keeps Python objects (None, not NaN)."""
    import pandas as pd

    values = list(zip(*rows)) if rows else [() for _ in columns]
    frame = pd.DataFrame({c: list(v) for c, v in zip(columns, values)}, columns=columns)
    for column, value in zip(columns, values):
        if any(v is None for v in value):
            frame[column] = pd.Series(list(value), dtype=object)
    return frame


def export_state(
    spark: Any,
    checkpoint_location: Any,
    version: Optional[int] = None,
    *,
    state_schema: Any = None,
    timeout_column: Optional[str] = None,
    processor: Any = None,
    storage_options: Optional[Mapping[str, Any]] = None,
    checkpoint_key: str | bytes | None = None,
) -> Any:
    """An opbuffer checkpoint's state as a Spark DataFrame: one row per key, key columns then state fields.

    With ``processor=`` (a transformWithStateInPandas processor's checkpoint): a dict of
    Spark DataFrames, one per state variable and the timers, as
    :func:`processor_state_frames` describes.

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

    if processor is not None:
        return _processor_dataframes(spark, checkpoint_location, processor, version, storage_options, checkpoint_key)
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


def _processor_dataframes(
    spark: Any,
    location: Any,
    processor: Any,
    version: Optional[int],
    storage_options: Optional[Mapping[str, Any]],
    checkpoint_key: str | bytes | None,
) -> dict[str, Any]:
    from pyspark.sql.types import StructType

    from ..decorators import spec_of

    frames = processor_state_frames(
        location, processor, version, storage_options=storage_options, checkpoint_key=checkpoint_key
    )
    storage = CheckpointStorage.of(
        location if isinstance(location, str) else os.fspath(location),
        storage_options=dict(storage_options or {}),
        create=False,
        checkpoint_key=checkpoint_key,
    )
    meta = storage.read_manifest(version).metadata
    keys = ", ".join(f"`{c}` {t}" for c, t in zip(meta["key_columns"], meta["key_types"]))
    out = {}
    variables = _processor_variables(spec_of(processor))
    for name, frame in frames.items():
        if name == TIMERS_EXPORT:
            fields = f"`{EXPIRY_COLUMN}` long"
        else:
            fields = ", ".join(f"`{f}` {t}" for schema in variables[name][1] for f, t in schema.fields)
        rows = list(frame.itertuples(index=False, name=None))
        out[name] = spark.createDataFrame(rows, StructType.fromDDL(f"{keys}, {fields}"))
    return out


__all__ = ["export_state", "import_state", "processor_state_frames"]
