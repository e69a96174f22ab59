"""run_stream with its checkpoint in an object store: an S3 API server (moto) reached through s3fs.

Spark's own offsets stay on a local path (``spark_checkpoint_location``): pip's
pyspark has no Hadoop S3 file system. Results must equal those of a run whose
checkpoint is a local path.
"""

from __future__ import annotations

import os
import shutil

import pandas as pd
import pytest

import buffering
from buffering.spark import run_stream
from checkpoint import CheckpointStorage, read_state

from .helpers import all_rows, collect_sink, count_views, stream_of, views, write_batches

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCHEMA = "tweet long, user long, ts long"
OUTPUT = "tweet long, views long"


OPERATOR = buffering.cached_state(max_entries=8, store="rocksdb")(count_views)


@pytest.fixture(scope="module")
def input_dir(tmp_path_factory):
    return write_batches(str(tmp_path_factory.mktemp("views") / "in"), views(3, 600, 40, 100))


def _run(spark, source, checkpoint, spark_checkpoint, out, **kwargs):
    query = run_stream(
        stream_of(spark, source, SCHEMA),
        OPERATOR,
        key="tweet",
        output_schema=OUTPUT,
        checkpoint_location=checkpoint,
        spark_checkpoint_location=spark_checkpoint,
        sink=collect_sink(out),
        trigger={"availableNow": True},
        **kwargs,
    )
    query.awaitTermination()
    return query


@pytest.fixture(scope="module")
def local_result(spark, input_dir, tmp_path_factory):
    """What a run whose checkpoint is a local path emits."""
    base = tmp_path_factory.mktemp("local")
    out: list = []
    _run(spark, input_dir, str(base / "ck"), str(base / "spark"), out)
    return all_rows(out, ["tweet"])


def test_run_stream_on_s3_emits_what_a_local_checkpoint_does(spark, input_dir, local_result, s3_location, s3_options, tmp_path):
    out: list = []
    query = _run(spark, input_dir, s3_location, str(tmp_path / "spark"), out, storage_options=s3_options)
    pd.testing.assert_frame_equal(all_rows(out, ["tweet"]), local_result)
    assert [m.batch_id for m in query.batch_metrics] == [0, 1, 2]
    assert CheckpointStorage(s3_location, storage_options=s3_options, create=False).versions() == [0, 1, 2]


def test_run_stream_on_s3_restarts_at_another_parallelism(spark, input_dir, local_result, s3_location, s3_options, tmp_path):
    source = str(tmp_path / "in")
    os.makedirs(source)
    out: list = []
    for i, parallelism in enumerate((2, 3)):
        shutil.copy2(os.path.join(input_dir, f"part-{i:05d}.parquet"), source)
        query = _run(spark, source, s3_location, str(tmp_path / "spark"), out,
                     storage_options=s3_options, parallelism=parallelism)
        assert [(m.batch_id, m.tasks) for m in query.batch_metrics] == [(i, parallelism)]
    expected = local_result[local_result["batch"] < 2].reset_index(drop=True)
    pd.testing.assert_frame_equal(all_rows(out, ["tweet"]), expected)
    state = read_state(s3_location, storage_options=s3_options).sort_values("tweet").reset_index(drop=True)
    last = expected.groupby("tweet")["views"].max()
    assert [s[0] for s in state["state"]] == last.tolist()
