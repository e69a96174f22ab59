"""A Spark task's report to the driver (run in this process, no JVM): typed, and how the task got its instances."""

from __future__ import annotations

import pickle
from typing import Iterator, Optional

import numpy as np
import pandas as pd
import pytest

from buffering import ApproxDistinct, Count, LocalRunner, Sum, aggregate, cached_state
from buffering.aggregations import Aggregations, Grouping
from buffering.aggregations.columnar import ColumnarLayout
from buffering.aggregations.sketches import HllPartial
from buffering.local import key_groups_of
from buffering.spark import _task, _workers
from checkpoint import commit
from state.keygroups import operator_indexes

from .helpers import count_sum


@pytest.fixture(autouse=True)
def _close_worker_instances() -> Iterator[None]:
    """The instances a task leaves for the next one live in this process (as in a Python worker)."""
    yield
    _workers.close_all()


def _runner(tmp_path, parallelism: int = 2):
    from pyspark.sql.types import LongType, StructField, StructType

    from buffering.spark.stream import StreamRunner

    schema = StructType([StructField("k", LongType()), StructField("v", LongType())])
    output = StructType([StructField("k", LongType()), StructField("n", LongType()), StructField("s", LongType())])
    return StreamRunner(
        count_sum,
        input_schema=schema,
        key="k",
        output_schema=output,
        checkpoint_location=str(tmp_path / "ckpt"),
        sink="noop",
        parallelism=parallelism,
        workdir=str(tmp_path / "work"),
    )


def _keys_of(runner, partition: int, n: int) -> list[int]:
    """The first ``n`` keys (0, 1, ...) that instance ``partition`` owns."""
    candidates = pd.DataFrame({"k": np.arange(1000, dtype=np.int64)})
    groups = key_groups_of(candidates, ["k"], ("long",), runner.max_parallelism)
    owned = candidates["k"][operator_indexes(groups, runner.parallelism, runner.max_parallelism) == partition]
    return owned.tolist()[:n]


def _run(runner, version: int, partition: int, keys: list[int]) -> _task.TaskSummary:
    """Task ``partition`` of batch ``version`` on rows of ``keys`` (owned by that instance); returns its report."""
    context, _ = runner.context(version)
    frame = pd.DataFrame({"k": keys, "v": np.ones(len(keys), dtype=np.int64), _task.OPERATOR_COLUMN: partition})
    rows = pd.concat(list(_task.run_task(runner.plan, context, iter([frame]), partition_id=partition)))
    (report,) = rows[_task.REPORT_COLUMN].dropna()
    return _task.TaskSummary.from_json(report)


def test_a_task_reports_each_instance_it_ran_with_how_it_got_it_and_its_counters(tmp_path):
    runner = _runner(tmp_path)
    a, b = _keys_of(runner, 1, 2)
    summary = _run(runner, 0, 1, [a, a, b])
    assert summary.partition == 1 and summary.dropped_late_rows == 0
    (instance,) = summary.instances
    assert (instance.instance, instance.start) == (1, _workers.NEW)
    assert instance.report.version == 0 and instance.report.key_groups.start > 0
    assert instance.metrics["rows_in"] == 3.0 and instance.metrics["rows_out"] == 2.0


def _instances_run(runner, partition: int, frame: pd.DataFrame) -> list[tuple[int, float]]:
    """Task ``partition`` of batch 0 on ``frame``: each instance it reported, with its rows in."""
    context, _ = runner.context(0)
    rows = pd.concat(list(_task.run_task(runner.plan, context, iter([frame]), partition_id=partition)))
    (report,) = rows[_task.REPORT_COLUMN].dropna()
    return [(i.instance, i.metrics["rows_in"]) for i in _task.TaskSummary.from_json(report).instances]


def test_rows_without_the_operator_column_all_go_to_the_partitions_own_instance(tmp_path):
    # What the hosting operator sends: each group of rows is one instance's.
    runner = _runner(tmp_path)
    keys = _keys_of(runner, 1, 3)
    frame = pd.DataFrame({"k": keys, "v": np.ones(3, dtype=np.int64)})
    assert _instances_run(runner, 1, frame) == [(1, 3.0)]


def test_rows_with_the_operator_column_go_to_the_instance_it_names(tmp_path):
    runner = _runner(tmp_path)
    keys = _keys_of(runner, 0, 2) + _keys_of(runner, 1, 1)
    frame = pd.DataFrame({"k": keys, "v": np.ones(3, dtype=np.int64), _task.OPERATOR_COLUMN: np.array([0, 0, 1], np.int32)})
    assert _instances_run(runner, 0, frame) == [(0, 2.0), (1, 1.0)]


def test_a_chunk_of_one_instance_comes_whole_without_the_operator_column_and_with_a_fresh_index():
    frame = pd.DataFrame({"k": [5, 6, 7], "v": [1, 2, 3], _task.OPERATOR_COLUMN: np.int32(2)}, index=[10, 11, 12])
    ((index, part),) = _task._instance_parts(frame, partition_id=2)
    assert index == 2
    pd.testing.assert_frame_equal(part, pd.DataFrame({"k": [5, 6, 7], "v": [1, 2, 3]}))


def test_a_chunk_of_several_instances_splits_into_their_rows_in_order_without_the_operator_column():
    ops = np.array([1, 0, 1, 0], np.int32)
    frame = pd.DataFrame({"k": [5, 6, 7, 8], "v": [1, 2, 3, 4], _task.OPERATOR_COLUMN: ops})
    parts = dict(_task._instance_parts(frame, partition_id=0))
    assert sorted(parts) == [0, 1]
    pd.testing.assert_frame_equal(parts[0], pd.DataFrame({"k": [6, 8], "v": [2, 4]}))
    pd.testing.assert_frame_equal(parts[1], pd.DataFrame({"k": [5, 7], "v": [1, 3]}))


def test_the_next_task_in_the_same_worker_resumes_the_instance_it_handed_over(tmp_path):
    runner = _runner(tmp_path, parallelism=1)
    first = _run(runner, 0, 0, [1, 2])
    commit(runner.storage, 0, [i.report for i in first.instances])
    (instance,) = _run(runner, 1, 0, [1]).instances
    assert instance.start == _workers.RESUMED
    assert (instance.metrics["cache_hits"], instance.metrics["cache_misses"]) == (1.0, 0.0)  # its cache is warm


def test_a_task_summary_reads_back_from_its_json_as_it_was_written(tmp_path):
    runner = _runner(tmp_path)
    summary = _run(runner, 0, 0, _keys_of(runner, 0, 3))
    assert _task.TaskSummary.from_json(summary.to_json()) == summary


def test_batch_metrics_list_each_instance_with_its_index_start_and_counters(tmp_path):
    runner = _runner(tmp_path)
    summaries = [_run(runner, 0, 0, _keys_of(runner, 0, 1)), _run(runner, 0, 1, _keys_of(runner, 1, 1) * 2)]
    context, _ = runner.context(0)
    metrics = runner._metrics(0, summaries, 1.0, 0.0, True, context)
    assert metrics.tasks == 2 and metrics.rows_in == 3
    assert [(p["instance"], p["start"], p["rows_in"]) for p in metrics.per_instance] == [(0, "new", 1.0), (1, "new", 2.0)]
    assert metrics.per_instance[1] == {"instance": 1, "start": "new", **summaries[1].instances[0].metrics}


# ---------------------------------------------------------------- Spark SQL partials, in several chunks
def _aggregate_runner(tmp_path, layout: str, aggregations=None, placement=None):
    """A runner of ``aggregate(aggregations)`` (default count n and sum s of v) by k, one instance."""
    from pyspark.sql.types import LongType, StructField, StructType

    from buffering.spark.stream import StreamRunner

    aggregations = aggregations or {"n": Count(), "s": Sum("v")}
    schema = StructType([StructField("k", LongType()), StructField("v", LongType())])
    output = StructType([StructField(name, LongType()) for name in ("k", *aggregations)])
    return StreamRunner(
        cached_state(store="rocksdb", layout=layout)(aggregate(aggregations)),
        input_schema=schema, key="k", output_schema=output, checkpoint_location=str(tmp_path / "ckpt"),
        sink="noop", parallelism=1, workdir=str(tmp_path / "work"), placement=placement,
    )


def _partials(plan, keys: list[int], v: int) -> pd.DataFrame:
    """Rows as Spark's combine sends them: one per key with its partial columns (each key seen twice, v each)."""
    n, (s, s_n) = (p.columns for p in plan.sql_partials)
    count = np.full(len(keys), 2, dtype=np.int64)
    return pd.DataFrame({
        "k": np.asarray(keys, dtype=np.int64), _task.ROWS_COLUMN: count, n[0]: count,
        s: count * v, s_n: count, _task.EVENT_TIME_COLUMN: np.int64(-1), _task.OPERATOR_COLUMN: 0,
    })


def _batch(runner, version: int, frames: list[pd.DataFrame], merges: Optional[list[float]] = None) -> dict[int, tuple[int, int]]:
    context, _ = runner.context(version)
    rows = pd.concat(list(_task.run_task(runner.plan, context, iter(frames), partition_id=0)))
    summary = _task.TaskSummary.from_json(rows[_task.REPORT_COLUMN].dropna().iloc[0])
    commit(runner.storage, version, [i.report for i in summary.instances])
    if merges is not None:
        merges.append(summary.instances[0].metrics["flushes"])
    out = rows[rows[_task.REPORT_COLUMN].isna()]
    return {k: (n, s) for k, n, s in zip(out["k"], out["n"], out["s"])}  # a key's last output row


@pytest.mark.parametrize("layout", ["key", "key_group"])
def test_partials_of_one_instance_in_several_chunks_merge_as_one_frame_would(tmp_path, layout):
    chunked = _aggregate_runner(tmp_path / "chunked", layout)
    whole = _aggregate_runner(tmp_path / "whole", layout)
    assert chunked.plan.combine == "sql"
    keys, merges = list(range(300)), []
    for version, v in enumerate([1, 5]):
        frames = [_partials(chunked.plan, keys[i : i + 70], v) for i in range(0, 300, 70)]
        assert _batch(chunked, version, frames, merges) == _batch(whole, version, [pd.concat(frames, ignore_index=True)])
    assert merges == [1.0, 1.0]  # five chunks, one merge
    assert _batch(chunked, 2, [_partials(chunked.plan, [7], 0)]) == {7: (6, 12)}


@pytest.mark.parametrize("layout", ["key", "key_group"])
def test_a_key_in_two_chunks_is_merged_once_per_chunk(tmp_path, layout):
    runner = _aggregate_runner(tmp_path, layout)
    frames, merges = [_partials(runner.plan, [1, 2], 1), _partials(runner.plan, [2, 3], 10)], []
    assert _batch(runner, 0, frames, merges) == {1: (2, 2), 2: (4, 22), 3: (2, 20)} and merges == [2.0]
    assert _batch(runner, 1, [_partials(runner.plan, [1, 2, 3], 0)]) == {1: (4, 2), 2: (6, 22), 3: (4, 20)}


# ---------------------------------------------------------------- the Python combine's packed partials
PYTHON_AGGS = {"n": Count(), "u": ApproxDistinct("v", lg_k=7)}


def _python_combine_runner(tmp_path, layout: str = "key"):
    return _aggregate_runner(tmp_path, layout, PYTHON_AGGS, placement="executor")


def _raw(seed: int, n: int = 500) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"k": rng.integers(0, 40, n).astype(np.int64), "v": rng.integers(0, 200, n).astype(np.int64)})


@pytest.mark.parametrize("layout", ["key", "key_group"])
def test_the_python_combines_partials_of_several_partitions_merge_as_their_rows_would(tmp_path, layout):
    runner = _python_combine_runner(tmp_path, layout)
    assert runner.plan.combine == "python"
    rows_at_once = LocalRunner(aggregate(PYTHON_AGGS), key="k")
    for version in range(2):
        context, _ = runner.context(version)
        partitions = [_raw(10 * version + p) for p in range(3)]  # the input partitions of one batch
        combined = [f.assign(**{_task.OPERATOR_COLUMN: 0})
                    for p in partitions for f in _task.combine_partition(runner.plan, context, iter([p]))]
        rows = pd.concat(list(_task.run_task(runner.plan, context, iter(combined), partition_id=0)))
        summary = _task.TaskSummary.from_json(rows[_task.REPORT_COLUMN].dropna().iloc[0])
        commit(runner.storage, version, [i.report for i in summary.instances])
        got = rows[rows[_task.REPORT_COLUMN].isna()][["k", "n", "u"]].reset_index(drop=True).astype(np.int64)
        expected = rows_at_once.process(pd.concat(partitions, ignore_index=True))[["k", "n", "u"]]
        pd.testing.assert_frame_equal(got, expected.reset_index(drop=True).astype(np.int64))


def test_the_python_combines_accumulators_unpickle_to_the_partials_of_the_rows(tmp_path):
    runner = _python_combine_runner(tmp_path)
    context, _ = runner.context(0)
    rows = _raw(3)
    (combined,) = _task.combine_partition(runner.plan, context, iter([rows]))
    aggs = Aggregations(PYTHON_AGGS)
    layout = ColumnarLayout.of(aggs)
    keys, expected = zip(*aggs.rows(aggs.partials(rows, ["k"])))  # a sketch per key, updated value by value
    got = [pickle.loads(v) for v in combined[_task.ACCUMULATOR_COLUMN]]
    assert combined["k"].tolist() == list(keys)
    assert all(isinstance(acc["u"], HllPartial) for acc in got)
    # the same counts, coupons and registers (estimates of register arrays differ as any union's do)
    def canonical(accumulators):  # a merge into nothing sorts each key's coupons
        return layout.encode(layout.merge(layout.empty(len(accumulators)), layout.from_accumulators(accumulators)))

    assert canonical(got) == canonical(list(expected))


def test_a_key_twice_in_one_combined_part_is_merged_into_one_row():
    layout = ColumnarLayout.of(PYTHON_AGGS)
    aggs = Aggregations(PYTHON_AGGS)
    part = pd.DataFrame({"k": np.array([1, 1, 2], dtype=np.int64), "v": [5, 6, 7]})
    grouping = Grouping(np.arange(3), 3, None)
    packed = pd.DataFrame({"k": part["k"], _task.ACCUMULATOR_COLUMN: layout.encode(layout.from_rows(aggs, part, grouping)),
                           _task.ROWS_COLUMN: [1, 1, 1]})
    keys, block, rows = _task._keyed_block(layout, [packed], ["k"]).drain()
    assert keys == [1, 2] and rows == [2, 1]
    assert layout.results(block)["n"].tolist() == [2, 1] and layout.results(block)["u"].tolist() == [2, 1]


def test_a_task_failing_while_it_restores_timestamps_is_retried_counting_each_row_once(tmp_path, monkeypatch):
    """The conversion of TIMESTAMP columns (epoch microseconds -> naive UTC) is a step of every chunk: a task
    failing in it, after an earlier chunk was processed, leaves nothing applied."""
    from pyspark.sql.types import LongType, StructField, StructType, TimestampType

    from buffering.spark import _instants
    from buffering.spark.stream import StreamRunner

    schema = StructType([StructField("k", LongType()), StructField("ts", TimestampType()), StructField("v", LongType())])
    output = StructType([StructField("k", LongType()), StructField("n", LongType()), StructField("s", LongType())])
    runner = StreamRunner(
        count_sum, input_schema=schema, key="k", output_schema=output, checkpoint_location=str(tmp_path / "ckpt"),
        sink="noop", parallelism=1, workdir=str(tmp_path / "work"),
    )
    assert runner.plan.instant_columns == ("ts",)

    def chunk(keys: list[int]) -> pd.DataFrame:  # as the plan ships it: ts in epoch microseconds
        return pd.DataFrame({"k": keys, "ts": np.arange(len(keys), dtype=np.int64) * 1000, "v": 1, _task.OPERATOR_COLUMN: 0})

    assert _batch(runner, 0, [chunk([1, 2])]) == {1: (1, 1), 2: (1, 1)}
    restore, calls = _instants.restore, []

    def fails_second(frame, names):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("restore failed")
        return restore(frame, names)

    context, _ = runner.context(1)
    monkeypatch.setattr(_instants, "restore", fails_second)
    with pytest.raises(OSError, match="restore failed"):  # the warm instance merged the first chunk already
        list(_task.run_task(runner.plan, context, iter([chunk([2, 3]), chunk([2])]), partition_id=0))
    monkeypatch.setattr(_instants, "restore", restore)
    assert _batch(runner, 1, [chunk([2, 3]), chunk([2])]) == {2: (3, 3), 3: (1, 1)}
