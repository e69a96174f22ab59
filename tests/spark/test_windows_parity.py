"""Windowed aggregate under run_stream equals Spark's own groupBy(window(...) / session_window(...), key) with
withWatermark in append mode, on the same files (one micro-batch per file).

Both filter a batch's rows by the watermark the previous batch ran with (Spark's
watermark for late events) and close windows by the batch's own; a row between
the two is counted (test_a_row_behind_the_watermark_but_not_the_previous_batchs_counts_as_in_spark).
Spark runs a batch without data when its watermark moves and run_stream does
not, so two closing files with a far-future row of key -1 move both watermarks
past every other window; that key is left out of the comparison.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import buffering
from buffering import Count, Sum
from buffering.windows import Hopping, Session, Tumbling

from .helpers import collect_sink, stream_of, write_batches

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SECOND = 1000
SPAN = 20 * SECOND  # batch b holds event times in [b * SPAN, (b + 1) * SPAN)
DELAY = "20 seconds"
FAR = 10**9
SCHEMA = "k long, ts timestamp, v long"


def _frame(k, ts_ms, v) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "k": np.asarray(k, dtype=np.int64),
            # microseconds with a time zone: parquet's TIMESTAMP(MICROS, UTC), what Spark reads as a timestamp
            "ts": pd.to_datetime(np.asarray(ts_ms, dtype=np.int64), unit="ms", utc=True).astype("datetime64[us, UTC]"),
            "v": np.asarray(v, dtype=np.int64),
        }
    )


def inputs(seed: int, size_ms: int, n: int = 6) -> tuple[list[pd.DataFrame], int]:
    """On-time rows per batch, plus rows late for both engines from batch 4 on; and how many late rows."""
    rng = np.random.default_rng(seed)
    frames, late = [], 0
    for b in range(n):
        count = int(rng.integers(10, 30))
        k = list(rng.integers(0, 6, count))
        ts = list(rng.integers(b * SPAN, (b + 1) * SPAN, count))
        if b >= 4:
            # The late-events watermark of batch b is >= (b - 3) * SPAN: windows ending before are closed.
            lo, hi = (b - 4) * SPAN, (b - 3) * SPAN - size_ms
            extra = int(rng.integers(1, 4))
            k += list(rng.integers(0, 6, extra))
            ts += list(rng.integers(lo, hi, extra))
            late += extra
        frames.append(_frame(k, ts, rng.integers(0, 100, len(k))))
    frames += [_frame([-1], [FAR], [0]), _frame([-1], [FAR + 1], [0])]
    return frames, late


def spark_rows(spark, source: str, checkpoint: str, window_column) -> pd.DataFrame:
    from pyspark.sql import functions as F

    out: list = []
    df = stream_of(spark, source, SCHEMA).withWatermark("ts", DELAY)
    agg = df.groupBy(window_column.alias("w"), "k").agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"))
    agg = agg.select("k", F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"), "n", "s")
    query = (
        agg.writeStream.outputMode("append")
        .foreachBatch(collect_sink(out))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return _rows(out)


def opbuffer_rows(
    spark, source: str, checkpoint: str, window, layout: str = "key", combine: str = "sql", **options
) -> tuple[pd.DataFrame, int]:
    """run_stream's windowed count and sum of v by k over ``source``: its final rows and late rows dropped.

    ``combine``: the combine the runner must have chosen (by default Spark SQL's, per (key, window
    start)); ``options``: more run_stream arguments (placement, combine_before_shuffle).
    """
    out: list = []
    operator = buffering.aggregate({"n": Count(), "s": Sum("v")}, window=window)
    if layout != "key":
        operator = buffering.cached_state(max_entries=40, store="rocksdb", layout=layout)(operator)
    query = buffering.spark.run_stream(
        stream_of(spark, source, SCHEMA),
        operator,
        key="k",
        event_time="ts",
        watermark_delay_ms=20 * SECOND,
        checkpoint_location=checkpoint,
        sink=collect_sink(out),
        trigger={"availableNow": True},
        parallelism=2,
        **options,
    )
    query.awaitTermination()
    assert query.runner.combine == combine
    return _rows(out), sum(m.dropped_late_rows for m in query.batch_metrics)


def _rows(out: list) -> pd.DataFrame:
    frames = [pdf for _, pdf in out if len(pdf)]
    df = pd.concat(frames, ignore_index=True)[["k", "window_start", "window_end", "n", "s"]]
    df = df[df["k"] != -1].astype({"n": "int64", "s": "int64"})
    return df.sort_values(["k", "window_start"]).reset_index(drop=True)


@pytest.mark.parametrize(
    "name, window, spark_window, size_ms",
    [
        ("tumbling", Tumbling("10 seconds"), ("window", "10 seconds"), 10 * SECOND),
        ("hopping", Hopping("10 seconds", "4 seconds"), ("window", "10 seconds", "4 seconds"), 10 * SECOND),
        ("session", Session("3 seconds"), ("session_window", "3 seconds"), 3 * SECOND),
    ],
)
def test_windowed_aggregate_gives_the_final_rows_of_sparks_windowed_aggregation(spark, tmp_path, name, window, spark_window, size_ms):
    from pyspark.sql import functions as F

    frames, late = inputs(11, size_ms)
    if name == "session":  # sessions that only touch (next row exactly one gap later): Spark's merge rule
        frames[1] = pd.concat([frames[1], _frame([9, 9, 9], [25 * SECOND, 28 * SECOND, 31 * SECOND], [1, 2, 3])])
    source = write_batches(str(tmp_path / "in"), frames)
    function, *args = spark_window
    expected = spark_rows(spark, source, str(tmp_path / "spark-ck"), getattr(F, function)("ts", *args))
    got, dropped = opbuffer_rows(spark, source, str(tmp_path / "ck"), window)
    assert len(expected) > 10
    pd.testing.assert_frame_equal(got, expected)
    per_row = -(-10 // 4) if name == "hopping" else 1  # each late row is late in every window it falls in
    assert dropped >= late and dropped <= late * per_row


@pytest.mark.parametrize(
    "name, window, spark_window",
    [
        ("tumbling", Tumbling("10 seconds"), ("window", "10 seconds")),
        ("hopping", Hopping("10 seconds", "4 seconds"), ("window", "10 seconds", "4 seconds")),
    ],
)
def test_windows_kept_as_key_group_blocks_give_sparks_rows(spark, tmp_path, name, window, spark_window):
    from pyspark.sql import functions as F

    frames, _ = inputs(11, 10 * SECOND)
    source = write_batches(str(tmp_path / "in"), frames)
    function, *args = spark_window
    expected = spark_rows(spark, source, str(tmp_path / "spark-ck"), getattr(F, function)("ts", *args))
    got, _ = opbuffer_rows(spark, source, str(tmp_path / "ck"), window, layout="key_group")  # 40 entries: evictions
    assert len(expected) > 10
    pd.testing.assert_frame_equal(got, expected)


def test_windows_of_aggregations_without_a_sql_twin_are_assigned_by_the_instances(spark, tmp_path):
    """First() has no SQL twin: rows reach the instances as they are; the result equals LocalRunner's."""
    from buffering import First, LocalRunner

    frames, late = inputs(12, 10 * SECOND)
    source = write_batches(str(tmp_path / "in"), frames)
    op = buffering.aggregate({"n": Count(), "s": Sum("v"), "first": First("v")}, window=Hopping("10 seconds", "5 seconds"))
    out: list = []
    query = buffering.spark.run_stream(
        stream_of(spark, source, SCHEMA), op, key="k", event_time="ts", watermark_delay_ms=20 * SECOND,
        checkpoint_location=str(tmp_path / "ck"), sink=collect_sink(out), trigger={"availableNow": True}, parallelism=3,
    )
    query.awaitTermination()
    assert query.runner.combine == "none"
    got = _rows_with_first(out)
    runner = LocalRunner(op, key="k", event_time="ts", watermark_delay_ms=20 * SECOND)
    local, local_late = [], 0
    for i, f in enumerate(frames):
        local.append((i, runner.process(f)))
        local_late += runner.stats()["dropped_late_rows"]
    pd.testing.assert_frame_equal(got, _rows_with_first(local), check_dtype=False)
    assert sum(m.dropped_late_rows for m in query.batch_metrics) == local_late >= late > 0


def _rows_with_first(out: list) -> pd.DataFrame:
    df = pd.concat([pdf for _, pdf in out if len(pdf)], ignore_index=True)
    df = df[df["k"] != -1]
    return pd.DataFrame({
        "k": df["k"].astype("int64").to_numpy(),
        "start": pd.to_datetime(df["window_start"], utc=True).astype("datetime64[ms, UTC]").astype("int64").to_numpy(),
        "n": df["n"].astype("int64").to_numpy(), "s": df["s"].astype("int64").to_numpy(),
        "first": df["first"].astype("int64").to_numpy(),
    }).sort_values(["k", "start"]).reset_index(drop=True)



def test_update_mode_gives_the_rows_of_sparks_update_mode(spark, tmp_path):
    """emit="update": every window a batch changed, with its running result, as Spark's outputMode("update")."""
    from pyspark.sql import functions as F

    frames, _ = inputs(13, 10 * SECOND)
    rng = np.random.default_rng(14)
    for b in range(1, 6):  # rows of the previous batch's last window, still open for both: updated twice
        extra = _frame(rng.integers(0, 6, 3), rng.integers((b - 1) * SPAN + 10 * SECOND, b * SPAN, 3), [5, 6, 7])
        frames[b] = pd.concat([frames[b], extra], ignore_index=True)
    source = write_batches(str(tmp_path / "in"), frames)
    spark_out: list = []
    df = stream_of(spark, source, SCHEMA).withWatermark("ts", DELAY)
    agg = df.groupBy(F.window("ts", "10 seconds").alias("w"), "k").agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"))
    agg = agg.select("k", F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"), "n", "s")
    query = (
        agg.writeStream.outputMode("update").foreachBatch(collect_sink(spark_out))
        .option("checkpointLocation", str(tmp_path / "spark-ck")).trigger(availableNow=True).start()
    )
    query.awaitTermination()
    out: list = []
    query = buffering.spark.run_stream(
        stream_of(spark, source, SCHEMA),
        buffering.aggregate({"n": Count(), "s": Sum("v")}, window=Tumbling("10 seconds"), emit="update"),
        key="k", event_time="ts", watermark_delay_ms=20 * SECOND, checkpoint_location=str(tmp_path / "ck"),
        sink=collect_sink(out), trigger={"availableNow": True}, parallelism=2,
    )
    query.awaitTermination()
    expected = _rows(spark_out)  # every update of every window (a multiset: batch ids may differ)
    got = _rows(out)
    assert len(expected) > len(expected.drop_duplicates(["k", "window_start"]))  # some windows updated twice
    pd.testing.assert_frame_equal(
        got.sort_values(["k", "window_start", "n"]).reset_index(drop=True),
        expected.sort_values(["k", "window_start", "n"]).reset_index(drop=True),
    )


def test_windows_under_executor_placement_give_sparks_rows(spark, tmp_path):
    """placement="executor" (instances hosted in Spark's stateful operator, the default on a cluster)."""
    from pyspark.sql import functions as F

    frames, _ = inputs(15, 10 * SECOND)
    source = write_batches(str(tmp_path / "in"), frames)
    expected = spark_rows(spark, source, str(tmp_path / "spark-ck"), F.window("ts", "10 seconds"))
    # The hosted plan's combine is Python's: windows go as rows.
    got, _ = opbuffer_rows(spark, source, str(tmp_path / "ck"), Tumbling("10 seconds"), combine="none", placement="executor")
    pd.testing.assert_frame_equal(got, expected)


@pytest.mark.parametrize(
    "name, window, spark_window",
    [
        ("tumbling", Tumbling("10 seconds"), ("window", "10 seconds")),
        ("hopping", Hopping("10 seconds", "4 seconds"), ("window", "10 seconds", "4 seconds")),
        ("session", Session("3 seconds"), ("session_window", "3 seconds")),
    ],
)
def test_a_row_behind_the_watermark_but_not_the_previous_batchs_counts_as_in_spark(spark, tmp_path, name, window, spark_window):
    """Batch 3 runs with watermark 39.9 s and filters late rows by batch 2's, 19.9 s: its row at 25 s is
    counted in its windows (which batch 3 closes), as Spark's late-events watermark rule counts it."""
    from pyspark.sql import functions as F

    frames = [
        _frame([1, 2], [0, 19_900], [1, 1]),
        _frame([1, 2], [20_000, 39_900], [1, 1]),
        _frame([1, 2], [40_000, 59_900], [1, 1]),
        _frame([1, 2, 1], [60_000, 79_900, 25_000], [1, 1, 5]),
        _frame([-1], [FAR], [0]),
        _frame([-1], [FAR + 1], [0]),
    ]
    source = write_batches(str(tmp_path / "in"), frames)
    function, *args = spark_window
    expected = spark_rows(spark, source, str(tmp_path / "spark-ck"), getattr(F, function)("ts", *args))
    got, dropped = opbuffer_rows(spark, source, str(tmp_path / "ck"), window)
    assert expected.loc[expected["k"] == 1, "s"].max() >= 5  # Spark counted the row at 25 s
    pd.testing.assert_frame_equal(got, expected)
    assert dropped == 0


def test_a_late_row_that_reaches_an_open_session_joins_it_as_in_spark(spark, tmp_path):
    """Batch 3 runs with watermark 39.9 s and filters late rows by batch 2's, 19.9 s. Its row at 36 s is
    behind the batch's watermark, but its session [36 s, 39 s) overlaps key 1's open session [37 s, 42 s)
    (which that watermark does not close): Spark merges them into [36 s, 42 s), and so must run_stream."""
    from pyspark.sql import functions as F

    frames = [
        _frame([1, 2], [0, 19_900], [1, 1]),
        _frame([1, 2], [20_000, 39_900], [1, 1]),
        _frame([1, 1, 2], [37_000, 39_000, 59_900], [1, 2, 1]),
        _frame([1, 2], [36_000, 79_900], [4, 1]),
        _frame([-1], [FAR], [0]),
        _frame([-1], [FAR + 1], [0]),
    ]
    source = write_batches(str(tmp_path / "in"), frames)
    expected = spark_rows(spark, source, str(tmp_path / "spark-ck"), F.session_window("ts", "3 seconds"))
    got, dropped = opbuffer_rows(spark, source, str(tmp_path / "ck"), Session("3 seconds"))
    joined = expected[(expected["k"] == 1) & (expected["window_start"] == pd.Timestamp(36_000, unit="ms"))]
    assert joined[["n", "s"]].values.tolist() == [[3, 7]]  # Spark merged the late row into the open session
    pd.testing.assert_frame_equal(got, expected)
    assert dropped == 0
