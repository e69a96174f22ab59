"""What runs inside a Spark Python worker: one streaming task, and the map-side combine.

Nothing here imports pyspark at module level except ``TaskContext`` (looked
up lazily), so the functions can be unit-tested with plain pandas frames.

A task starts each operator instance at the committed version before its
batch; where it gets it (a warm instance of this worker, a store another
worker left, the checkpoint) is :mod:`._workers`' business. The task's report
to the driver is a :class:`TaskSummary`.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import numpy as np
import pandas as pd

from checkpoint import CheckpointStorage, TaskReport
from state.group_state import NO_TIMESTAMP, GroupStateTimeout
from state.keygroups import operator_indexes
from state.keys import normalize_key
from state.state_schema import StateSchema

from ..aggregations import Grouping
from ..aggregations.columnar import ColumnarLayout
from ..aggregations.engine import _check_columns
from ..buffer import KeyedBlock, factorize_keys
from ..decorators import OperatorSpec
from ..errors import task_error
from ..frames import concat_frames
from ..local import key_groups_of
from ..operator import CACHE_COUNTERS, OperatorInstance
from .. import protocol
from ..protocol import event_time_ms
from ..windows import WINDOW_START
from . import _gc, _initial_state, _instants, _workers
from ._sql_combine import SqlPartial
from ._sql_combine import accumulators as sql_accumulators
from ._sql_combine import columns as sql_columns
from .sinks import write_task_part

#: Output column that carries each task's report (JSON); null on data rows.
REPORT_COLUMN = "__opbuffer_report"
#: Column of pickled accumulators produced by the map-side combine.
ACCUMULATOR_COLUMN = "__opbuffer_acc"
#: Input rows each accumulator stands for.
ROWS_COLUMN = "__opbuffer_rows"
#: Max event time (epoch ms) of the rows behind each accumulator.
EVENT_TIME_COLUMN = "__opbuffer_event_ms"
#: The operator instance (partition) a row is routed to.
OPERATOR_COLUMN = "__opbuffer_op"
#: With placement="executor": the grouping key of Spark's stateful operator that hosts the
#: instances, one value per instance (see host_keys).
HOST_COLUMN = "__opbuffer_host"
#: True on the rows that partition 0 adds, one per instance, so that every instance runs in
#: every batch (its timers fire and it reports) even when no row of the batch reaches it.
HEARTBEAT_COLUMN = "__opbuffer_heartbeat"


@dataclass(frozen=True)
class TaskPlan:
    """Everything a task needs, pickled into the mapInPandas closure once per query."""

    spec: OperatorSpec
    key_columns: list[str]
    key_types: tuple[str, ...]
    parallelism: int
    max_parallelism: int
    location: str
    #: fsspec options of a URL location, one mapping; kept out of repr (they may hold credentials).
    storage_options: dict[str, Any] = field(repr=False)
    output_columns: list[str]
    timeout_conf: str = GroupStateTimeout.NoTimeout
    event_time: Optional[str] = None
    #: How input rows arrive: "none" (as they are), "python" (pickled accumulators in
    #: ACCUMULATOR_COLUMN, from combine_partition) or "sql" (Spark SQL partial columns).
    combine: str = "none"
    #: With combine == "sql": how each output's partial travels.
    sql_partials: tuple[SqlPartial, ...] = ()
    #: Working RocksDB directories go under this directory (default: the temp dir).
    workdir: Optional[str] = None
    query_id: str = ""
    #: A ParquetSink's local directory: tasks write their output rows there (``batch_id=N/part-T``)
    #: and yield only their report row. None: output rows are yielded to Spark.
    sink_dir: Optional[str] = None
    #: The Arrow schema of the output rows (with sink_dir).
    sink_schema: Any = None
    #: Bytes the state caches of every instance of a worker process hold together (None: no budget).
    memory_budget: Optional[int] = None
    #: The key manifests are verified against (the driver's); kept out of repr, so out of any log line.
    checkpoint_key: Optional[bytes] = field(default=None, repr=False)
    #: The state's schema (Spark's stateStructType conversions on store); None: no conversion.
    state_schema: Optional[StateSchema] = None
    #: Spark's micro-batch ``b`` writes version ``b + batch_offset`` (not 0 for an imported checkpoint,
    #: see ``StreamRunner.batch_offset``).
    batch_offset: int = 0
    #: A processor's initial state, applied to each instance before the first version: where each instance's
    #: rows wait in the checkpoint storage (an ``_initial_state.InitialStateFiles``), never the rows themselves.
    initial_state: Any = field(default=None, repr=False)
    #: The input's TIMESTAMP columns: they reach the tasks as epoch microseconds and are turned back
    #: into naive UTC timestamps before anything reads them (see _instants).
    instant_columns: tuple[str, ...] = ()
    #: The output's TIMESTAMP columns: naive times in them are UTC (see _instants).
    instant_outputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class BatchContext:
    """Decided by the driver before a batch runs, identical for every attempt of it."""

    version: int
    previous_version: Optional[int]
    processing_time_ms: int
    watermark_ms: int
    #: What rows are filtered by as late (see protocol.late_rows_watermark); None: ``watermark_ms``.
    late_watermark_ms: Optional[int] = None

    @property
    def late_rows_watermark_ms(self) -> int:
        return self.watermark_ms if self.late_watermark_ms is None else self.late_watermark_ms


@dataclass(frozen=True)
class InstanceReport:
    """What one operator instance did in one task: the checkpoint it wrote and its counters."""

    instance: int
    #: How the task got the instance: ``_workers.RESUMED``, ``ADOPTED``, ``RESTORED`` or ``NEW``.
    start: str
    #: What it wrote for the batch's version (the driver commits it).
    report: TaskReport
    #: Counters of this batch (rows_in, calls, cache_hits, checkpoint_seconds, ...) and gauges
    #: (cache_entries, pending_keys, timers, ...): open-ended, so a mapping of floats.
    metrics: dict[str, float]

    def batch_metrics_entry(self) -> dict[str, Any]:
        """Its entry of ``BatchMetrics.per_instance``: ``instance``, ``start`` and the metrics."""
        return {"instance": self.instance, "start": self.start, **self.metrics}

    def to_dict(self) -> dict[str, Any]:
        return {"instance": self.instance, "start": self.start, "report": self.report.to_dict(), "metrics": self.metrics}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "InstanceReport":
        return cls(
            instance=int(data["instance"]),
            start=str(data["start"]),
            report=TaskReport.from_dict(data["report"]),
            metrics={str(name): float(value) for name, value in data["metrics"].items()},
        )


@dataclass(frozen=True)
class TaskSummary:
    """One task's report to the driver, carried as JSON in REPORT_COLUMN of its last row."""

    partition: int
    instances: tuple[InstanceReport, ...]
    #: Max event time (epoch ms) of the rows the task saw; NO_TIMESTAMP without any.
    max_event_time_ms: int
    dropped_late_rows: int
    #: The task's own time: getting its instances, processing, checkpointing.
    seconds: float

    def to_json(self) -> str:
        return json.dumps(
            {
                "partition": self.partition,
                "instances": [i.to_dict() for i in self.instances],
                "max_event_time_ms": self.max_event_time_ms,
                "dropped_late_rows": self.dropped_late_rows,
                "seconds": self.seconds,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> "TaskSummary":
        data = json.loads(text)
        return cls(
            partition=int(data["partition"]),
            instances=tuple(InstanceReport.from_dict(i) for i in data["instances"]),
            max_event_time_ms=int(data["max_event_time_ms"]),
            dropped_late_rows=int(data["dropped_late_rows"]),
            seconds=float(data["seconds"]),
        )



def drop_late_rows(plan: TaskPlan, frame: pd.DataFrame, watermark_ms: int) -> tuple[pd.DataFrame, int, int]:
    """:func:`buffering.protocol.drop_late_rows` with the plan's event-time column and timeout."""
    return protocol.drop_late_rows(frame, plan.event_time, plan.timeout_conf, watermark_ms)


def combine_partition(plan: TaskPlan, context: BatchContext, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Map side of the shuffle, in Python: one accumulator per key of this input partition.

    Used when an aggregation has no exact Spark SQL twin (see _sql_combine), and
    under placement="executor". Output: the key columns, ACCUMULATOR_COLUMN
    (pickled ``{output: partial}``: a :class:`PackedAccumulator` when the
    aggregations have a column form), ROWS_COLUMN and EVENT_TIME_COLUMN. The
    partition's rows are combined in one vectorized pass
    (:meth:`ColumnarLayout.from_rows`; else Python work per unique key).
    """
    _gc.freeze_in_task()
    aggs = plan.spec.mini_batch.aggregations if plan.spec.mini_batch is not None else None
    assert aggs is not None
    frames = []
    for frame in batches:
        frame = _instants.restore(frame, plan.instant_columns)
        frame, _, _ = drop_late_rows(plan, frame, context.late_rows_watermark_ms)
        if len(frame):
            frames.append(frame)
    if not frames:
        return
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    del frames
    codes, uniques = factorize_keys(frame, plan.key_columns)
    n_keys = len(uniques)
    rows = np.bincount(codes, minlength=n_keys)
    if plan.event_time is not None:
        event = pd.Series(event_time_ms(frame[plan.event_time])).groupby(codes).max().reindex(range(n_keys)).to_numpy(np.int64)
    else:
        event = np.full(n_keys, NO_TIMESTAMP, dtype=np.int64)
    _, first_rows = np.unique(codes, return_index=True)
    data: dict[str, Any] = {name: frame[name].take(first_rows).reset_index(drop=True) for name in plan.key_columns}
    for name in plan.key_columns:
        if name in plan.instant_columns:  # the combined schema carries them as epoch microseconds
            data[name] = _instants.micros(data[name])
    layout = ColumnarLayout.of(aggs)
    if layout is not None:
        # Numpy partials (no sketch object per key) encoded as packed accumulators: each value is the pickle
        # of a PackedAccumulator, and an instance that merges columns decodes a part's values as one block.
        _check_columns(frame, aggs.input_columns, "aggregate")
        data[ACCUMULATOR_COLUMN] = layout.encode(layout.from_rows(aggs, frame, Grouping(codes, n_keys, None)))
    else:
        # partials are indexed by code, in first-appearance order == code order
        partials = aggs.partials(frame.assign(**{OPERATOR_COLUMN: codes}), [OPERATOR_COLUMN])
        data[ACCUMULATOR_COLUMN] = [pickle.dumps(accumulator, 5) for _, accumulator in aggs.rows(partials)]
    data[ROWS_COLUMN] = rows.astype(np.int64)
    data[EVENT_TIME_COLUMN] = event
    yield pd.DataFrame(data)


def combine_and_tag(plan: TaskPlan, host_keys: tuple[int, ...], batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """combine_partition inside a streaming plan, tagged for the hosting operator, in one Python pass.

    The batch's context comes from the driver's record. One pass (not a combine
    then a tag) means one Python worker per task: with one core per executor
    the hosting task then finds the worker that held its instance.
    """
    from pyspark import TaskContext

    context = streaming_batch_context(plan)
    keys = np.asarray(host_keys, dtype=np.int64)
    for frame in combine_partition(plan, context, batches):
        groups = key_groups_of(frame, plan.key_columns, plan.key_types, plan.max_parallelism)
        ops = operator_indexes(groups, plan.parallelism, plan.max_parallelism)
        yield frame.assign(**{OPERATOR_COLUMN: ops.astype(np.int32), HOST_COLUMN: keys[ops], HEARTBEAT_COLUMN: False})
    task = TaskContext.get()
    if task is None or task.partitionId() == 0:
        n = len(keys)
        beats: dict[str, Any] = {name: [None] * n for name in plan.key_columns}
        beats.update(
            {
                ACCUMULATOR_COLUMN: [None] * n,
                ROWS_COLUMN: np.zeros(n, dtype=np.int64),
                EVENT_TIME_COLUMN: np.full(n, NO_TIMESTAMP, dtype=np.int64),
                OPERATOR_COLUMN: np.arange(n, dtype=np.int32),
                HOST_COLUMN: keys,
                HEARTBEAT_COLUMN: np.ones(n, dtype=bool),
            }
        )
        yield pd.DataFrame(beats)


def _storage(plan: TaskPlan) -> CheckpointStorage:
    return CheckpointStorage.of(plan.location, storage_options=plan.storage_options, checkpoint_key=plan.checkpoint_key)


def _counters(instance: OperatorInstance) -> tuple[dict[str, float], dict[str, float]]:
    """The instance's counters (to subtract across a batch) and its gauges (the values now)."""
    stats = instance.stats()
    counters = {name: float(stats[name]) for name in ("rows_in", "flushes", "calls", "timeouts", "rows_out")}
    if "late_rows" in stats:  # a windowed aggregate's rows of closed windows
        counters["late_rows"] = float(stats["late_rows"])
    gauges = {"pending_keys": float(len(instance.buffer)), "timers": float(stats["timers"])}
    caches = instance.cache_stats()  # the state's, or each processor variable's
    if caches:
        for name in CACHE_COUNTERS:
            counters[f"cache_{name}"] = float(sum(c[name] for c in caches))
        gauges.update(
            cache_entries=float(sum(c["entries"] for c in caches)),
            cache_estimated_bytes=float(sum(c["estimated_bytes"] for c in caches)),
        )
        granted = [c["granted_bytes"] for c in caches if c["granted_bytes"] is not None]
        if granted:
            gauges["cache_granted_bytes"] = float(sum(granted))
    return counters, gauges


def _frame(plan: TaskPlan, frames: list[pd.DataFrame]) -> Optional[pd.DataFrame]:
    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        return None
    out = frames[0] if len(frames) == 1 else concat_frames(frames)
    missing = [c for c in plan.output_columns if c not in out.columns]
    if missing:
        raise ValueError(
            f"the operator returned columns {list(out.columns)}, which lack {missing} of output_schema {plan.output_columns}"
        )
    out = _instants.mark_utc(out[plan.output_columns].reset_index(drop=True), plan.instant_outputs)
    out[REPORT_COLUMN] = None
    return out


def run_task(
    plan: TaskPlan,
    context: BatchContext,
    batches: Iterator[pd.DataFrame],
    partition_id: Optional[int] = None,
) -> Iterator[pd.DataFrame]:
    """One partition of one micro-batch: process, fire timers, checkpoint, then yield one report row.

    Rows that carry OPERATOR_COLUMN go to the instance it names; rows without
    it are all the partition's own (see :func:`_instance_parts`). The
    partition's own index (``partition_id``) always gets an instance, so its
    timers fire even when no row arrives. If
    the task fails or is abandoned, its instances are closed and forgotten:
    the retry starts again from the checkpoint.
    """
    if partition_id is None:
        from pyspark import TaskContext

        task_context = TaskContext.get()
        partition_id = task_context.partitionId() if task_context is not None else 0
    _gc.freeze_in_task()
    instances: dict[int, OperatorInstance] = {}
    completed = False
    try:
        yield from _run_task(plan, context, batches, partition_id, instances)
        completed = True
    except Exception as exc:
        # The user's code failed: an error whose message names the key, the call and the batch, and
        # carries them to the driver (see buffering.errors); the user's exception is its cause.
        error = task_error(exc, context.version)
        if error is None:
            raise
        raise error from exc
    finally:
        if not completed:
            for index in instances:
                _workers.discard(plan, index)


def _run_task(
    plan: TaskPlan,
    context: BatchContext,
    batches: Iterator[pd.DataFrame],
    partition_id: int,
    instances: dict[int, OperatorInstance],
) -> Iterator[pd.DataFrame]:
    storage = _storage(plan)
    started = time.perf_counter()
    before: dict[int, dict[str, float]] = {}
    starts: dict[int, str] = {}
    max_event = NO_TIMESTAMP
    dropped = 0
    collected: Optional[list[pd.DataFrame]] = [] if plan.sink_dir is not None else None

    def get(index: int) -> OperatorInstance:
        instance = instances.get(index)
        if instance is None:
            instance, starts[index] = _workers.instance_for(plan, storage, index, context)
            instance.batch = context.version  # named by the errors of the user's code
            instances[index] = instance
            before[index] = _counters(instance)[0]
            if plan.initial_state is not None and context.previous_version is None:
                instance.apply_initial_state(
                    _initial_state.instance_rows(storage, plan.initial_state, index, plan.parallelism),
                    context.processing_time_ms,
                    context.watermark_ms,
                )
        return instance

    def emitted(out: list[pd.DataFrame]) -> list[pd.DataFrame]:
        """The output rows of ``out`` to yield now (none when a sink collects them)."""
        result = _frame(plan, out)
        if result is None:
            return []
        if collected is not None:
            collected.append(result)
            return []
        return [result]

    if 0 <= partition_id < plan.parallelism:
        get(partition_id)
    now, watermark, late_watermark = context.processing_time_ms, context.watermark_ms, context.late_rows_watermark_ms
    # windowed aggregate: combined per (key..., window start) (see StreamRunner.plan_batch)
    combined_keys = plan.key_columns + ([WINDOW_START] if plan.spec.window is not None else [])
    # Spark SQL partials an instance merges as columns, per instance: merged in one call once the input
    # ends (each call's fixed costs, e.g. a write-back of every key group it touches, paid once a batch).
    deferred: dict[int, list[pd.DataFrame]] = {}
    # The Python combine's packed partials, likewise: one block per instance, merged once.
    deferred_blocks: dict[int, list[pd.DataFrame]] = {}
    for frame in batches:
        if not len(frame):
            continue
        frame = _instants.restore(frame, plan.instant_columns)
        for index, part in _instance_parts(frame, partition_id):
            instance = get(index)
            if plan.combine != "none":
                if plan.event_time is not None and len(part):
                    max_event = max(max_event, int(part[EVENT_TIME_COLUMN].max()))
                if plan.combine == "sql" and instance.merges_columns:
                    deferred.setdefault(int(index), []).append(part)
                    continue
                if plan.combine == "python" and instance.merges_columns and plan.spec.window is None:
                    deferred_blocks.setdefault(int(index), []).append(part)
                    continue
                nkeys = _normalized_keys(part, combined_keys)
                rows = part[ROWS_COLUMN].tolist()
                if plan.combine == "sql":
                    accumulators = sql_accumulators(part, list(plan.sql_partials))
                else:
                    accumulators = [pickle.loads(b) for b in part[ACCUMULATOR_COLUMN].tolist()]
                out = instance.process_accumulators(nkeys, accumulators, rows, now, watermark, late_watermark)
            else:
                part, late, event = drop_late_rows(plan, part, late_watermark)
                dropped += late
                max_event = max(max_event, event)
                out = instance.process(part, now, watermark, late_watermark)
            yield from emitted(out)
    for index, parts in deferred.items():
        for part in _merged_parts(parts, combined_keys):
            columns = sql_columns(part, list(plan.sql_partials))
            out = instances[index].process_columns(
                _normalized_keys(part, combined_keys), part[plan.key_columns], columns, part[ROWS_COLUMN].tolist(),
                now, watermark, late_watermark,
            )
            assert out is not None  # merges_columns held when the part was deferred, and nothing buffered since
            yield from emitted(out)
    for index, parts in deferred_blocks.items():
        instance = instances[index]
        assert instance.columnar is not None
        keys, block, rows = _keyed_block(instance.columnar, parts, plan.key_columns).drain()
        out = instance.process_block(keys, block, rows, now)
        assert out is not None  # merges_columns held when the parts were deferred, and nothing buffered since
        yield from emitted(out)
    previous = _workers.manifest(plan, storage, context.previous_version) if context.previous_version is not None else None
    reports: list[InstanceReport] = []
    for index in sorted(instances):
        instance = instances[index]
        yield from emitted(instance.end_of_batch(now, watermark))
        checkpoint_started = time.perf_counter()
        report = instance.checkpoint(context.version, previous)
        checkpoint_seconds = time.perf_counter() - checkpoint_started
        after, gauges = _counters(instance)
        metrics = {name: after[name] - before[index].get(name, 0.0) for name in after}
        metrics.update(gauges, checkpoint_bytes=float(report.bytes), checkpoint_seconds=checkpoint_seconds)
        reports.append(InstanceReport(instance=index, start=starts[index], report=report, metrics=metrics))
    # Hand the working stores over only once every instance has checkpointed.
    for index, instance in instances.items():
        _workers.hand_over(plan, index, instance, context.version)
    if collected is not None:
        # Written before the report row is yielded: a report means the task's output is in place.
        assert plan.sink_dir is not None
        rows = concat_frames(collected).drop(columns=[REPORT_COLUMN]) if collected else (
            pd.DataFrame({name: pd.Series([], dtype=object) for name in plan.output_columns})
        )
        directory = os.path.join(plan.sink_dir, f"batch_id={context.version}")
        write_task_part(directory, partition_id, rows, plan.sink_schema)
    summary = TaskSummary(
        partition=partition_id,
        instances=tuple(reports),
        max_event_time_ms=max_event,
        dropped_late_rows=dropped,
        seconds=time.perf_counter() - started,
    )
    row: dict[str, Any] = {name: [None] for name in plan.output_columns}
    row[REPORT_COLUMN] = [summary.to_json()]
    yield pd.DataFrame(row)


def _instance_parts(frame: pd.DataFrame, partition_id: int) -> Iterator[tuple[int, pd.DataFrame]]:
    """The rows of ``frame`` by operator instance, without OPERATOR_COLUMN (taken out of ``frame`` itself).

    A chunk whose rows all belong to one instance (partition i of the
    shuffle holds exactly instance i's rows) is yielded as it is, with a fresh
    index. A frame without the column is the partition's own instance's: the hosting
    operator groups rows by instance, and drops the column with its own two
    in one copy of each chunk.
    """
    if OPERATOR_COLUMN not in frame.columns:
        yield partition_id, frame
        return
    # The chunk is this task's own: the column is taken out in place, which moves no other column
    # (``drop`` and ``reset_index`` copy every column, about 1 ms a chunk of 10,000 rows in the
    # Spark workers of benchmarks.spark_e2e).
    ops = frame.pop(OPERATOR_COLUMN).to_numpy()
    if len(ops) and ops[0] == ops[-1] and (ops == ops[0]).all():
        index = frame.index
        whole = isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1
        yield int(ops[0]), frame if whole else frame.reset_index(drop=True)
        return
    for index in np.unique(ops).tolist():
        yield int(index), frame.loc[ops == index].reset_index(drop=True)


def run_streamed_task(plan: TaskPlan, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """:func:`run_task` as part of the streaming query's own plan, with the context the driver recorded for the batch."""
    context = streaming_batch_context(plan)
    yield from run_task(plan, context, batches)


# ---------------------------------------------------------------- hosted in Spark's stateful operator
def run_without_rows(plan: TaskPlan, context: BatchContext, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """One instance's batch without input rows (a batch without data): partition i of a range runs instance i."""
    for _ in batches:
        pass
    yield from run_task(plan, context, iter(()))


def streaming_batch_id(storage: CheckpointStorage, batch_offset: int = 0) -> int:
    """The version of the micro-batch this task belongs to (Spark's batch id + ``batch_offset``).

    Spark sets the batch id as a task-local property in the query's own jobs; the
    jobs that Spark Connect's foreachBatch starts run on another thread without
    it, and read the version the driver recorded as running instead.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    value = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
    if value is not None:
        return int(value) + batch_offset
    running = storage.running_batch()
    if running is None:
        raise RuntimeError(
            f"no micro-batch id: no 'streaming.sql.batchId' task property and no running batch recorded in {storage!r}"
        )
    return running


def streaming_batch_context(plan: TaskPlan) -> BatchContext:
    """The context of the micro-batch this task belongs to, as the driver recorded it before the batch
    ran: for tasks in the streaming query's own plan, which get no closure per batch."""
    storage = _storage(plan)
    return recorded_context(storage, streaming_batch_id(storage, plan.batch_offset))


def recorded_context(storage: CheckpointStorage, version: int) -> BatchContext:
    """The context the driver recorded for ``version`` before it ran the batch.

    Read by every task rather than cached: a query restarted in the same
    application may run a batch id again from another committed version.
    """
    record = storage.batch_record(version)
    if record is None or "watermark_ms" not in record:
        raise RuntimeError(f"batch {version} has no recorded context in {storage!r}: the driver records it before the batch runs")
    previous = record.get("previous_version")
    late = record.get("late_watermark_ms")
    return BatchContext(
        version,
        None if previous is None else int(previous),
        int(record["processing_time_ms"]),
        int(record["watermark_ms"]),
        None if late is None else int(late),
    )


#: The watermarked copy of the event time run_stream adds for Spark's batches without data (StreamRunner.watermarked).
WATERMARK_COLUMN = "__opbuffer_event_time"


def no_data_marker(key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """The function of the branch that makes Spark run batches without data (StreamRunner.with_batches_without_data).

    It never gets a row and holds no state: Spark calls nothing in it.
    """
    for _ in frames:
        pass
    return iter(())


def tag_partition(host_keys: tuple[int, ...], output_schema: Any, batches: Iterator[Any]) -> Iterator[Any]:
    """Before the hosting operator (Arrow batches in and out): each row's HOST_COLUMN, plus heartbeats.

    HOST_COLUMN is the host key of the row's instance (OPERATOR_COLUMN, computed
    by the JVM). Partition 0 adds one heartbeat row per instance: Spark calls the
    hosting function only for keys that have rows, and every instance must run
    in every batch, even one whose rows were all filtered out upstream (then the
    heartbeats' types come from ``output_schema``, the declared StructType).
    """
    import pyarrow as pa
    from pyspark import TaskContext

    keys = np.asarray(host_keys, dtype=np.int64)
    schema = None
    for batch in batches:
        ops = batch.column(batch.schema.get_field_index(OPERATOR_COLUMN)).to_numpy(zero_copy_only=False)
        mark = batch.schema.get_field_index(WATERMARK_COLUMN)
        if mark >= 0:  # Spark's late-row filter before the hosting operator must keep every row (see hosted_stream)
            batch = batch.set_column(mark, batch.schema.field(mark), pa.nulls(len(batch), batch.schema.field(mark).type))
        tagged = batch.append_column(HOST_COLUMN, pa.array(keys[ops], pa.int64()))
        tagged = tagged.append_column(HEARTBEAT_COLUMN, pa.array(np.zeros(len(ops), dtype=bool)))
        schema = tagged.schema
        yield tagged
    task = TaskContext.get()
    if task is None or task.partitionId() == 0:
        if schema is None:  # no row in this partition: Spark reads every declared column of the batch
            from pyspark.sql.pandas.types import to_arrow_schema

            schema = to_arrow_schema(output_schema, timezone="UTC")
        yield _heartbeats(keys, schema)


def _heartbeats(keys: np.ndarray, schema: Any) -> Any:
    """One row per instance: its index and host key, the heartbeat flag, nulls in every other column of ``schema``."""
    import pyarrow as pa

    n = len(keys)
    columns = []
    for f in schema:
        if f.name == OPERATOR_COLUMN:
            columns.append(pa.array(np.arange(n), f.type))
        elif f.name == HOST_COLUMN:
            columns.append(pa.array(keys, f.type))
        elif f.name == HEARTBEAT_COLUMN:
            columns.append(pa.array(np.ones(n, dtype=bool)))
        else:
            columns.append(pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def host_instance(
    plan: TaskPlan,
    host_keys: tuple[int, ...],
    dtypes: tuple[tuple[str, str], ...],
    timeout: str,
    key: tuple[Any, ...],
    frames: Iterator[pd.DataFrame],
    state: Any,
) -> Iterator[pd.DataFrame]:
    """The function of the hosting ``applyInPandasWithState``: one operator instance's whole batch.

    Spark's state store coordinator sends the task of each stateful partition to
    the executor that loaded its state store last, so the instance finds its warm
    cache in this process. Spark's own state (``state``) stays empty: the
    instance's state lives in opbuffer's stores and checkpoints.

    ``dtypes``: the integer and boolean columns with their numpy dtypes. A chunk
    that held a heartbeat row (nulls) reaches pandas as float or object; without
    the heartbeat it gets its own dtypes back, as fn would see them under Spark
    (a column with a null of its own stays as Spark hands it). ``timeout``: the
    hosting operator's GroupStateTimeout (see StreamRunner.hosted_stream).
    """
    index = host_keys.index(int(key[0]))
    context = streaming_batch_context(plan)

    def rows() -> Iterator[pd.DataFrame]:
        for frame in frames:
            beat = frame[HEARTBEAT_COLUMN].to_numpy(dtype=bool, na_value=False)
            if beat.all():
                continue
            if beat.any():
                frame = frame.loc[~beat].reset_index(drop=True)
                frame = frame.astype(
                    {name: dtype for name, dtype in dtypes if frame[name].dtype != dtype and frame[name].notna().all()}
                )
            yield frame.drop(columns=[HOST_COLUMN, HEARTBEAT_COLUMN, OPERATOR_COLUMN, WATERMARK_COLUMN], errors="ignore")

    yield from run_task(plan, context, rows(), partition_id=index)
    _call_again_without_data(state, timeout)


def _call_again_without_data(state: Any, timeout: str) -> None:
    """Have Spark call this host in the next batch without data too (a timeout of the hosting operator).

    A batch without data holds no rows, so no heartbeat: the host's group is
    called only if its own timeout is due. Processing time: due at the next
    trigger; event time: due once the watermark moves past the current one,
    which is when Spark runs such a batch.
    """
    from state.group_state import GroupStateTimeout

    if timeout == GroupStateTimeout.NoTimeout:
        return
    state.update((0,))
    if timeout == GroupStateTimeout.ProcessingTimeTimeout:
        state.setTimeoutDuration(1)
    else:
        state.setTimeoutTimestamp(max(1, int(state.getCurrentWatermarkMs())))


def _keyed_block(layout: ColumnarLayout, parts: list[pd.DataFrame], key_columns: list[str]) -> KeyedBlock:
    """The Python combine's parts (packed accumulators, a row per key and input partition) as one block."""
    keyed = KeyedBlock(layout)
    pending = [(part, _normalized_keys(part, key_columns)) for part in parts]
    while pending:
        part, nkeys = pending.pop(0)
        if len(set(nkeys)) < len(nkeys):  # values that normalize to one key (1 and 1.0): the repeats go in next
            again = pd.Series(nkeys, dtype=object).duplicated().to_numpy()
            pending.insert(0, (part.loc[again], [k for k, a in zip(nkeys, again) if a]))
            part, nkeys = part.loc[~again], [k for k, a in zip(nkeys, again) if not a]
        keyed.add(nkeys, layout.decode(part[ACCUMULATOR_COLUMN].tolist()), part[ROWS_COLUMN].tolist())
    return keyed


def _merged_parts(parts: list[pd.DataFrame], key_columns: list[str]) -> list[pd.DataFrame]:
    """The parts as one frame when no key is in two of them (Spark's combine sends one row per key),
    else as they are (a merge takes each key once)."""
    if len(parts) == 1:
        return parts
    whole = pd.concat(parts, ignore_index=True)
    return [whole] if not whole.duplicated(key_columns).any() else parts


def _normalized_keys(frame: pd.DataFrame, key_columns: list[str]) -> list[Any]:
    columns = [frame[c] for c in key_columns]
    if all(column.dtype == np.int64 for column in columns):
        # An int64 is its own normalized element (a bare int of 64 bits); so is a tuple of them.
        if len(columns) == 1:
            return columns[0].tolist()
        return list(zip(*(column.tolist() for column in columns)))
    if len(key_columns) == 1:
        return [normalize_key(v) for v in columns[0].tolist()]
    return [normalize_key(tuple(row)) for row in frame[key_columns].itertuples(index=False, name=None)]
