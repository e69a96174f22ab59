"""The Spark streaming runner: foreachBatch + repartition by key group + mapInPandas, exactly-once.

Per micro-batch N (DESIGN, "Spark streaming runner"):

1. the driver picks the batch's processing time (recorded, so a re-run of N
   reuses it) and the event-time watermark (from manifest N-1);
2. with a mapping combiner, each input partition pre-aggregates its rows to one
   accumulator per key *before* the shuffle (what relieves a skewed key);
3. the JVM computes each row's operator instance from ``pmod(xxhash64(keys),
   max_parallelism)`` and ``repartitionById`` sends it to that partition;
4. each task restores (or reuses) its instance at the committed version before
   N, processes its rows, fires timers, writes its version-N checkpoint file
   and returns its output rows plus one report row;
5. the driver persists that output once, hands the data rows to the sink with
   N, and only then commits manifest N.

A retry of any task, or a re-run of the whole batch after a driver crash,
starts from the version before N and recomputes the same state and output.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging
import os
import time
import uuid

import xxhash
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

from checkpoint import DEFAULT_RETAIN, CheckpointCorruptError, CheckpointStorage, VersionExistsError, commit
from state.cache import check_memory_budget
from state.state_schema import StateSchema
from state.group_state import NO_TIMESTAMP, GroupStateTimeout, timeout_conf
from state.keygroups import DEFAULT_MAX_PARALLELISM, check_max_parallelism

from ..decorators import check_operator_key, spec_of
from ..operator import folds_raw_rows
from ..processor import processor_timeout
from ..protocol import (
    WATERMARK_FIELD,
    check_checkpoint_fits,
    commit_metadata,
    late_rows_watermark,
    no_data_timeout,
    state_key_columns,
    watermark_for,
)
from ..windows import WINDOW_START, check_runner_settings
from . import _initial_state, _task
from ._sql_combine import sql_exprs, sql_partials
from ._instants import as_micros, instant_columns, micros_column
from ._plan import is_connect, key_list, key_types_of, nullable, operator_index_sql, output_schema_for, quoted
from ._task import (
    ACCUMULATOR_COLUMN,
    EVENT_TIME_COLUMN,
    HEARTBEAT_COLUMN,
    HOST_COLUMN,
    OPERATOR_COLUMN,
    REPORT_COLUMN,
    ROWS_COLUMN,
    BatchContext,
    TaskPlan,
    TaskSummary,
)
from .sinks import ParquetSink, Sink, sink_of

logger = logging.getLogger("buffering.spark")

_TRIGGERS = ("processingTime", "availableNow", "once")

#: Batch metrics a runner keeps in memory (Spark's ``spark.sql.streaming.numRecentProgressUpdates`` default).
RECENT_BATCHES = 100

#: Where a batch's operator tasks run (``run_stream(placement=...)``).
PLACEMENTS = ("executor", "batch")


#: Input rows per key (or window) merged below which run_stream skips Spark SQL's combine before the
#: shuffle for the next batch. Measured on local[2] with the key-group layout: count + HyperLogLog at
#: 8.1 rows per key (benchmarks.spark_e2e (g) against (h) at 100k tweets), the raw rows were faster in 8
#: of 9 runs (by 1-12 %), the combine in one (by 6 %); at 50 rows per key (10k tweets) the combine was
#: faster in 3 of 4 (by 10-19 %); between them, at 18 rows per key (30k tweets) the raw rows were faster
#: in 3 of 3 (by 0.4-10 %), at 25.5 (20k tweets) the combine in 3 of 3 (by 3-15 %). Count + sum per
#: (key, window) (benchmarks.windows (g) against (r), --keys 25000 / 12500, 2026-11-27): at 8 rows per
#: window the raw rows were 11-28 % faster, at 16 4-11 %; at 1.9 (the benchmark's default) 1.19x.
RAW_ROWS_PER_KEY = 16


def _few_rows_per_key(rows_in: int, calls: int) -> bool:
    """Whether a batch that merged ``rows_in`` input rows into ``calls`` keys had fewer than RAW_ROWS_PER_KEY a key."""
    return rows_in < RAW_ROWS_PER_KEY * calls


class _PlanColumns(NamedTuple):
    """The Spark Columns every batch's plan reuses (see StreamRunner._rows_for_python)."""

    #: The columns the Python side reads, TIMESTAMPs as epoch microseconds; None when it reads all.
    select: Optional[list[Any]]
    #: When it reads all: the TIMESTAMPs among them as epoch microseconds, by name.
    converted: dict[str, Any]
    #: A row's operator instance, named OPERATOR_COLUMN.
    operator: Any
    #: Whether the instance is computed after the conversion, in its own step: a key column is a
    #: TIMESTAMP the Python side reads, so the key groups are those of its epoch microseconds.
    operator_after: bool


@dataclass
class BatchMetrics:
    """What one micro-batch did, summed over its tasks (collected from the workers' report rows)."""

    batch_id: int
    rows_in: int = 0
    rows_out: int = 0
    #: Wall time from Spark's call of the query's batch function to the commit: the operator's
    #: tasks, the sink and the commit. Spark's own work on the batch before that call is not in
    #: it: its offset log, and its planning of the batch, which covers the tasks' plan when they
    #: are part of the streaming plan (batch placement without a combine: functions, processors,
    #: ``combine_before_shuffle=False``). The query's progress (``durationMs``) has the whole trigger.
    seconds: float = 0.0
    tasks: int = 0
    flushes: int = 0
    calls: int = 0
    timeouts: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_evictions: int = 0
    cache_syncs: int = 0
    checkpoint_bytes: int = 0
    #: Slowest task's checkpoint write (tasks write in parallel).
    checkpoint_seconds: float = 0.0
    #: Operator tasks' own time (restore, processing, checkpoint): the slowest one and the sum.
    task_seconds_max: float = 0.0
    task_seconds_sum: float = 0.0
    #: Handing the output to the sink (a second Spark job over the persisted output).
    sink_seconds: float = 0.0
    commit_seconds: float = 0.0
    dropped_late_rows: int = 0
    watermark_ms: int = NO_TIMESTAMP
    committed: bool = True
    #: How the batch's rows reached the operator instances: "sql" (Spark SQL's partial aggregation
    #: before the shuffle), "python" (the Python combine) or "none" (as they are).
    combine: str = ""
    #: One dict per operator instance: its counters for this batch, ``instance`` (its index) and
    #: ``start``, how the task got it: "resumed" (the Python worker held it since the previous
    #: batch, warm cache), "adopted" (the working store another Python worker of the same
    #: executor left, cold cache), "restored" (rebuilt from the checkpoint) or "new" (no
    #: committed version yet).
    per_instance: list[dict[str, Any]] = field(default_factory=list)

    @property
    def cache_hit_ratio(self) -> float:
        reads = self.cache_hits + self.cache_misses
        return self.cache_hits / reads if reads else 0.0

    @property
    def rows_per_second(self) -> float:
        return self.rows_in / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "per_instance"}
        out["cache_hit_ratio"] = self.cache_hit_ratio
        out["rows_per_second"] = self.rows_per_second
        return out

    def to_record(self) -> dict[str, Any]:
        """Every field (``per_instance`` too) as JSON-able values: what the checkpoint keeps of a batch."""
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "BatchMetrics":
        """The metrics :meth:`to_record` gave; fields the record lacks keep their defaults, unknown ones are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})


#: Where Spark's ``withWatermark`` records its delay: in the event-time column's metadata.
WATERMARK_DELAY_METADATA = "spark.watermarkDelayMs"

#: The column run_stream adds, watermarked, when the stream has no ``withWatermark`` of its own on the
#: event time (a copy of it as a TIMESTAMP); only the branch that makes Spark run batches without data reads it.
WATERMARK_COLUMN = _task.WATERMARK_COLUMN

#: The grouping column of that branch under a processing-time timeout.
MARKER_COLUMN = "__opbuffer_no_data"


def _watermark_delay_of(schema: Any, column: str) -> Optional[int]:
    """The delay (ms) of the stream's own ``withWatermark`` on ``column``, None when it has none."""
    for f in schema.fields:
        if f.name == column and WATERMARK_DELAY_METADATA in (f.metadata or {}):
            return int(f.metadata[WATERMARK_DELAY_METADATA])
    return None


def stream_watermark(schema: Any, event_time: Optional[str], delay_ms: Optional[int]) -> tuple[Optional[str], int]:
    """The event-time column and watermark delay a stream runs with: given, or read from its ``withWatermark``.

    Spark records ``withWatermark(column, delay)`` in the column's schema
    metadata; a stream watermarked that way needs neither ``event_time=`` nor
    ``watermark_delay_ms=``. A delay given beside a different ``withWatermark``
    delay on the same column is refused (Spark would use the stream's).
    """
    marked = [f.name for f in schema.fields if WATERMARK_DELAY_METADATA in (f.metadata or {})]
    if event_time is None and len(marked) == 1:
        event_time = marked[0]
    if delay_ms is not None and (isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0):
        raise ValueError(f"watermark_delay_ms must be an int >= 0, got {delay_ms!r}")
    stream_delay = _watermark_delay_of(schema, event_time) if event_time is not None else None
    if stream_delay is not None and delay_ms is not None and delay_ms != stream_delay:
        raise ValueError(
            f"watermark_delay_ms={delay_ms} but the stream's withWatermark({event_time!r}, ...) delays by "
            f"{stream_delay} ms: drop watermark_delay_ms (the stream's own watermark is used)"
        )
    return event_time, stream_delay if stream_delay is not None else (delay_ms or 0)


def _parallelism(spark: Any, parallelism: Optional[int], max_parallelism: int) -> int:
    if parallelism is None:
        parallelism = min(int(spark.conf.get("spark.sql.shuffle.partitions")), max_parallelism)
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or not 1 <= parallelism <= max_parallelism:
        raise ValueError(f"parallelism must be an int in [1, max_parallelism={max_parallelism}], got {parallelism!r}")
    return parallelism


class StreamRunner:
    """The foreachBatch function behind :func:`run_stream` (call it as ``runner(batch_df, batch_id)``).

    Holds the plan shipped to the tasks and the metrics of every batch it ran.
    """

    def __init__(
        self,
        fn: Any,
        *,
        input_schema: Any,
        key: Sequence[str] | str,
        output_schema: Any = None,
        checkpoint_location: Any,
        sink: Any,
        parallelism: int,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        timeout: str = "none",
        event_time: Optional[str] = None,
        watermark_delay_ms: Optional[int] = None,
        combine_before_shuffle: Optional[bool] = None,
        retain: Optional[int] = DEFAULT_RETAIN,
        storage_options: Optional[Mapping[str, Any]] = None,
        workdir: Optional[str] = None,
        on_batch: Optional[Callable[[BatchMetrics], None]] = None,
        start_version: Optional[int] = None,
        checkpoint_key: str | bytes | None = None,
        memory_budget: Optional[int] = None,
        state_schema: Any = None,
        placement: Optional[str] = None,
        new_placement: str = "batch",
        time_mode: Optional[str] = None,
        initial_state: Any = None,
    ) -> None:
        for name, value in (("placement", placement), ("new_placement", new_placement)):
            if value is not None and value not in PLACEMENTS:
                raise ValueError(f"{name} must be one of {list(PLACEMENTS)}, got {value!r}")
        self.spec = spec_of(fn)
        self.memory_budget = check_memory_budget(memory_budget)
        if self.spec.function is None and self.spec.aggregations is None and self.spec.processor is None:
            raise TypeError(f"{fn!r} has nothing to run")
        timeout = processor_timeout(self.spec, timeout, time_mode, initial_state)
        initial_frame = _initial_state_frame(initial_state, key_list(key))
        self.key_columns = key_list(key)
        check_operator_key(fn, self.key_columns)
        self.key_types = key_types_of(input_schema, self.key_columns)
        check_max_parallelism(max_parallelism)
        self.max_parallelism = max_parallelism
        self.parallelism = parallelism
        if checkpoint_location is None:
            raise ValueError("checkpoint_location is required: exactly-once state lives there")
        self.storage = CheckpointStorage.of(
            checkpoint_location, storage_options=dict(storage_options or {}), checkpoint_key=checkpoint_key
        )
        manifest = self.storage.start(start_version)
        # A checkpoint keeps the placement it was started with: Spark's own checkpoint holds that plan.
        stored = manifest.metadata.get("placement", "batch") if manifest is not None else None
        if placement is not None and stored is not None and placement != stored:
            raise ValueError(
                f"checkpoint {self.storage!r} was written with placement={stored!r}, not {placement!r}: "
                "Spark's own checkpoint holds the plan of the first run (restart with the same placement)"
            )
        self.placement: str = placement or stored or new_placement
        #: Spark's micro-batch ``b`` commits version ``b + batch_offset``: 0, unless the checkpoint
        #: was imported (``buffering.spark.import_state``), whose versions come before the first
        #: batch of the new Spark checkpoint. Every commit records it, so restarts keep it.
        self.batch_offset = int(manifest.metadata.get(BATCH_OFFSET_FIELD, 0)) if manifest is not None else 0
        self.timeout_conf = timeout_conf(timeout)
        fields = [f.name for f in input_schema.fields]
        if REPORT_COLUMN in fields:  # it marks a batch that holds the tasks' rows (see __call__)
            raise ValueError(f"the DataFrame may not have a column of the reserved name {REPORT_COLUMN!r}")
        if event_time is not None and event_time not in fields:
            raise ValueError(f"event_time column {event_time!r} is not in the DataFrame (it has {fields})")
        event_time, watermark_delay_ms = stream_watermark(input_schema, event_time, watermark_delay_ms)
        #: Whether the stream's own ``withWatermark`` is on the event-time column (else run_stream adds one
        #: on a column of its own, for Spark to run batches without data; see with_batches_without_data).
        self.watermarked_by_stream = event_time is not None and _watermark_delay_of(input_schema, event_time) is not None
        if self.timeout_conf == GroupStateTimeout.EventTimeTimeout and event_time is None:
            raise ValueError(
                "timeout='event' (EventTimeTimeout) needs an event-time column: call withWatermark(column, delay) on "
                "the stream, as for Spark, or give event_time="
            )
        self.event_time = event_time
        self.watermark_delay_ms = watermark_delay_ms
        check_runner_settings(self.spec, event_time, self.timeout_conf)
        combine_asked = combine_before_shuffle
        mapping_combiner = self.spec.mini_batch is not None and self.spec.mini_batch.aggregations is not None
        if combine_before_shuffle is None:
            combine_before_shuffle = mapping_combiner
        if combine_before_shuffle and not mapping_combiner:
            raise ValueError(
                "combine_before_shuffle=True needs a mapping combiner (mini_batch(combine={...}) or aggregate(...))"
            )
        self.combine_before_shuffle = bool(combine_before_shuffle)
        # Spark SQL does the combine when every aggregation has an exact SQL twin (no row
        # then enters Python before the shuffle); otherwise a Python pass per input partition.
        self.sql_partials = None
        # Hosted in Spark's stateful operator, the combine is part of the streaming plan, where a
        # SQL groupBy would be a streaming aggregation of its own: the Python combine runs instead.
        if self.combine_before_shuffle and self.timeout_conf != GroupStateTimeout.EventTimeTimeout and self.placement == "batch":
            assert self.spec.mini_batch is not None and self.spec.mini_batch.aggregations is not None
            self.sql_partials = sql_partials(self.spec.mini_batch.aggregations, input_schema)
        self.combine = "none" if not self.combine_before_shuffle else ("sql" if self.sql_partials is not None else "python")
        # Left to choose (combine_before_shuffle=None), Spark SQL's combine is skipped for the next batch when
        # the last one had fewer than RAW_ROWS_PER_KEY input rows per key merged: it then shrinks the shuffle
        # too little to pay for itself (see RAW_ROWS_PER_KEY).
        self._adaptive_combine = combine_asked is None and self.combine == "sql" and folds_raw_rows(self.spec)
        # A restarted query decides its first batch as its last run would have decided the next one.
        self._skip_combine = (
            self._adaptive_combine and manifest is not None and self._recorded_few_rows_per_key(manifest.version)
        )
        if self.spec.window is not None and self.combine == "python":
            # Windows are combined per (key, window start) by Spark SQL only; without a SQL twin for
            # every aggregation, the rows go to the instances as they are (they assign the windows).
            if combine_asked:
                raise ValueError(
                    "combine_before_shuffle=True: a windowed aggregate combines before the shuffle in Spark SQL only, "
                    f"and {list(self.spec.aggregations or ())} have no exact SQL twin here (placement={self.placement!r})"
                )
            self.combine_before_shuffle, self.combine = False, "none"
        #: Whether the operator tasks are part of the streaming query's plan (:meth:`streamed_tasks`). Without
        #: a combine before the shuffle every batch's plan is the same but for the batch's context, which the
        #: tasks can read from the batch record: the plan is then built once, not by the driver for every
        #: batch while the cluster waits (a mapInPandas alone is about 35 Py4J calls; in benchmarks.windows a
        #: batch's plan took 17-47 ms).
        self.streams_tasks = self.placement == "batch" and self.combine == "none"
        self._event_time_type = (
            next(f.dataType.typeName() for f in input_schema.fields if f.name == event_time) if event_time else None
        )
        if self._event_time_type == "timestamp_ntz":
            raise ValueError(
                f"event_time column {event_time!r} is a TIMESTAMP_NTZ (a wall-clock time of no time zone): an event "
                "time must be an instant, a TIMESTAMP or epoch milliseconds as a number, as Spark's withWatermark "
                "requires; cast it to timestamp first (its wall-clock times are then read in the session time zone)"
            )
        self._read_columns = self._columns_read(fields)
        # The Spark Columns of every batch's plan (see _plan_columns), built once in the process that
        # runs the batches; not pickled (under Spark Connect this runner is pickled to the server).
        self._columns: Optional[_PlanColumns] = None
        self.output_schema = output_schema_for(self.spec, output_schema, input_schema, self.key_columns)
        self.sink: Sink = sink_of(sink)
        self.retain = retain
        self.on_batch = on_batch
        #: The metrics of the last RECENT_BATCHES batches this runner ran, oldest first (as Spark's
        #: ``recentProgress``: a long-running query's driver keeps no more); every batch's metrics are
        #: also written to the checkpoint (:meth:`recorded_batches`), pruned with its versions.
        self.batches: collections.deque[BatchMetrics] = collections.deque(maxlen=RECENT_BATCHES)
        # Marks the batch metrics records of this query run, so a client that did not run
        # the batches (Spark Connect: they run in the server's Python) reads back only its own.
        self.run_id = uuid.uuid4().hex
        self._check_checkpoint(manifest, start_version)
        location = checkpoint_location if isinstance(checkpoint_location, str) else os.fspath(checkpoint_location)
        self.plan = TaskPlan(
            spec=self.spec,
            key_columns=self.key_columns,
            key_types=self.key_types,
            parallelism=parallelism,
            max_parallelism=max_parallelism,
            location=location,
            storage_options=dict(storage_options or {}),
            output_columns=[f.name for f in self.output_schema.fields],
            timeout_conf=self.timeout_conf,
            event_time=event_time,
            combine=self.combine,
            sql_partials=tuple(self.sql_partials or ()),
            workdir=workdir,
            memory_budget=self.memory_budget,
            state_schema=StateSchema.of(state_schema) if state_schema is not None else None,
            # Stable across driver restarts, so a restarted query finds its workers' working stores.
            query_id=xxhash.xxh64_hexdigest(json.dumps([location, self.key_columns, parallelism]).encode()),
            checkpoint_key=self.storage.checkpoint_key,
            batch_offset=self.batch_offset,
            # Before a first batch: one Spark job splits the rows by instance into the checkpoint storage.
            initial_state=_initial_state.prepare(
                initial_frame,
                self.storage,
                manifest,
                batch_offset=self.batch_offset,
                key_columns=self.key_columns,
                key_types=self.key_types,
                stream_key_types={f.name: f.dataType for f in input_schema.fields},
                parallelism=parallelism,
                max_parallelism=max_parallelism,
                location=location,
                storage_options=dict(storage_options or {}),
            ),
            instant_columns=instant_columns(input_schema),
            instant_outputs=instant_columns(self.output_schema),
        )
        self._internal_schema = self._with_report(nullable(self.output_schema))
        # A ParquetSink on a local path is written by the tasks themselves: one Spark job per batch.
        self._task_sink: Optional[ParquetSink] = None
        if isinstance(self.sink, ParquetSink) and self.sink.local_dir() is not None:
            from pyspark.sql.pandas.types import to_arrow_schema

            self._task_sink = self.sink
            self.plan = dataclasses.replace(
                self.plan,
                sink_dir=self.sink.local_dir(),
                # timezone: a timestamp column (e.g. a window's start) is an instant, written as UTC
                sink_schema=to_arrow_schema(nullable(self.output_schema), timezone="UTC"),
            )
        self._combined_schema = self._combined(input_schema) if self.combine_before_shuffle else None

    # ------------------------------------------------------------ set-up
    def _check_checkpoint(self, manifest: Any, start_version: Optional[int]) -> None:
        check_checkpoint_fits(
            manifest,
            repr(self.storage),
            key_columns=self.key_columns,
            key_types=self.key_types,
            max_parallelism=self.max_parallelism,
        )
        if start_version is not None:  # the next batch builds on it: its context must not see later versions
            self.storage.set_aside_after(start_version)

    @staticmethod
    def _with_report(schema: Any) -> Any:
        from pyspark.sql.types import StringType, StructField, StructType

        names = [f.name for f in schema.fields]
        if REPORT_COLUMN in names:
            raise ValueError(f"output_schema may not use the reserved column name {REPORT_COLUMN!r}")
        return StructType([*schema.fields, StructField(REPORT_COLUMN, StringType(), True)])

    def _combined(self, input_schema: Any) -> Any:
        from pyspark.sql.types import BinaryType, LongType, StructField, StructType

        fields = {f.name: f for f in input_schema.fields}
        instants = self.plan.instant_columns  # travel as epoch microseconds (see _instants)
        return StructType(
            [
                *(StructField(c, LongType() if c in instants else fields[c].dataType, True) for c in self.key_columns),
                StructField(ACCUMULATOR_COLUMN, BinaryType(), False),
                StructField(ROWS_COLUMN, LongType(), False),
                StructField(EVENT_TIME_COLUMN, LongType(), False),
            ]
        )

    # ------------------------------------------------------------ one batch
    def _processing_time(self, version: int, **decisions: Any) -> int:
        """Chosen once per batch and recorded before it runs, so a re-run makes the same decisions.

        ``decisions``: more of the batch's context to record with it (rewritten on
        every run of the batch, with the processing time of the first).
        """
        recorded = self.storage.processing_time(version)
        if recorded is not None and not decisions:
            return recorded
        now = recorded if recorded is not None else int(time.time() * 1000)
        self.storage.record_processing_time(version, now, **decisions)
        return now

    def context(self, version: int) -> tuple[BatchContext, int]:
        """The batch's context (and the max event time before it), from the committed version before it."""
        previous = self.storage.latest_version(before=version)
        max_event = NO_TIMESTAMP
        metadata: Optional[dict] = None
        if previous is not None:
            metadata = dict(self.storage.read_manifest(previous).metadata)
            max_event = int(metadata.get("max_event_time_ms", NO_TIMESTAMP))
        watermark = watermark_for(max_event, self.watermark_delay_ms, self.event_time is not None)
        late = late_rows_watermark(watermark, metadata)
        # Tasks in the streaming plan get no closure per batch: they read what they must decide alike from the record.
        decisions = (
            {"previous_version": previous, "watermark_ms": watermark, "late_watermark_ms": late}
            if self.placement == "executor" or self.streams_tasks
            else {}
        )
        context = BatchContext(version, previous, self._processing_time(version, **decisions), watermark, late)
        return context, max_event

    @property
    def no_data_timeout(self) -> str:
        """The GroupStateTimeout for which Spark would run this operator's batches without data
        (:func:`buffering.protocol.no_data_timeout`)."""
        return no_data_timeout(self.spec, self.timeout_conf, self.event_time)

    def watermarked(self, df: Any) -> Any:
        """``df`` with the event-time watermark Spark needs to run batches without data by it.

        The stream's own ``withWatermark`` on the event time serves as it is;
        otherwise a TIMESTAMP copy of the event time (WATERMARK_COLUMN) gets
        ``withWatermark(delay)``, so Spark's watermark is opbuffer's: max event
        time seen - delay. With ``placement="executor"`` always the copy: the hosting
        operator's input keeps only it watermarked (see :meth:`hosted_stream`).
        """
        if self.no_data_timeout != GroupStateTimeout.EventTimeTimeout:
            return df
        if self.watermarked_by_stream and self.placement != "executor":
            return df
        from pyspark.sql import functions as F

        assert self.event_time is not None
        column = F.col(quoted(self.event_time))
        if self.watermarked_by_stream:  # a copy keeps the column's watermark (Spark refuses a second withWatermark)
            return df.withColumn(WATERMARK_COLUMN, column)
        ts = column if self._event_time_type.startswith("timestamp") else F.timestamp_millis(column.cast("long"))
        return df.withColumn(WATERMARK_COLUMN, ts).withWatermark(WATERMARK_COLUMN, f"{self.watermark_delay_ms} milliseconds")

    def with_batches_without_data(self, stream: Any, watermarked: Any) -> Any:
        """``stream`` (the query's plan) with a branch that makes Spark run batches without data as for this operator.

        The branch is a stateful operator of Spark's own over no rows (``watermarked``
        filtered by a false literal, which Spark's optimizer turns into an empty
        relation: nothing is read twice) that asks for batches without data by the
        same rule as the user's operator: for event time a global streaming count
        (Spark runs one when the watermark moved; one state store partition, in the
        JVM), for processing time an ``applyInPandasWithState`` with
        ``ProcessingTimeTimeout`` (one at every trigger). It holds no state and emits
        nothing; its cost is its state store's commit in every batch. Each batch without data then reaches the
        runner as a batch of its own id, which commits its version like any other
        (exactly-once as for every batch).
        """
        timeout = self.no_data_timeout
        if timeout == GroupStateTimeout.NoTimeout:
            return stream
        from pyspark.sql import functions as F

        if timeout == GroupStateTimeout.EventTimeTimeout:
            # Spark SQL's own streaming aggregation grouped by the watermarked column asks for a batch without
            # data exactly when the watermark moved, as an event-time timeout does, and runs in the JVM alone.
            column = self.event_time if self.watermarked_by_stream else WATERMARK_COLUMN
            assert column is not None
            counted = watermarked.where(F.lit(False)).select(F.col(quoted(column))).groupBy().count()
            counted = counted.where(F.col("count") < 0)  # none: a global count of no rows is one row of 0
            marker = counted.select(*(F.lit(None).cast(f.dataType).alias(f.name) for f in stream.schema.fields))
        else:
            branch = watermarked.where(F.lit(False)).select(F.lit(0).alias(MARKER_COLUMN))
            marker = branch.groupBy(MARKER_COLUMN).applyInPandasWithState(
                _task.no_data_marker, stream.schema, "unused int", "Update", timeout
            )
        return stream.union(marker)

    def hosted_stream(self, df: Any, host_keys: Sequence[int], no_data_timeout: Optional[str] = None) -> Any:
        """placement="executor": the streaming DataFrame whose micro-batches run the operator instances.

        Each instance is one group of Spark's own ``applyInPandasWithState``
        (grouped by its host key), so Spark's state store coordinator places the
        task of its partition on the executor that ran it last: the instance
        stays warm there. The batch's context reaches the tasks through the
        batch record the driver writes before the batch runs.

        ``no_data_timeout``: the hosting operator's GroupStateTimeout, so that Spark
        runs the batches without data it runs for the user's operator (see
        :meth:`with_batches_without_data`); ``df`` then carries the watermarked
        WATERMARK_COLUMN when the stream has no watermark of its own, which the
        tagging step nulls (Spark's own late-row filter must pass every row: the
        instances filter late rows as Spark's operator for this kind would).
        """
        if len(host_keys) != self.parallelism:
            raise ValueError(f"need one host key per instance ({self.parallelism}), got {len(host_keys)}")
        keys = tuple(int(k) for k in host_keys)
        if self.combine == "python" and no_data_timeout == GroupStateTimeout.EventTimeTimeout:
            raise ValueError(
                "placement='executor' with the Python combine before the shuffle loses the event time the hosting "
                "operator needs for Spark's batches without data: pass combine_before_shuffle=False"
            )
        df = self._rows_for_python(df)
        if self.combine == "python":
            assert self._combined_schema is not None
            tagged = self._tagged(self._combined_schema)
            frame = df.mapInPandas(functools.partial(_task.combine_and_tag, self.plan, keys), tagged)
        else:
            frame = df.withColumn(OPERATOR_COLUMN, self._plan_columns().operator)
            tagged = self._tagged(df.schema)
            frame = frame.mapInArrow(functools.partial(_task.tag_partition, keys, tagged), tagged)
        numpy_types = {"byte": "int8", "short": "int16", "integer": "int32", "long": "int64", "boolean": "bool"}
        dtypes = tuple(
            (f.name, numpy_types[f.dataType.typeName()])
            for f in tagged.fields
            if f.dataType.typeName() in numpy_types and f.name not in (HOST_COLUMN, HEARTBEAT_COLUMN)
        )
        timeout = no_data_timeout or GroupStateTimeout.NoTimeout
        return frame.groupBy(HOST_COLUMN).applyInPandasWithState(
            functools.partial(_task.host_instance, self.plan, keys, dtypes, timeout),
            self._internal_schema,
            "unused int",
            "Update",
            timeout,
        )

    @staticmethod
    def _tagged(schema: Any) -> Any:
        """``schema`` (all nullable: heartbeat rows carry nulls) plus the instance, host key and heartbeat flag."""
        from pyspark.sql.types import BooleanType, IntegerType, LongType, StructField, StructType

        own = any(f.name == WATERMARK_COLUMN for f in schema.fields)

        def metadata(f: Any) -> Any:  # only WATERMARK_COLUMN stays watermarked (see hosted_stream)
            if own and f.name != WATERMARK_COLUMN and WATERMARK_DELAY_METADATA in (f.metadata or {}):
                return {k: v for k, v in f.metadata.items() if k != WATERMARK_DELAY_METADATA}
            return f.metadata

        return StructType(
            [
                *(StructField(f.name, f.dataType, True, metadata(f)) for f in schema.fields),
                StructField(OPERATOR_COLUMN, IntegerType(), False),
                StructField(HOST_COLUMN, LongType(), False),
                StructField(HEARTBEAT_COLUMN, BooleanType(), False),
            ]
        )

    def plan_batch(self, batch_df: Any, context: BatchContext) -> Any:
        """The DataFrame of one batch's output and report rows (lazy)."""
        from pyspark.sql import functions as F

        frame = batch_df
        combine = self._batch_combine()
        plan = self.plan if combine == self.plan.combine else dataclasses.replace(self.plan, combine=combine)
        if combine == "sql":
            assert self.spec.mini_batch is not None and self.spec.mini_batch.aggregations is not None
            event = F.min(F.lit(NO_TIMESTAMP).cast("long"))
            by = list(self.key_columns)
            if self.event_time is not None:
                column = F.col(self.event_time)
                event = F.max(F.unix_millis(column) if self._event_time_type.startswith("timestamp") else column.cast("long"))
            if self.spec.window is not None:
                frame, by = self._with_window_start(frame), [*by, WINDOW_START]
            frame = frame.groupBy(*by).agg(
                F.count(F.lit(1)).alias(ROWS_COLUMN),
                *sql_exprs(self.spec.mini_batch.aggregations, self.sql_partials or []),
                event.alias(EVENT_TIME_COLUMN),
            )
            frame = as_micros(frame, self._instants_of(self.key_columns))
            frame = frame.withColumn(OPERATOR_COLUMN, self._plan_columns().operator)
        elif combine == "python":
            frame = self._rows_for_python(frame)
            frame = frame.mapInPandas(functools.partial(_task.combine_partition, plan, context), self._combined_schema)
            frame = frame.withColumn(OPERATOR_COLUMN, self._plan_columns().operator)
        else:
            frame = self._rows_for_python(frame, with_operator=True)
        return self._tasks(frame, functools.partial(_task.run_task, plan, context))

    def _instances_without_rows(self, spark: Any, context: BatchContext) -> Any:
        """The output and report rows of every instance run without input rows (lazy): one task per instance."""
        frame = spark.range(0, self.parallelism, 1, self.parallelism)
        return frame.mapInPandas(functools.partial(_task.run_without_rows, self.plan, context), self._internal_schema)

    def streamed_tasks(self, df: Any) -> Any:
        """:attr:`streams_tasks`: the streaming DataFrame whose micro-batches run the operator instances.

        The plan of :meth:`plan_batch` without a combine, made once: each task
        reads its batch's context from the batch record the driver writes before
        the batch runs (see :meth:`context`).
        """
        assert self.streams_tasks
        frame = self._rows_for_python(df, with_operator=True)
        return self._tasks(frame, functools.partial(_task.run_streamed_task, self.plan))

    def _tasks(self, frame: Any, function: Any) -> Any:
        """``frame`` (rows with their OPERATOR_COLUMN) shuffled to the instances' tasks, which run ``function``."""
        # The column goes on to the tasks although partition i holds exactly instance i's rows: with a
        # projection between the shuffle and mapInPandas, Spark skips the Python task of an empty
        # partition, and every instance must run in every batch (its timers, its report).
        frame = frame.repartitionById(self.parallelism, OPERATOR_COLUMN)
        return frame.mapInPandas(function, self._internal_schema)

    def _columns_read(self, fields: list[str]) -> Optional[list[str]]:
        """The input columns the Python side reads when it gets rows, or None when it may read all of them.

        An aggregate folding a batch's raw rows, and the Python combine, read the
        key, the aggregations' input columns and the event time: the other
        columns need not cross the shuffle and the Arrow conversion (Spark
        prunes them itself only where it aggregates, as in its SQL combine). A
        function, or a triggered aggregate's buffer (its size trigger counts a
        row's bytes), gets every column.
        """
        aggs = self.spec.mini_batch.aggregations if self.spec.mini_batch is not None else None
        if aggs is None or not (folds_raw_rows(self.spec) or self.combine == "python"):
            return None
        wanted = {*self.key_columns, *aggs.input_columns, *([self.event_time] if self.event_time is not None else [])}
        read = [name for name in fields if name in wanted]
        return None if len(read) == len(fields) else read

    def _instants_of(self, columns: Optional[Sequence[str]]) -> list[str]:
        """Which of ``columns`` (None: every input column) are TIMESTAMPs, shipped as epoch microseconds."""
        instants = self.plan.instant_columns
        return list(instants) if columns is None else [c for c in columns if c in instants]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_columns"] = None  # Spark Columns belong to the session of the process that made them
        return state

    def _rows_for_python(self, frame: Any, *, with_operator: bool = False) -> Any:
        """``frame``'s rows as they cross into Python: only the columns the Python side reads
        (:meth:`_columns_read`), TIMESTAMPs among them as epoch microseconds (see _instants), and with
        ``with_operator`` each row's operator instance (OPERATOR_COLUMN), in the same projection.

        The driver builds every batch's plan while the cluster waits, and each
        DataFrame step costs an analysis in the JVM and each Column a few Py4J
        calls (in benchmarks.spark_e2e's (c) the plan took 71 ms a batch on a
        busy machine): hence one projection, of Columns made once. When a key
        column is a TIMESTAMP the instance is computed after the conversion:
        the key groups are those of the epoch microseconds the tasks see.
        """
        select, converted, operator, operator_after = self._plan_columns()
        after = with_operator and operator_after
        added = {OPERATOR_COLUMN: operator} if with_operator and not after else {}
        if select is not None:
            if WATERMARK_COLUMN in frame.columns:  # the hosting operator's watermark (see hosted_stream)
                from pyspark.sql import functions as F

                select = [*select, F.col(WATERMARK_COLUMN)]
            frame = frame.select(*select, *added.values())
        elif converted or added:
            frame = frame.withColumns({**converted, **added})  # every other column kept as it is
        return frame.withColumn(OPERATOR_COLUMN, operator) if after else frame

    def _plan_columns(self) -> _PlanColumns:
        """The Columns of :meth:`_rows_for_python`, made on first use in this process."""
        if self._columns is None:
            from pyspark.sql import functions as F

            instants = set(self._instants_of(self._read_columns))
            select, converted = None, {}
            if self._read_columns is not None:
                select = [micros_column(n) if n in instants else F.col(quoted(n)) for n in self._read_columns]
            else:
                converted = {n: micros_column(n) for n in instants}
            operator = F.expr(operator_index_sql(self.key_columns, self.parallelism, self.max_parallelism))
            after = bool(instants & set(self.key_columns))
            self._columns = _PlanColumns(select, converted, operator.alias(OPERATOR_COLUMN), after)
        return self._columns

    def _recorded_few_rows_per_key(self, version: int) -> bool:
        """Whether committed batch ``version`` merged fewer than RAW_ROWS_PER_KEY input rows per key, as its
        metrics record says; False without a usable record (the combine is then kept, as for a new query)."""
        try:
            record = self.storage.read_batch_metrics(version)
        except CheckpointCorruptError as exc:  # advisory only: the batch's state and outputs do not depend on it
            logger.warning("ignoring the metrics record of batch %d when choosing the combine: %s", version, exc)
            return False
        if record is None:
            return False
        rows, calls = record.get("rows_in"), record.get("calls")
        if not isinstance(rows, int) or not isinstance(calls, int) or calls <= 0:
            return False
        return _few_rows_per_key(rows, calls)

    def _batch_combine(self) -> str:
        """How the next (or running) batch's rows reach the instances: the plan's combine, or "none" when
        Spark SQL's is skipped after a batch with few rows per key (see RAW_ROWS_PER_KEY)."""
        return "none" if self.combine == "sql" and self._skip_combine else self.combine

    def _with_window_start(self, frame: Any) -> Any:
        """A windowed aggregate's (row, window) pairs with their WINDOW_START (epoch ms), computed by Spark.

        Rows without an event time belong to no window, as with Spark's ``window()``; the
        late pairs are dropped (and counted) by the instances, which see the start.
        """
        from pyspark.sql import functions as F

        assert self.event_time is not None and self.spec.window is not None
        name = self.event_time.replace("`", "``")
        ts_ms = f"unix_millis(`{name}`)" if self._event_time_type.startswith("timestamp") else f"cast(`{name}` as long)"
        window = self.spec.window.spec
        frame = frame.where(F.col(self.event_time).isNotNull())
        start = F.expr(window.start_sql(ts_ms))
        return frame.withColumn(WINDOW_START, F.explode(start) if window.windows_per_row_sql else start)

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        try:
            from pyspark import StorageLevel
            from pyspark.sql import functions as F

            started = time.perf_counter()
            version = int(batch_id) + self.batch_offset
            context, max_event = self.context(version)
            already_committed = self.storage.has_version(version)
            task_sink = self._task_sink
            if task_sink is not None:
                task_sink.prepare(version)  # a re-run of this batch id replaces what the earlier run wrote
            # A batch of the query run_stream started holds the tasks' rows already (streamed_tasks); a batch of
            # input rows (a runner called by hand) gets its plan here.
            if self.placement == "executor" or (self.streams_tasks and REPORT_COLUMN in batch_df.columns):
                self.storage.record_running_batch(version)  # for tasks without Spark's batch id (Connect)
                out = batch_df  # the operator instances run in the streaming plan when the batch is evaluated
            else:
                out = self.plan_batch(batch_df, context)
            if task_sink is None:  # the tasks write the rows and yield only reports
                out = out.persist(StorageLevel.MEMORY_AND_DISK)
            try:
                # With a task sink the tasks yield report rows only: collected as they are, without a
                # filter and a projection to plan on the driver.
                reports = out if task_sink is not None else out.where(F.col(REPORT_COLUMN).isNotNull())
                summaries = [TaskSummary.from_json(r[REPORT_COLUMN]) for r in reports.collect()]
                if not summaries and self.placement == "batch":
                    # A batch without data whose empty input Spark's optimizer pruned with the tasks over
                    # it; every instance must still run (its timeouts, timers, its report).
                    if task_sink is None:
                        out.unpersist()
                    out = self._instances_without_rows(batch_df.sparkSession, context)
                    if task_sink is None:
                        out = out.persist(StorageLevel.MEMORY_AND_DISK)
                    reports = out if task_sink is not None else out.where(F.col(REPORT_COLUMN).isNotNull())
                    summaries = [TaskSummary.from_json(r[REPORT_COLUMN]) for r in reports.collect()]
                instances = [i for s in summaries for i in s.instances]
                seen = sorted(i.instance for i in instances)
                if seen != list(range(self.parallelism)):
                    raise RuntimeError(f"batch {version}: expected one report from each of instances 0..{self.parallelism - 1}, got {seen}")
                sink_started = time.perf_counter()
                if task_sink is not None:
                    task_sink.finish(version)
                else:
                    self.sink(out.where(F.col(REPORT_COLUMN).isNull()).drop(REPORT_COLUMN), version)
                sink_seconds = time.perf_counter() - sink_started
                for s in summaries:
                    max_event = max(max_event, s.max_event_time_ms)
                commit_started = time.perf_counter()
                committed = not already_committed
                if committed:
                    try:
                        commit(
                            self.storage,
                            version,
                            [i.report for i in instances],
                            metadata=commit_metadata(
                                max_event_time_ms=max_event,
                                processing_time_ms=context.processing_time_ms,
                                key_columns=self.key_columns,
                                key_types=self.key_types,
                                parallelism=self.parallelism,
                                state_key_columns=state_key_columns(self.spec, self.key_columns),
                                placement=self.placement,
                                **{WATERMARK_FIELD: context.watermark_ms},
                                **({BATCH_OFFSET_FIELD: self.batch_offset} if self.batch_offset else {}),
                            ),
                            retain=self.retain,
                            max_parallelism=self.max_parallelism,
                        )
                    except VersionExistsError:
                        committed = False
                if not committed:
                    # A re-run of a batch committed before a restart: the recomputed state equals
                    # the committed one, and the sink was given the same rows again.
                    logger.info("batch %d was already committed; kept its manifest", version)
                commit_seconds = time.perf_counter() - commit_started
            finally:
                if task_sink is None:
                    out.unpersist()
            metrics = self._metrics(version, summaries, time.perf_counter() - started, commit_seconds, committed, context)
            metrics.sink_seconds = sink_seconds
            metrics.combine = self._batch_combine()
            if self._adaptive_combine and metrics.calls:
                self._skip_combine = _few_rows_per_key(metrics.rows_in, metrics.calls)
            self.batches.append(metrics)
            self.storage.write_batch_metrics(version, {RUN_ID_FIELD: self.run_id, **metrics.to_record()})
            logger.info(
                "batch %d: %d rows in, %d out, %.2fs (%.0f rows/s), cache hit ratio %.3f, %d evictions, %d syncs, "
                "%d flushes, checkpoint %d bytes in %.3fs, slowest task %.2fs, sink %.2fs",
                version,
                metrics.rows_in,
                metrics.rows_out,
                metrics.seconds,
                metrics.rows_per_second,
                metrics.cache_hit_ratio,
                metrics.cache_evictions,
                metrics.cache_syncs,
                metrics.flushes,
                metrics.checkpoint_bytes,
                metrics.checkpoint_seconds,
                metrics.task_seconds_max,
                metrics.sink_seconds,
            )
            if self.on_batch is not None:
                self.on_batch(metrics)
        except Exception as exc:
            # Spark gets a short error (its check for a stop() runs a regex over the whole text), the user's
            # failure its key, call and batch; runner.failure and the driver's log keep the rest (see _errors).
            from ._errors import batch_error

            error = batch_error(self, exc, int(batch_id) + getattr(self, "batch_offset", 0))
            raise error from None

    @staticmethod
    def _metrics(
        version: int,
        summaries: list[TaskSummary],
        seconds: float,
        commit_seconds: float,
        committed: bool,
        context: BatchContext,
    ) -> BatchMetrics:
        m = BatchMetrics(batch_id=version, seconds=seconds, commit_seconds=commit_seconds, committed=committed)
        m.watermark_ms = context.watermark_ms
        m.tasks = len(summaries)
        for s in summaries:
            m.dropped_late_rows += s.dropped_late_rows + int(sum(i.metrics.get("late_rows", 0) for i in s.instances))
            m.task_seconds_max = max(m.task_seconds_max, s.seconds)
            m.task_seconds_sum += s.seconds
            for i in s.instances:
                c = i.metrics
                m.rows_in += int(c["rows_in"])
                m.rows_out += int(c["rows_out"])
                m.flushes += int(c["flushes"])
                m.calls += int(c["calls"])
                m.timeouts += int(c["timeouts"])
                m.cache_hits += int(c.get("cache_hits", 0))
                m.cache_misses += int(c.get("cache_misses", 0))
                m.cache_evictions += int(c.get("cache_evictions", 0))
                m.cache_syncs += int(c.get("cache_syncs", 0))
                m.checkpoint_bytes += int(c["checkpoint_bytes"])
                m.checkpoint_seconds = max(m.checkpoint_seconds, float(c["checkpoint_seconds"]))
                m.per_instance.append(i.batch_metrics_entry())
        return m

    def recorded_batches(self) -> list[BatchMetrics]:
        """The metrics of this run's batches that the checkpoint still holds, by batch id.

        What the client of a Spark Connect session sees (the batches ran in the
        server's Python, and so did the appends to :attr:`batches`); retention
        prunes the records of versions it deletes.
        """
        out = []
        for version in sorted({v for _, v in self.storage.batch_metrics_records()}):  # a leftover temp file names v too
            record = self.storage.read_batch_metrics(version)
            if record is not None and record.get(RUN_ID_FIELD) == self.run_id:
                out.append(BatchMetrics.from_record(record))
        return out


#: The manifest metadata field that holds :attr:`StreamRunner.batch_offset` (absent: 0).
BATCH_OFFSET_FIELD = "spark_batch_offset"

#: The field of a batch metrics record that names the query run (``StreamRunner.run_id``) that wrote it.
RUN_ID_FIELD = "run_id"


class OpbufferQuery:
    """The started query (every attribute and method of Spark's StreamingQuery) plus opbuffer's batch metrics.

    A wrapper rather than a subclass: classic and Spark Connect have different
    StreamingQuery classes, built from different private handles.
    """

    def __init__(self, query: Any, runner: StreamRunner, *, connect: bool) -> None:
        #: Spark's own StreamingQuery (classic or Connect).
        self.query = query
        self.runner = runner
        self._connect = connect

    def __getattr__(self, name: str) -> Any:
        # Only names this class lacks: Spark's query answers them (id, awaitTermination, stop, ...).
        if name in ("query", "runner", "_connect"):  # not yet set (unpickling, copy): no recursion
            raise AttributeError(name)
        return getattr(self.query, name)

    def __repr__(self) -> str:
        return f"OpbufferQuery({self.query!r})"

    @property
    def batch_metrics(self) -> list[BatchMetrics]:
        """The last ``RECENT_BATCHES`` (100) batches this query ran, in order, as Spark's ``recentProgress``.

        Every batch's metrics are in the checkpoint too, for as long as retention keeps its
        version: ``query.runner.recorded_batches()`` reads them back. Under Spark Connect the
        batches run in the server's Python, so their metrics are read back from there.
        """
        if self._connect:
            return self.runner.recorded_batches()
        return list(self.runner.batches)

    @property
    def last_batch_metrics(self) -> Optional[BatchMetrics]:
        batches = self.batch_metrics
        return batches[-1] if batches else None

    def awaitTermination(self, timeout: Optional[int] = None) -> Optional[bool]:
        """Spark's ``awaitTermination``; when the user's code failed the query, that exception is raised instead:
        the user's type and message, with notes naming the key, the call and the batch and holding the user's
        frames (Spark's StreamingQueryException its ``__context__``)."""
        from pyspark.errors import StreamingQueryException

        from ._errors import user_exception

        try:
            return self.query.awaitTermination() if timeout is None else self.query.awaitTermination(timeout)
        except StreamingQueryException as exc:
            user = user_exception(self.runner, exc)
            if user is None:
                raise
            raise user

    def processAllAvailable(self) -> None:
        """Spark's ``processAllAvailable``; a failure of the user's code is raised as :meth:`awaitTermination` raises it."""
        from pyspark.errors import StreamingQueryException

        from ._errors import user_exception

        try:
            self.query.processAllAvailable()
        except StreamingQueryException as exc:
            user = user_exception(self.runner, exc)
            if user is None:
                raise
            raise user

    def exception(self) -> Optional[BaseException]:
        """Spark's ``exception()``; when the user's code failed the query, the user's exception instead (as
        :meth:`awaitTermination` raises it, Spark's StreamingQueryException its ``__context__``)."""
        from ._errors import user_exception

        spark_error = self.query.exception()
        user = user_exception(self.runner, spark_error)
        return spark_error if user is None else user


def _spark_checkpoint(checkpoint_location: Any, spark_checkpoint_location: Optional[str]) -> str:
    if spark_checkpoint_location is not None:
        return spark_checkpoint_location if "://" in spark_checkpoint_location else os.path.expanduser(spark_checkpoint_location)
    location = os.fspath(checkpoint_location)
    if "://" in location and not location.startswith("file://"):
        raise ValueError(
            f"checkpoint_location {location!r} is not a local path: give spark_checkpoint_location= "
            "(a Hadoop path for Spark's own offsets log)"
        )
    return os.path.join(os.path.expanduser(location.removeprefix("file://")), "_spark")


def host_keys(spark: Any, parallelism: int, partitions: int) -> tuple[int, ...]:
    """One grouping key per instance for the hosting operator, spreading instances over its partitions.

    Spark sends key ``k`` to partition ``pmod(hash(k), partitions)`` (Murmur3,
    as ``F.hash``); instance ``i`` gets a key of partition ``i % partitions``,
    distinct from the other instances' keys, so no two instances share a task
    while there are as many partitions as instances. Computed by Spark itself.
    """
    from pyspark.sql import functions as F

    need = -(-parallelism // partitions)  # keys per partition
    n = 64 * max(parallelism, partitions)
    rows = spark.range(0, n).select("id", F.pmod(F.hash("id"), F.lit(partitions)).alias("p")).collect()
    by_partition: dict[int, list[int]] = {}
    for key, partition in sorted((int(row[0]), int(row[1])) for row in rows):
        by_partition.setdefault(partition, []).append(key)
    keys = []
    for i in range(parallelism):
        candidates = by_partition.get(i % partitions, [])
        if len(candidates) < need:
            raise RuntimeError(f"no {need} keys of partition {i % partitions} among ids 0..{n - 1}")
        keys.append(candidates[i // partitions])
    return tuple(keys)


def _stored_shuffle_partitions(spark_checkpoint: str) -> Optional[int]:
    """The shuffle partitions a Spark checkpoint's query runs with (fixed at its first batch), if readable here."""
    offsets = os.path.join(spark_checkpoint.removeprefix("file://").removeprefix("file:"), "offsets")
    if "://" in spark_checkpoint.removeprefix("file://") or not os.path.isdir(offsets):
        return None
    batches = sorted((int(n) for n in os.listdir(offsets) if n.isdigit()), reverse=True)
    for batch in batches:
        try:
            with open(os.path.join(offsets, str(batch))) as f:
                f.readline()  # the log's version line
                value = json.loads(f.readline()).get("conf", {}).get("spark.sql.shuffle.partitions")
            return int(value) if value is not None else None
        except (OSError, ValueError):
            continue
    return None


def _new_placement(spark: Any) -> str:
    """Where a new checkpoint's tasks run: pinned to executors on a cluster, anywhere in local mode."""
    master = str(spark.conf.get("spark.master", "") or "")
    return "batch" if master.startswith("local") else "executor"


def _check_connect_location(checkpoint_location: Any) -> None:
    """Under Spark Connect a relative checkpoint path would name two places: refuse it."""
    if isinstance(checkpoint_location, CheckpointStorage):
        return
    location = os.fspath(checkpoint_location)
    if "://" in location or location.startswith("~") or os.path.isabs(location):
        return
    raise ValueError(
        f"checkpoint_location {location!r} is a relative path: under Spark Connect the client checks the "
        "checkpoint and reads the batch metrics relative to its own working directory, and the server's tasks "
        "relative to theirs; give an absolute path (on storage both see) or a URL"
    )


MEMORY_BUDGET_CONF = "spark.opbuffer.memoryBudget"
_BYTE_SUFFIXES = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30}


def _memory_budget_conf(text: Optional[str]) -> Optional[int]:
    """The bytes of the ``spark.opbuffer.memoryBudget`` conf ("536870912", "512m", "2g"), None if unset."""
    if text is None or not str(text).strip():
        return None
    value = str(text).strip().lower()
    digits = value.rstrip("kmgb")
    suffix = value[len(digits):]
    if not digits.isdigit() or suffix not in _BYTE_SUFFIXES:
        raise ValueError(f"{MEMORY_BUDGET_CONF}={text!r} is not a size in bytes (e.g. 536870912, 512m, 2g)")
    return check_memory_budget(int(digits) * _BYTE_SUFFIXES[suffix], MEMORY_BUDGET_CONF)


def run_stream(
    df: Any,
    fn: Any,
    *,
    key: Sequence[str] | str,
    output_schema: Any = None,
    checkpoint_location: Any,
    sink: Any,
    parallelism: Optional[int] = None,
    max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    trigger: Any = None,
    query_name: Optional[str] = None,
    timeout: str = "none",
    event_time: Optional[str] = None,
    watermark_delay_ms: Optional[int] = None,
    combine_before_shuffle: Optional[bool] = None,
    retain: Optional[int] = DEFAULT_RETAIN,
    storage_options: Optional[Mapping[str, Any]] = None,
    spark_checkpoint_location: Optional[str] = None,
    workdir: Optional[str] = None,
    on_batch: Optional[Callable[[BatchMetrics], None]] = None,
    start_version: Optional[int] = None,
    checkpoint_key: str | bytes | None = None,
    memory_budget: Optional[int] = None,
    state_schema: Any = None,
    placement: Optional[str] = None,
    time_mode: Optional[str] = None,
    initial_state: Any = None,
    output_mode: str = "update",
) -> Any:
    """Run ``fn`` over the streaming DataFrame ``df``, keyed by ``key``, exactly-once; returns the started query.

    Args:
        df: a streaming DataFrame (``spark.readStream...``).
        fn: an ``applyInPandasWithState``-shaped function, decorated or not,
            ``buffering.aggregate(...)``, or a transformWithStateInPandas
            ``StatefulProcessor`` (its state variables in opbuffer's caches and checkpoints).
        key: the key column(s).
        output_schema: StructType or DDL string of fn's output (inferred for aggregate()).
        checkpoint_location: where state versions live (local path or fsspec URL).
            Spark's own offsets go to ``{checkpoint_location}/_spark`` for a local path.
            A checkpoint written by ``buffering.spark.import_state`` (version 0) needs a
            new Spark checkpoint: its micro-batch ``b`` commits version ``b + 1`` (the
            manifest's ``spark_batch_offset``), and the sink is handed that version.
        sink: ``callable(out_df, batch_id)``, a :mod:`buffering.spark.sinks` sink, or
            ``"parquet:PATH"`` / ``"delta:PATH"`` / ``"noop"``. It must be idempotent by batch id
            (the built-in ones are) for end-to-end exactly-once.
        parallelism: operator instances (= shuffle partitions); may change between restarts.
        max_parallelism: key groups, fixed for the life of the checkpoint.
        trigger: as Spark spells it: ``{"availableNow": True}``, ``{"processingTime": "10 seconds"}``,
            ``{"once": True}``, or ``"availableNow"``, ``"once"``, ``"10 seconds"``.
        query_name: the query's name.
        timeout: ``"none"``, ``"processing"`` or ``"event"`` (GroupStateTimeout).
        event_time: event-time column (timestamp or epoch ms) driving the watermark; default:
            the column of the stream's own ``withWatermark``.
        watermark_delay_ms: watermark = max event time seen - this delay (before the batch);
            default: the stream's ``withWatermark`` delay, else 0.
            With ``timeout="event"``, rows at or before the watermark the previous
            batch ran with are dropped as late and timeouts fire by the batch's
            own watermark, as in Spark. Batches without data run as Spark runs
            them for the same operator: after a batch that moved the watermark (event-time
            timeouts, ``EventTime`` processors, windows) and at every trigger with a
            processing-time timeout; each commits its version like any other batch.
        combine_before_shuffle: pre-aggregate before the shuffle. Default (None): with a mapping
            combiner, and with Spark SQL's partial aggregation where every aggregation has an exact SQL
            twin, skipped for a batch when the previous one had fewer than ``RAW_ROWS_PER_KEY`` (16)
            input rows per key merged (e.g. many keys that see a few rows each; a restarted query reads
            the last committed batch's metrics record for its first batch): the rows then go to the
            instances as they are and are folded as columns there. True: always; False: never.
            Rows that reach Python uncombined carry only the columns an aggregate reads (key,
            aggregation inputs, event time); a function gets them all.
        retain: committed versions kept (older files are deleted).
        storage_options: fsspec options of a URL ``checkpoint_location``, one mapping (for
            s3fs e.g. ``{"client_kwargs": {"endpoint_url": ...}}``); the tasks get the same.
        on_batch: called on the driver with each batch's :class:`BatchMetrics`. Not under
            Spark Connect (ValueError): there the batches run in the server's Python.
        memory_budget: bytes that the state caches of all operator instances of one
            Spark Python worker hold together (one CacheManager per worker process);
            default: the Spark conf ``spark.opbuffer.memoryBudget`` (bytes, or with a
            k/m/g suffix), else no budget. Each instance's grant is in
            ``BatchMetrics.per_instance[i]["cache_granted_bytes"]``. The working RocksDB
            stores' own memory is capped per store, not by this budget.
        start_version: start from this retained version instead of the latest (a way
            back, e.g. when the latest is damaged). The versions after it are set aside
            (``CheckpointStorage.set_aside_after``); the next batch builds on it. Spark's own
            offsets are not moved: the rows of the set-aside batches are not processed
            again unless Spark's checkpoint is reset too.
        checkpoint_key: sign manifests with this key and refuse unsigned or wrongly
            signed ones before anything is unpickled, on the driver and in every task
            (default: ``$OPBUFFER_CHECKPOINT_KEY`` on the driver). It reaches the tasks
            inside the task plan, never in a log line.
        state_schema: the state's StructType or DDL string, as applyInPandasWithState takes it:
            a stored state reads back converted as under Spark. None: as stored.
        placement: where each batch's operator instances run. ``"executor"``: each
            instance is one group of a Spark ``applyInPandasWithState`` (with empty
            Spark state), so Spark's state store coordinator keeps its task on the
            executor that ran it last, where its cache is warm; the combine before
            the shuffle is the Python one. ``"batch"``: in jobs of ``foreachBatch``, on
            whichever executor is free (an instance that lands elsewhere restores from
            the checkpoint); the combine may run in Spark SQL. Without a combine the
            tasks' plan is part of the streaming query (built once, not per batch).
            Default: what the checkpoint was started with, else ``"executor"`` on a
            cluster and ``"batch"`` with a ``local`` master. Fixed for the life of a checkpoint,
            as Spark's own checkpoint holds the plan. With ``"executor"`` and a new
            Spark checkpoint, the query's shuffle partitions are set to
            ``parallelism`` (Spark keeps them with its checkpoint, for the sink's
            operations too). Under Spark Connect the jobs foreachBatch starts carry
            no micro-batch id, so tasks in the streaming plan read the batch the
            driver records as running (``CheckpointStorage.record_running_batch``).
        time_mode: for a ``StatefulProcessor``: "None", "ProcessingTime" or "EventTime"
            (needs ``event_time``), as Spark's ``timeMode``; a processor takes no ``timeout``.
        output_mode: ``"update"`` or ``"append"``, as Spark's ``outputMode`` of these operators
            (both emit every row the operator yields).
        initial_state: for a ``StatefulProcessor``: a static DataFrame (Spark or pandas) with
            the key columns; before the first batch of a new checkpoint each key's rows go to
            ``handleInitialState``. A Spark DataFrame is never collected: one Spark job writes each
            operator instance's rows into the checkpoint storage (``initial_state/``), read by its task.

    The returned query is Spark's StreamingQuery (wrapped: :class:`OpbufferQuery`) and also has
    ``batch_metrics`` and ``last_batch_metrics``.

    Under Spark Connect (``SparkSession.builder.remote(...)``) the foreachBatch function,
    and with it every batch, the sink callable and the batch metrics, runs in the Connect
    server's Python; the client reads the metrics back from the checkpoint
    (``CheckpointStorage.read_batch_metrics``), so ``checkpoint_location`` must name the same
    storage for the client and the server. ``on_batch`` is refused there (see above).
    """
    if not getattr(df, "isStreaming", False):
        raise ValueError("run_stream needs a streaming DataFrame (spark.readStream...); use run_batch for a batch DataFrame")
    trigger = trigger_of(trigger)
    from .shapes import _output_mode

    _output_mode(output_mode)  # both emit every row fn yields, as Spark's operators do in either mode
    spark = df.sparkSession
    connect = is_connect(spark)
    sink = sink_of(sink)
    if getattr(sink, "session", False) is None:  # a MemorySink named by a string: the view goes to this session
        sink.session = spark
    if connect and on_batch is not None:
        raise ValueError(
            f"on_batch={on_batch!r} cannot run under Spark Connect: the foreachBatch function, and so each "
            "batch's metrics, run in the Connect server's Python process, where a callback's effects are "
            "out of this client's sight; read query.batch_metrics / query.last_batch_metrics instead "
            "(read back from the checkpoint), or pass on_batch with a classic SparkSession"
        )
    if connect:
        _check_connect_location(checkpoint_location)
    if memory_budget is None:
        memory_budget = _memory_budget_conf(spark.conf.get(MEMORY_BUDGET_CONF, None))
    runner = StreamRunner(
        fn,
        input_schema=df.schema,
        key=key,
        output_schema=output_schema,
        checkpoint_location=checkpoint_location,
        sink=sink,
        parallelism=_parallelism(spark, parallelism, max_parallelism),
        max_parallelism=max_parallelism,
        timeout=timeout,
        event_time=event_time,
        watermark_delay_ms=watermark_delay_ms,
        combine_before_shuffle=combine_before_shuffle,
        retain=retain,
        storage_options=storage_options,
        workdir=workdir,
        on_batch=on_batch,
        start_version=start_version,
        checkpoint_key=checkpoint_key,
        memory_budget=memory_budget,
        state_schema=state_schema,
        placement=placement,
        new_placement=_new_placement(spark) if placement is None else placement,
        time_mode=time_mode,
        initial_state=initial_state,
    )
    spark_checkpoint = _spark_checkpoint(checkpoint_location, spark_checkpoint_location)
    watermarked = runner.watermarked(df)
    rows = watermarked.drop(WATERMARK_COLUMN) if watermarked is not df else df
    stream, partitions = rows, None
    stored = _stored_shuffle_partitions(spark_checkpoint)
    if runner.placement == "executor":
        partitions = stored or runner.parallelism
        # The hosting operator is the stateful operator Spark asks whether a batch without data is due.
        no_data = runner.no_data_timeout if _runs_batches_without_data(runner.no_data_timeout, trigger) else None
        stream = runner.hosted_stream(
            watermarked if no_data is not None else rows, host_keys(spark, runner.parallelism, partitions), no_data
        )
        partitions = None if stored else partitions  # a new Spark checkpoint takes the conf at start
    elif runner.streams_tasks:
        stream = runner.streamed_tasks(rows)
    if runner.placement != "executor" and _runs_batches_without_data(runner.no_data_timeout, trigger):
        stream = runner.with_batches_without_data(stream, watermarked)
        if partitions is None and not stored:
            # The branch's state store has a partition per shuffle partition, each a task in every batch.
            partitions = runner.parallelism
    writer = stream.writeStream.foreachBatch(runner).option("checkpointLocation", spark_checkpoint)
    if runner.placement == "executor" or _runs_batches_without_data(runner.no_data_timeout, trigger):
        writer = writer.outputMode("update")  # what Spark's applyInPandasWithState in the plan requires
    if trigger is not None:
        writer = writer.trigger(**dict(trigger))
    if query_name is not None:
        writer = writer.queryName(query_name)
    if partitions is None:
        return OpbufferQuery(writer.start(), runner, connect=connect)
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    try:  # the query copies the session's conf when it starts
        query = writer.start()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    return OpbufferQuery(query, runner, connect=connect)


def trigger_of(trigger: Any) -> Optional[dict[str, Any]]:
    """``DataStreamWriter.trigger``'s keywords from Spark's spellings: ``{"availableNow": True}``,
    ``{"processingTime": "10 seconds"}``, ``{"once": True}``, or the strings ``"availableNow"``,
    ``"once"`` and ``"10 seconds"`` (a processing-time interval). None: Spark's default trigger."""
    if trigger is None:
        return None
    if isinstance(trigger, str):
        text = trigger.strip()
        if text in ("availableNow", "once"):
            return {text: True}
        if text and text[0].isdigit():
            return {"processingTime": text}
    elif isinstance(trigger, Mapping) and len(trigger) == 1 and next(iter(trigger)) in _TRIGGERS:
        return dict(trigger)
    raise ValueError(
        f"trigger must be 'availableNow', 'once', a processing-time interval such as '10 seconds', or one of "
        f"{{'processingTime': '5 seconds'}}, {{'availableNow': True}}, {{'once': True}}, got {trigger!r}"
    )


def _runs_batches_without_data(timeout: str, trigger: Optional[Mapping[str, Any]]) -> bool:
    """Whether the query runs batches without data (see StreamRunner.with_batches_without_data).

    Not with a processing-time timeout under an ``availableNow`` or ``once`` trigger: Spark
    would run a batch without data at every trigger there and the run would never end
    (plain Spark does so); such a run ends when its rows are processed, and the next
    run's batches fire the timeouts then due.
    """
    if timeout == GroupStateTimeout.NoTimeout:
        return False
    ends = trigger is not None and next(iter(trigger)) in ("availableNow", "once")
    return not (timeout == GroupStateTimeout.ProcessingTimeTimeout and ends)


def _initial_state_frame(initial_state: Any, key_columns: list[str]) -> Any:
    """A processor's initial state, checked (a static Spark or pandas DataFrame with the key columns), not read:
    ``_initial_state.prepare`` splits it by instance into the checkpoint storage before a first batch."""
    return _initial_state.check_frame(initial_state, key_columns)
