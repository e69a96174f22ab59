"""ParquetSink's task-side writing, without Spark: where the tasks write, and how a batch is replaced."""

from __future__ import annotations

import os

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from buffering.spark.sinks import SUCCESS_FILE, ParquetSink, sink_of, write_task_part

SCHEMA = pa.schema([("tweet", pa.int64()), ("views", pa.int64())])


def test_a_local_path_is_written_by_the_tasks(tmp_path):
    assert ParquetSink(str(tmp_path)).local_dir() == str(tmp_path)
    assert ParquetSink(f"file://{tmp_path}").local_dir() == str(tmp_path)
    assert ParquetSink("relative/out").local_dir() == os.path.abspath("relative/out")


def test_a_remote_path_or_task_side_false_is_written_by_spark(tmp_path):
    assert ParquetSink("s3a://bucket/out").local_dir() is None
    assert ParquetSink(str(tmp_path), task_side=False).local_dir() is None
    with pytest.raises(ValueError, match="not written by the tasks"):
        ParquetSink("hdfs://nn/out").batch_dir(3)


def test_write_task_part_writes_one_file_per_task_under_the_batch_directory(tmp_path):
    sink = ParquetSink(str(tmp_path))
    directory = sink.batch_dir(7)
    assert write_task_part(directory, 1, pd.DataFrame({"tweet": [1, 2], "views": [3, 4]}), SCHEMA) == 2
    assert sorted(os.listdir(directory)) == ["part-00001.parquet"]
    assert pq.read_table(os.path.join(directory, "part-00001.parquet")).to_pydict() == {"tweet": [1, 2], "views": [3, 4]}


def test_a_retried_task_replaces_its_own_part(tmp_path):
    directory = ParquetSink(str(tmp_path)).batch_dir(0)
    write_task_part(directory, 0, pd.DataFrame({"tweet": [1], "views": [1]}), SCHEMA)
    write_task_part(directory, 0, pd.DataFrame({"tweet": [1], "views": [2]}), SCHEMA)
    assert pq.read_table(directory).to_pydict() == {"tweet": [1], "views": [2]}


def test_write_task_part_rejects_rows_that_do_not_fit_the_schema(tmp_path):
    directory = ParquetSink(str(tmp_path)).batch_dir(0)
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        write_task_part(directory, 0, pd.DataFrame({"tweet": ["not a number"], "views": [1]}), SCHEMA)
    assert not [n for n in os.listdir(directory) if n.startswith("part-")]


def test_prepare_drops_an_earlier_run_of_the_batch_and_finish_marks_it_complete(tmp_path):
    sink = ParquetSink(str(tmp_path))
    directory = sink.batch_dir(2)
    write_task_part(directory, 4, pd.DataFrame({"tweet": [9], "views": [9]}), SCHEMA)  # earlier run, 5 tasks
    sink.prepare(2)
    assert not os.path.exists(directory)
    write_task_part(directory, 0, pd.DataFrame({"tweet": [1], "views": [1]}), SCHEMA)
    open(os.path.join(directory, ".part-00001-deadbeef.parquet"), "wb").close()  # a failed attempt's leftover
    sink.finish(2)
    assert sorted(os.listdir(directory)) == [SUCCESS_FILE, "part-00000.parquet"]


def test_sink_of_a_parquet_name_is_a_task_side_parquet_sink(tmp_path):
    sink = sink_of(f"parquet:{tmp_path}")
    assert isinstance(sink, ParquetSink) and sink.local_dir() == str(tmp_path)
