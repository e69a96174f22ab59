"""A Spark task's report to the driver (run in this process, no JVM): typed, and how the task got its instances."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pandas as pd
import pytest

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
