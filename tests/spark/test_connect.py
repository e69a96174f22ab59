"""run_stream and run_batch through Spark Connect (``SparkSession.builder.remote("sc://...")``).

Against a local Connect server the tests start and stop (``conftest.connect_url``). The
foreachBatch function runs in the server's Python, so the sinks here are parquet
directories read back with pandas, and the checkpoint is a path the server and the
client both see (one machine: a tmp_path). Answers are computed by hand with pandas.
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

import buffering
from buffering import Count
from buffering.spark import run_batch, run_stream
from checkpoint import read_state

from .helpers import stream_of, views, write_batches

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCHEMA = "tweet long, user long, ts long"
FRAMES = views(3, 1500, 60, 400)
PARALLELISM = 2


@pytest.fixture(scope="module")
def input_dir(tmp_path_factory):
    return write_batches(str(tmp_path_factory.mktemp("connect-views") / "in"), FRAMES)


def _cumulative_views() -> pd.DataFrame:
    """What every batch emits, by hand: per tweet in batch b, its views in batches 0..b."""
    rows = []
    totals: dict[int, int] = {}
    for b, frame in enumerate(FRAMES):
        counts = frame["tweet"].value_counts()
        for tweet, n in counts.items():
            totals[int(tweet)] = totals.get(int(tweet), 0) + int(n)
        rows.extend({"batch_id": b, "tweet": int(t), "views": totals[int(t)]} for t in counts.index)
    return pd.DataFrame(rows).sort_values(["batch_id", "tweet"]).reset_index(drop=True)


def _sink_rows(directory: str, columns: list[str]) -> pd.DataFrame:
    """Every batch a ParquetSink wrote, with its batch id, sorted."""
    frames = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("batch_id="):
            frame = pd.read_parquet(os.path.join(directory, name))
            frames.append(frame.assign(batch_id=int(name.split("=", 1)[1])))
    out = pd.concat(frames, ignore_index=True)[["batch_id", *columns]]
    return out.sort_values(["batch_id", *columns[:1]]).reset_index(drop=True)


def _run(spark, input_dir, fn, tmp_path, **kwargs):
    query = run_stream(
        stream_of(spark, input_dir, SCHEMA),
        fn,
        key="tweet",
        checkpoint_location=str(tmp_path / "ck"),
        sink=f"parquet:{tmp_path / 'out'}",
        trigger={"availableNow": True},
        parallelism=PARALLELISM,
        **kwargs,
    )
    query.awaitTermination()
    return query


def views_so_far(key, rows, state):
    """An applyInPandasWithState-style function: the tweet's views so far, kept in state as JSON."""
    views_ = json.loads(state.get[0]) if state.exists else 0
    for pdf in rows:
        views_ += len(pdf)
    state.update((json.dumps(views_),))
    yield pd.DataFrame({"tweet": [key[0]], "views": [views_]})


def test_an_aggregate_through_connect_emits_each_batchs_running_counts(connect, input_dir, tmp_path):
    _run(connect, input_dir, buffering.aggregate({"views": Count()}), tmp_path)
    ours = _sink_rows(str(tmp_path / "out"), ["tweet", "views"])
    pd.testing.assert_frame_equal(ours, _cumulative_views(), check_dtype=False)


def test_a_decorated_function_through_connect_emits_the_running_counts_and_checkpoints_the_final_ones(
    connect, input_dir, tmp_path
):
    decorated = buffering.cached_state(max_entries=16, store="rocksdb")(buffering.mini_batch()(views_so_far))
    _run(connect, input_dir, decorated, tmp_path, output_schema="tweet long, views long")
    expected = _cumulative_views()
    pd.testing.assert_frame_equal(_sink_rows(str(tmp_path / "out"), ["tweet", "views"]), expected, check_dtype=False)
    state = read_state(str(tmp_path / "ck")).sort_values("tweet").reset_index(drop=True)
    final = expected.groupby("tweet")["views"].max()
    assert state["tweet"].tolist() == final.index.tolist()
    assert [json.loads(s[0]) for s in state["state"]] == final.tolist()


def test_batch_metrics_of_a_connect_query_reach_the_client(connect, input_dir, tmp_path):
    query = _run(connect, input_dir, buffering.aggregate({"views": Count()}), tmp_path)
    metrics = query.batch_metrics
    assert [m.batch_id for m in metrics] == [0, 1, 2]
    assert [m.rows_in for m in metrics] == [len(f) for f in FRAMES]
    assert [m.tasks for m in metrics] == [PARALLELISM] * 3
    assert [sorted(p["instance"] for p in m.per_instance) for m in metrics] == [[0, 1]] * 3
    assert query.last_batch_metrics == metrics[-1]


def test_a_restarted_connect_query_reports_only_the_batches_it_ran(connect, tmp_path):
    source = str(tmp_path / "in")
    write_batches(source, FRAMES[:2])
    _run(connect, source, buffering.aggregate({"views": Count()}), tmp_path)
    write_batches(source, FRAMES)  # the third file arrives; the first two are rewritten unchanged
    again = _run(connect, source, buffering.aggregate({"views": Count()}), tmp_path)
    assert [m.batch_id for m in again.batch_metrics] == [2]


def test_on_batch_under_connect_is_a_value_error_before_the_query_starts(connect, input_dir, tmp_path):
    with pytest.raises(ValueError, match="on_batch=.* cannot run under Spark Connect"):
        _run(connect, input_dir, buffering.aggregate({"views": Count()}), tmp_path, on_batch=print)
    assert connect.streams.active == []


def test_a_relative_checkpoint_path_under_connect_is_a_value_error_naming_it(connect, input_dir):
    with pytest.raises(ValueError, match="'ck/relative' is a relative path"):
        run_stream(
            stream_of(connect, input_dir, SCHEMA),
            buffering.aggregate({"views": Count()}),
            key="tweet",
            checkpoint_location="ck/relative",
            sink="noop",
        )


def test_run_batch_through_connect_counts_every_key(connect, input_dir):
    out = run_batch(connect.read.parquet(input_dir), buffering.aggregate({"views": Count()}), key="tweet", parallelism=PARALLELISM)
    try:
        ours = out.toPandas().sort_values("tweet").reset_index(drop=True)
    finally:
        out.unpersist()
    expected = pd.concat(FRAMES)["tweet"].value_counts().sort_index()
    assert ours["tweet"].tolist() == expected.index.tolist()
    assert ours["views"].tolist() == expected.tolist()


def test_run_batch_through_connect_shows_the_tasks_the_server_reports(connect, input_dir, capsys):
    out = run_batch(connect.read.parquet(input_dir), buffering.aggregate({"views": Count()}), key="tweet", parallelism=PARALLELISM)
    out.unpersist()
    bar = capsys.readouterr().err.rstrip().rsplit("\r", 1)[-1]
    assert bar.startswith("run_batch: 100%")
    assert "60 rows" in bar




@pytest.mark.parametrize("placement", ["batch", "executor"])
def test_both_placements_through_connect_emit_each_batchs_running_counts(connect, input_dir, tmp_path, placement):
    query = _run(connect, input_dir, buffering.aggregate({"views": Count()}), tmp_path, placement=placement)
    pd.testing.assert_frame_equal(_sink_rows(str(tmp_path / "out"), ["tweet", "views"]), _cumulative_views(), check_dtype=False)
    assert [m.batch_id for m in query.batch_metrics] == [0, 1, 2]
