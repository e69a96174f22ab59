"""run_stream on local Spark: same results as Spark's own applyInPandasWithState, exactly-once, rescalable.

Every test feeds a parquet file source one file per micro-batch and compares
what reached the sink (and the checkpointed state) with a reference run.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest

import buffering
from buffering import ApproxDistinct, Count
from buffering.spark import ParquetSink, run_stream
from checkpoint import read_state
from pyspark.sql.streaming import StatefulProcessor

from .helpers import (
    all_rows,
    collect_sink,
    count_views,
    latest_per_key,
    reference_apply_in_pandas_with_state,
    stream_of,
    views,
    write_batches,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCHEMA = "tweet long, user long, ts long"
STATS_SCHEMA = "tweet long, views long, viewers long"


def tweet_stats(key, rows, state):
    """What a user writes: a count and a HyperLogLog of viewers, updated row by row."""
    from datasketches import hll_sketch

    views_, blob = state.get if state.exists else (0, None)
    sketch = hll_sketch.deserialize(blob) if blob is not None else hll_sketch(12)
    for pdf in rows:
        views_ += len(pdf)
        for user in pdf["user"].tolist():
            sketch.update(int(user))
    state.update((views_, sketch.serialize_compact()))
    yield pd.DataFrame({"tweet": [key[0]], "views": [views_], "viewers": [round(sketch.get_estimate())]})


def dedup(key, rows, state):
    """First-seen (user, tweet) pairs: the state is the user's set of seen tweets (as JSON)."""
    seen = set(json.loads(state.get[0])) if state.exists else set()
    fresh = []
    for pdf in rows:
        for tweet in pdf["tweet"].tolist():
            if tweet not in seen:
                seen.add(tweet)
                fresh.append(tweet)
    state.update((json.dumps(sorted(seen)),))
    yield pd.DataFrame({"user": [key[0]] * len(fresh), "tweet": fresh})


@pytest.fixture(scope="module")
def input_dir(tmp_path_factory):
    return write_batches(str(tmp_path_factory.mktemp("views") / "in"), views(3, 1500, 60, 400))


@pytest.fixture(scope="module")
def stats_reference(spark, input_dir, tmp_path_factory):
    checkpoint = str(tmp_path_factory.mktemp("ref-stats"))
    return reference_apply_in_pandas_with_state(
        spark, input_dir, SCHEMA, tweet_stats, ["tweet"], STATS_SCHEMA, "views long, hll binary", checkpoint
    )


def _run(spark, input_dir, fn, checkpoint, key="tweet", output_schema=STATS_SCHEMA, **kwargs):
    out: list = []
    query = run_stream(
        stream_of(spark, input_dir, SCHEMA),
        fn,
        key=key,
        output_schema=output_schema,
        checkpoint_location=checkpoint,
        sink=kwargs.pop("sink", collect_sink(out)),
        trigger={"availableNow": True},
        **kwargs,
    )
    query.awaitTermination()
    return out, query


@pytest.mark.parametrize("placement", ["batch", "executor"])
def test_decorated_count_and_hll_equals_apply_in_pandas_with_state(spark, input_dir, stats_reference, tmp_path, placement):
    decorated = buffering.cached_state(max_entries=16, store="rocksdb")(buffering.mini_batch()(tweet_stats))
    out, _ = _run(spark, input_dir, decorated, str(tmp_path / "ck"), placement=placement)
    pd.testing.assert_frame_equal(all_rows(out, ["tweet"]), all_rows(stats_reference, ["tweet"]))


def test_final_state_equals_what_apply_in_pandas_with_state_emitted_last(spark, input_dir, stats_reference, tmp_path):
    decorated = buffering.cached_state(max_entries=16, store="rocksdb")(tweet_stats)
    _run(spark, input_dir, decorated, str(tmp_path / "ck"))
    state = read_state(str(tmp_path / "ck")).sort_values("tweet").reset_index(drop=True)
    last = latest_per_key(stats_reference, ["tweet"])
    assert state["tweet"].tolist() == last["tweet"].tolist()
    assert [s[0] for s in state["state"]] == last["views"].tolist()


@pytest.mark.parametrize("placement", ["batch", "executor"])
def test_aggregate_counts_exactly_and_estimates_within_the_hll_error_bound(spark, input_dir, stats_reference, tmp_path, placement):
    operator = buffering.aggregate({"views": Count(), "viewers": ApproxDistinct("user", lg_k=12)})
    out, _ = _run(spark, input_dir, operator, str(tmp_path / "ck"), output_schema=None, placement=placement)
    ours = all_rows(out, ["tweet"])
    ref = all_rows(stats_reference, ["tweet"])
    assert ours[["batch", "tweet", "views"]].equals(ref[["batch", "tweet", "views"]])
    # lg_k=12: relative standard error 1.04/sqrt(4096) = 1.6 %; allow 3 sigma
    assert np.all(np.abs(ours["viewers"].to_numpy() - ref["viewers"].to_numpy()) <= 0.05 * ref["viewers"].to_numpy() + 1)


def test_a_runner_that_ran_batches_still_pickles(spark, input_dir, tmp_path):
    """A foreachBatch function is pickled (Spark Connect sends it to the server): the Spark Columns the
    runner keeps between batches stay out of its pickle."""
    import cloudpickle

    operator = buffering.aggregate({"views": Count()})
    _, query = _run(spark, input_dir, operator, str(tmp_path / "ck"), output_schema=None, combine_before_shuffle=False)
    assert query.runner._columns is not None  # made by the batches that ran
    clone = cloudpickle.loads(cloudpickle.dumps(query.runner))
    assert clone._columns is None and clone.plan == query.runner.plan


def test_an_unpickled_runner_goes_on_with_the_next_batch(spark, input_dir, tmp_path):
    """A runner pickled after it ran batches (as Spark Connect ships it) runs the next batch from the
    committed state: its state then equals a count over every file."""
    import cloudpickle

    source = str(tmp_path / "in")
    os.makedirs(source)
    files = sorted(f for f in os.listdir(input_dir) if f.endswith(".parquet"))
    for name in files[:-1]:
        shutil.copy2(os.path.join(input_dir, name), source)
    decorated = buffering.cached_state(max_entries=16, store="rocksdb")(tweet_stats)
    checkpoint = str(tmp_path / "ck")
    _, query = _run(spark, source, decorated, checkpoint, sink="noop")
    clone = cloudpickle.loads(cloudpickle.dumps(query.runner))
    clone(spark.read.schema(SCHEMA).parquet(os.path.join(input_dir, files[-1])), len(files) - 1)
    counts = pd.read_parquet(input_dir)["tweet"].value_counts().sort_index()
    state = read_state(checkpoint).sort_values("tweet")
    assert state["tweet"].tolist() == counts.index.tolist()
    assert [s[0] for s in state["state"]] == counts.tolist()


@pytest.mark.parametrize("placement", ["batch", "executor"])
def test_aggregate_in_key_group_blocks_gives_the_rows_of_the_per_key_layout(spark, input_dir, tmp_path, placement):
    """cached_state(layout="key_group"), with a restart at another parallelism between the files."""
    rows = {}
    for layout in ("key", "key_group"):
        operator = buffering.cached_state(max_entries=50, store="rocksdb", layout=layout)(
            buffering.aggregate({"views": Count(), "viewers": ApproxDistinct("user", lg_k=12)})
        )
        source = str(tmp_path / f"in-{layout}")
        os.makedirs(source)
        out: list = []
        for i, parallelism in enumerate((2, 3, 3)):
            shutil.copy2(os.path.join(input_dir, f"part-{i:05d}.parquet"), source)
            _run(spark, source, operator, str(tmp_path / f"ck-{layout}"), output_schema=None, parallelism=parallelism,
                 sink=collect_sink(out), placement=placement)
        rows[layout] = all_rows(out, ["tweet"])
        assert len(rows[layout]) > 100
    pd.testing.assert_frame_equal(rows["key_group"], rows["key"])
    pd.testing.assert_frame_equal(
        read_state(str(tmp_path / "ck-key_group")).assign(state=lambda d: d["state"].map(bytes)),
        read_state(str(tmp_path / "ck-key")).assign(state=lambda d: d["state"].map(bytes)),
    )


def test_key_group_blocks_take_watermarks_and_a_memory_budget(spark, input_dir, tmp_path):
    budget = 64 << 20
    rows, queries = {}, {}
    for layout, extra in (("key", {}), ("key_group", {"memory_budget": budget})):
        operator = buffering.cached_state(max_entries=8, store="rocksdb", layout=layout, low_watermark=0.25, high_watermark=0.5)(
            buffering.aggregate({"views": Count(), "viewers": ApproxDistinct("user", lg_k=12)})
        )
        out: list = []
        _, queries[layout] = _run(spark, input_dir, operator, str(tmp_path / f"ck-{layout}"), output_schema=None,
                                  sink=collect_sink(out), **extra)
        rows[layout] = all_rows(out, ["tweet"])
    pd.testing.assert_frame_equal(rows["key_group"], rows["key"])
    instances = [p for m in queries["key_group"].batch_metrics for p in m.per_instance]
    assert all(0 < p["cache_granted_bytes"] <= budget for p in instances)
    assert sum(p["cache_syncs"] for p in instances) > 0


def test_dedup_equals_apply_in_pandas_with_state(spark, input_dir, tmp_path):
    schema = "user long, tweet long"
    ref = reference_apply_in_pandas_with_state(
        spark, input_dir, SCHEMA, dedup, ["user"], schema, "seen string", str(tmp_path / "ref")
    )
    decorated = buffering.cached_state(max_entries=50, store="rocksdb")(dedup)
    out, _ = _run(spark, input_dir, decorated, str(tmp_path / "ck"), key="user", output_schema=schema)
    pd.testing.assert_frame_equal(all_rows(out, ["user", "tweet"]), all_rows(ref, ["user", "tweet"]))


def test_query_reports_cache_and_checkpoint_metrics_per_batch(spark, input_dir, tmp_path):
    decorated = buffering.cached_state(max_entries=8, store="rocksdb")(tweet_stats)
    _, query = _run(spark, input_dir, decorated, str(tmp_path / "ck"))
    metrics = query.batch_metrics
    assert [m.batch_id for m in metrics] == [0, 1, 2]
    assert sum(m.rows_in for m in metrics) == 3 * 1500
    assert all(m.checkpoint_bytes > 0 and m.flushes > 0 for m in metrics)
    assert sum(m.cache_evictions for m in metrics) > 0  # 60 tweets through caches of 8 entries
    # Every call reads its key's state through the cache. Whether a read hits depends on which
    # Python worker Spark hands each task (a cold instance misses), so only the counting is checked.
    assert all(m.cache_hits + m.cache_misses >= m.calls > 0 for m in metrics)
    assert all(0.0 <= m.cache_hit_ratio <= 1.0 for m in metrics)


def test_every_instance_says_how_it_started_new_then_held_by_the_executor(spark, input_dir, tmp_path):
    decorated = buffering.cached_state(max_entries=8, store="rocksdb")(tweet_stats)
    _, query = _run(spark, input_dir, decorated, str(tmp_path / "ck"), parallelism=2)
    starts = [[p["start"] for p in sorted(m.per_instance, key=lambda p: p["instance"])] for m in query.batch_metrics]
    assert starts[0] == ["new", "new"]
    # One executor (local mode): later batches find their instance in this machine's working stores.
    assert all(s in ("resumed", "adopted") for batch in starts[1:] for s in batch), starts


def test_instances_of_a_rescaled_job_are_restored_from_the_checkpoint(spark, tmp_path):
    decorated = buffering.cached_state(max_entries=8, store="rocksdb")(tweet_stats)
    inputs = write_batches(str(tmp_path / "in"), views(2, 300, 20, 50, seed=5))
    checkpoint, offsets = str(tmp_path / "ck"), str(tmp_path / "offsets")
    _run(spark, inputs, decorated, checkpoint, parallelism=2, spark_checkpoint_location=offsets)
    write_batches(inputs, views(3, 300, 20, 50, seed=5))  # one more file
    _, query = _run(spark, inputs, decorated, checkpoint, parallelism=3, spark_checkpoint_location=offsets)
    assert [m.batch_id for m in query.batch_metrics] == [2]
    assert sorted(p["start"] for p in query.batch_metrics[0].per_instance) == ["restored"] * 3


def test_a_checkpoint_keeps_the_placement_it_was_started_with(spark, tmp_path):
    decorated = buffering.cached_state(max_entries=8, store="rocksdb")(tweet_stats)
    inputs = write_batches(str(tmp_path / "in"), views(1, 100, 5, 10, seed=5))
    _run(spark, inputs, decorated, str(tmp_path / "ck"), placement="executor")
    with pytest.raises(ValueError, match="placement='executor', not 'batch'"):
        _run(spark, inputs, decorated, str(tmp_path / "ck"), placement="batch")
    write_batches(inputs, views(2, 100, 5, 10, seed=5))
    _, query = _run(spark, inputs, decorated, str(tmp_path / "ck"))  # no placement: the checkpoint's
    assert query.runner.placement == "executor" and [m.batch_id for m in query.batch_metrics] == [1]


def test_an_unknown_placement_is_refused_naming_it(spark, input_dir, tmp_path):
    with pytest.raises(ValueError, match="placement must be one of \\['executor', 'batch'\\], got 'driver'"):
        _run(spark, input_dir, tweet_stats, str(tmp_path / "ck"), placement="driver")


def test_without_a_combine_the_tasks_are_planned_once_as_part_of_the_streaming_query(spark, input_dir, tmp_path, capsys):
    decorated = buffering.cached_state(max_entries=16, store="rocksdb")(tweet_stats)
    _, query = _run(spark, input_dir, decorated, str(tmp_path / "ck"))
    assert len(query.batch_metrics) > 1
    query.explain()  # the plan of the query's last micro-batch
    assert "MapInPandas" in capsys.readouterr().out


def test_with_spark_sqls_combine_each_batch_gets_a_plan_of_its_own(spark, input_dir, tmp_path, capsys):
    operator = buffering.aggregate({"views": Count()})
    _, query = _run(spark, input_dir, operator, str(tmp_path / "ck"), output_schema=None, combine_before_shuffle=True)
    assert {m.combine for m in query.batch_metrics} == {"sql"}
    query.explain()  # the query reads the rows; the driver plans their combine and the tasks per batch
    assert "MapInPandas" not in capsys.readouterr().out


def test_an_input_column_of_the_reserved_report_name_is_refused_naming_it(spark, tmp_path):
    df = stream_of(spark, write_batches(str(tmp_path / "in"), views(1, 10, 5, 10, seed=5)), SCHEMA)
    with pytest.raises(ValueError, match="may not have a column of the reserved name '__opbuffer_report'"):
        run_stream(df.withColumn("__opbuffer_report", df["tweet"]), tweet_stats, key="tweet",
                   output_schema=STATS_SCHEMA, checkpoint_location=str(tmp_path / "ck"), sink="noop")


def test_a_memory_budget_grants_every_instance_its_bytes_in_the_batch_metrics(spark, input_dir, tmp_path):
    budget = 64 << 20
    decorated = buffering.cached_state(store="rocksdb")(tweet_stats)
    _, query = _run(spark, input_dir, decorated, str(tmp_path / "ck"), memory_budget=budget)
    granted = [p["cache_granted_bytes"] for m in query.batch_metrics for p in m.per_instance]
    assert granted and all(0 < g <= budget for g in granted)


def _fail_first_attempt_midway(marker_dir):
    """tweet_stats that raises in the middle of a partition of batch 1 on the task's first attempt."""

    def fn(key, rows, state):
        from pyspark import TaskContext

        context = TaskContext.get()
        marker = os.path.join(marker_dir, "failed")
        batch = context.getLocalProperty("streaming.sql.batchId")
        if batch == "1" and context.attemptNumber() == 0 and state.exists and state.get[0] > 30:
            if not os.path.exists(marker):
                open(marker, "w").close()
                raise RuntimeError("injected failure in the middle of a partition")
        yield from tweet_stats(key, rows, state)

    return fn


@pytest.mark.parametrize("placement", ["batch", "executor"])
def test_task_failure_in_the_middle_of_a_partition_is_retried_to_the_same_result(spark, input_dir, stats_reference, tmp_path, placement):
    fn = buffering.cached_state(max_entries=16, store="rocksdb")(_fail_first_attempt_midway(str(tmp_path)))
    out, _ = _run(spark, input_dir, fn, str(tmp_path / "ck"), placement=placement)
    assert os.path.exists(tmp_path / "failed"), "the failure was never injected"
    pd.testing.assert_frame_equal(all_rows(out, ["tweet"]), all_rows(stats_reference, ["tweet"]))


@pytest.mark.parametrize("placement", ["batch", "executor"])
def test_rescale_2_to_5_to_3_gives_identical_results(spark, input_dir, stats_reference, tmp_path, placement):
    """Stop after each batch and restart at another parallelism; Spark could not do this with its own state."""
    decorated = buffering.cached_state(max_entries=10, store="rocksdb")(tweet_stats)
    source = str(tmp_path / "in")
    os.makedirs(source)
    out: list = []
    for i, parallelism in enumerate((2, 5, 3)):
        shutil.copy2(os.path.join(input_dir, f"part-{i:05d}.parquet"), source)
        _, query = _run(spark, source, decorated, str(tmp_path / "ck"), parallelism=parallelism, sink=collect_sink(out), placement=placement)
        assert [m.tasks for m in query.batch_metrics] == [parallelism]
    pd.testing.assert_frame_equal(all_rows(out, ["tweet"]), all_rows(stats_reference, ["tweet"]))
    state = read_state(str(tmp_path / "ck")).sort_values("tweet").reset_index(drop=True)
    assert [s[0] for s in state["state"]] == latest_per_key(stats_reference, ["tweet"])["views"].tolist()


@pytest.mark.parametrize("placement", ["batch", "executor"])  # both run their tasks in the streaming plan
def test_a_batch_whose_running_record_cannot_be_written_commits_nothing_and_a_restart_completes_it(
    spark, input_dir, stats_reference, tmp_path, monkeypatch, placement
):
    from checkpoint import CheckpointStorage

    record = CheckpointStorage.record_running_batch
    failed: list[int] = []

    def fails_once_at_batch_1(self, version):
        if version == 1 and not failed:
            failed.append(version)
            raise OSError("injected: the running-batch record cannot be written")
        return record(self, version)

    monkeypatch.setattr(CheckpointStorage, "record_running_batch", fails_once_at_batch_1)
    decorated = buffering.cached_state(max_entries=16, store="rocksdb")(tweet_stats)
    checkpoint, out = str(tmp_path / "ck"), []

    def start():
        return run_stream(
            stream_of(spark, input_dir, SCHEMA), decorated, key="tweet", output_schema=STATS_SCHEMA,
            checkpoint_location=checkpoint, sink=collect_sink(out), trigger={"availableNow": True}, placement=placement,
        )

    with pytest.raises(Exception, match="running-batch record cannot be written"):
        start().awaitTermination()
    assert failed == [1] and CheckpointStorage(checkpoint, create=False).versions() == [0]
    start().awaitTermination()
    pd.testing.assert_frame_equal(all_rows(out, ["tweet"]), all_rows(stats_reference, ["tweet"]))


@pytest.mark.parametrize("placement", ["batch", "executor"])
def test_rerun_of_a_batch_committed_before_a_crash_keeps_its_manifest_and_sink_output(spark, input_dir, stats_reference, tmp_path, placement):
    checkpoint = str(tmp_path / "ck")
    sink = ParquetSink(str(tmp_path / "sink"))
    decorated = buffering.cached_state(max_entries=16, store="rocksdb")(tweet_stats)
    _run(spark, input_dir, decorated, checkpoint, sink=sink, placement=placement)
    # The driver died after committing manifest 2 but before Spark logged batch 2 as done.
    for name in ("2", ".2.crc"):
        os.remove(os.path.join(checkpoint, "_spark", "commits", name))
    _, query = _run(spark, input_dir, decorated, checkpoint, sink=sink, placement=placement)
    assert [(m.batch_id, m.committed) for m in query.batch_metrics] == [(2, False)]
    written = sink.read(spark).toPandas()
    ours = all_rows([(b, g.drop(columns="batch_id")) for b, g in written.groupby("batch_id")], ["tweet"])
    pd.testing.assert_frame_equal(ours, all_rows(stats_reference, ["tweet"]), check_dtype=False)


def expiring(key, rows, state):
    """A key's rows counted, "seen" each batch it has rows; 1 ms of processing time later it is "expired"."""
    if state.hasTimedOut:
        state.remove()
        yield pd.DataFrame({"tweet": [key[0]], "event": ["expired"]})
        return
    state.update((sum(len(pdf) for pdf in rows),))
    state.setTimeoutDuration(1)
    yield pd.DataFrame({"tweet": [key[0]], "event": ["seen"]})


@pytest.mark.parametrize("placement", ["batch", "executor"])
def test_processing_time_timeout_fires_for_keys_without_new_rows(spark, tmp_path, placement):
    frames = [pd.DataFrame({"tweet": [1, 2], "user": [0, 0], "ts": [0, 0]}), pd.DataFrame({"tweet": [2], "user": [0], "ts": [1]})]
    source = write_batches(str(tmp_path / "in"), frames)
    out, _ = _run(spark, source, expiring, str(tmp_path / "ck"), output_schema="tweet long, event string", timeout="processing", placement=placement)
    events = all_rows(out, ["tweet", "event"])
    assert events.values.tolist() == [[1, "seen", 0], [2, "seen", 0], [1, "expired", 1], [2, "seen", 1]]


@pytest.mark.parametrize("placement", ["batch", "executor"])
def test_a_batch_whose_rows_are_all_filtered_out_upstream_still_runs_every_instance(spark, tmp_path, placement):
    def at(n):  # microseconds: Spark reads no nanosecond parquet timestamps
        return pd.Series(pd.Timestamp("2024-01-01", tz="UTC"), index=range(n)).astype("datetime64[us, UTC]")

    frames = [
        pd.DataFrame({"tweet": [1, 2, 3], "user": [0, 0, 0], "ts": [0, 0, 0], "note": ["a", "b", None], "at": at(3)}),
        pd.DataFrame({"tweet": [2], "user": [9], "ts": [1], "note": ["c"], "at": at(1)}),
    ]
    source = write_batches(str(tmp_path / "in"), frames)
    out: list = []
    query = run_stream(
        # the string and timestamp columns: the heartbeats of a batch without rows carry nulls of every input type
        stream_of(spark, source, SCHEMA + ", note string, at timestamp").where("user != 9"), expiring, key="tweet",
        output_schema="tweet long, event string",
        checkpoint_location=str(tmp_path / "ck"), sink=collect_sink(out), trigger={"availableNow": True},
        timeout="processing", placement=placement,
    )
    query.awaitTermination()
    assert [m.tasks for m in query.batch_metrics] == [4, 4]
    events = all_rows(out, ["tweet", "event"])
    assert events.values.tolist() == [[1, "seen", 0], [2, "seen", 0], [3, "seen", 0], [1, "expired", 1], [2, "expired", 1], [3, "expired", 1]]


def sessions(key, rows, state):
    """Events per user until 10 s of event time pass without one (an event-time timeout closes the session)."""
    if state.hasTimedOut:
        (n,) = state.get
        state.remove()
        yield pd.DataFrame({"user": [key[0]], "n": [n], "event": ["closed"]})
        return
    n = state.get[0] if state.exists else 0
    latest = 0
    for pdf in rows:
        n += len(pdf)
        latest = max(latest, int(pdf["ms"].max()))
    state.update((n,))
    state.setTimeoutTimestamp(latest + 10_000)
    yield pd.DataFrame({"user": [key[0]], "n": [n], "event": ["open"]})


@pytest.mark.parametrize("placement", ["batch", "executor"])
def test_event_time_timeouts_and_late_rows_equal_apply_in_pandas_with_state(spark, tmp_path, placement):
    def batch(users, ms):
        ms = np.asarray(ms, dtype=np.int64)
        return pd.DataFrame({"user": np.asarray(users, dtype=np.int64), "ms": ms,
                             # microseconds: Spark reads no nanosecond parquet timestamps
                             "ts": pd.to_datetime(ms, unit="ms", utc=True).astype("datetime64[us, UTC]")})

    frames = [
        batch([1, 1, 2], [1_000, 2_000, 3_000]),
        batch([3], [100_000]),  # the watermark of batch 2 becomes 95 s: user 2's session (13 s) closes there
        batch([4, 1], [200_000, 150_000]),
        # Watermark 195 s: the sessions of users 1 (160 s) and 3 (110 s) close. User 5's row (50 s) is late:
        # it is at or before the watermark the previous batch ran with (95 s), which late rows are
        # filtered by, in Spark and in run_stream.
        batch([6, 5], [300_000, 50_000]),
    ]
    source = write_batches(str(tmp_path / "in"), frames)
    schema = "user long, ms long, ts timestamp"
    output = "user long, n long, event string"
    reference = reference_apply_in_pandas_with_state(
        spark, source, schema, sessions, ["user"], output, "n long", str(tmp_path / "ref"),
        timeout="EventTimeTimeout", watermark=("ts", "5 seconds"),
    )
    out: list = []
    query = run_stream(
        stream_of(spark, source, schema), sessions, key="user", output_schema=output,
        checkpoint_location=str(tmp_path / "ck"), sink=collect_sink(out), trigger={"availableNow": True},
        timeout="event", event_time="ts", watermark_delay_ms=5_000, placement=placement,
    )
    query.awaitTermination()
    ours = all_rows(out, ["user", "event"])
    # availableNow ends with the batch without data that fires the timeouts the last watermark allows
    # (295 s: user 4's session), in Spark and in run_stream.
    expected = all_rows(reference, ["user", "event"])
    pd.testing.assert_frame_equal(ours, expected, check_dtype=False)
    closed = ours[ours["event"] == "closed"]
    assert closed[["batch", "user"]].values.tolist()[:3] == [[2, 2], [3, 1], [3, 3]]
    assert 4 in closed.loc[closed["batch"] == 4, "user"].tolist()
    assert 5 not in ours["user"].tolist()
    assert [m.dropped_late_rows for m in query.batch_metrics] == [0, 0, 0, 1, 0]
    assert query.batch_metrics[-1].rows_in == 0


@pytest.mark.parametrize("placement", ["batch", "executor"])
def test_parquet_sink_written_by_the_tasks_equals_the_one_written_by_spark(spark, input_dir, tmp_path, placement):
    op = buffering.aggregate({"views": Count(), "viewers": ApproxDistinct("user")})
    frames = {}
    for task_side in (True, False):
        sink = ParquetSink(str(tmp_path / f"sink-{task_side}"), task_side=task_side)
        _, query = _run(spark, input_dir, op, str(tmp_path / f"ck-{task_side}"), output_schema=None, sink=sink, placement=placement)
        assert all(m.committed for m in query.batch_metrics)
        written = sink.read(spark)
        frames[task_side] = (written.schema, written.toPandas().sort_values(["batch_id", "tweet"]).reset_index(drop=True))
    assert frames[True][0] == frames[False][0]
    pd.testing.assert_frame_equal(frames[True][1], frames[False][1])
    batches = sorted(os.listdir(tmp_path / "sink-True"))
    assert batches and all(os.path.exists(tmp_path / "sink-True" / b / "_SUCCESS") for b in batches)


@pytest.mark.parametrize("placement", ["batch", "executor"])
def test_state_expired_by_ttl_is_gone_in_the_next_batch(spark, tmp_path, placement):
    """cached_state(ttl_ms=1): a batch starts at least 1 ms of processing time after the one before,
    so every state of batch 0 has expired in batch 1: tweet 1 counts from zero again, tweet 2 is swept."""
    frames = [pd.DataFrame({"tweet": [1, 2], "user": [0, 0], "ts": [0, 0]}), pd.DataFrame({"tweet": [1], "user": [0], "ts": [1]})]
    source = write_batches(str(tmp_path / "in"), frames)
    decorated = buffering.cached_state(ttl_ms=1)(count_views)
    out, _ = _run(spark, source, decorated, str(tmp_path / "ck"), output_schema="tweet long, views long", placement=placement)
    assert all_rows(out, ["tweet"]).values.tolist() == [[1, 1, 0], [2, 1, 0], [1, 1, 1]]
    state = read_state(str(tmp_path / "ck"))
    assert state["tweet"].tolist() == [1] and [s[0] for s in state["state"]] == [1]


@pytest.mark.parametrize("layout", ["key", "key_group"])
def test_an_aggregates_accumulator_expired_by_ttl_counts_from_empty_in_the_next_batch(spark, tmp_path, layout):
    """The same through Spark SQL's combine and a columnar merge: tweet 1's count of batch 0 has expired
    when batch 1 merges into it, and tweet 2's is swept at batch 1's end; with either state layout."""
    frames = [pd.DataFrame({"tweet": [1, 2], "user": [0, 0], "ts": [0, 0]}), pd.DataFrame({"tweet": [1], "user": [0], "ts": [1]})]
    source = write_batches(str(tmp_path / "in"), frames)
    op = buffering.cached_state(ttl_ms=1, store="rocksdb", layout=layout)(buffering.aggregate({"views": Count()}))
    out, query = _run(spark, source, op, str(tmp_path / "ck"), output_schema=None)
    assert query.runner.combine == "sql"
    assert all_rows(out, ["tweet"]).values.tolist() == [[1, 1, 0], [2, 1, 0], [1, 1, 1]]
    state = read_state(str(tmp_path / "ck"))
    assert state["tweet"].tolist() == [1] and [s["views"] for s in state["state"]] == [1]


class ViewCount(StatefulProcessor):
    """A transformWithStateInPandas processor: views per tweet in a ValueState."""

    def init(self, handle):
        self.views = handle.getValueState("views", "views long")

    def handleInputRows(self, key, rows, timerValues):
        views_ = self.views.get()[0] if self.views.exists() else 0
        for pdf in rows:
            views_ += len(pdf)
        self.views.update((views_,))
        yield pd.DataFrame({"tweet": [int(key[0])], "views": [views_]})


def test_a_processor_reports_the_hits_and_misses_of_its_variables_caches(spark, input_dir, tmp_path):
    _, query = _run(spark, input_dir, ViewCount(), str(tmp_path / "ck"), output_schema="tweet long, views long")
    metrics = query.batch_metrics
    # Each call reads its key's count once (get + exists): reads counted over the variable's cache.
    assert all(m.cache_hits + m.cache_misses >= m.calls > 0 for m in metrics)
    assert all(sum(p["cache_entries"] for p in m.per_instance) > 0 for m in metrics)
