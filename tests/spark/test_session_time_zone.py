"""run_stream in a Spark session whose time zone is not UTC.

Spark gives pandas ``TIMESTAMP`` values as naive wall-clock times of the session
time zone; opbuffer reads naive times as UTC. These tests run with
``spark.sql.session.timeZone`` = America/Los_Angeles (UTC-8, with daylight
saving) and check that timestamp keys, event times and windows are the instants
Spark means (before buffering/spark/_instants.py, a timestamp key failed every
batch and a windowed aggregate of raw rows emitted nothing).
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.streaming import StatefulProcessor

import buffering
from buffering import Count, First, Sum
from buffering.windows import Tumbling

from .helpers import collect_sink, stream_of, write_batches
from .test_windows_parity import SCHEMA, SECOND, inputs, opbuffer_rows, spark_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ZONE = "America/Los_Angeles"


@pytest.fixture
def los_angeles(spark):
    """The shared session with its time zone set to ZONE for one test (streaming queries take it at start)."""
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", ZONE)
    try:
        yield spark
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)


@pytest.mark.parametrize("combine", [False, None], ids=["raw-rows", "default"])
def test_windows_equal_sparks_own_in_a_session_time_zone_other_than_utc(los_angeles, tmp_path, combine):
    frames, _ = inputs(21, 10 * SECOND)
    source = write_batches(str(tmp_path / "in"), frames)
    from pyspark.sql import functions as F

    expected = spark_rows(los_angeles, source, str(tmp_path / "spark-ck"), F.window("ts", "10 seconds"))
    got, _ = opbuffer_rows(
        los_angeles, source, str(tmp_path / "ck"), Tumbling("10 seconds"),
        combine="none" if combine is False else "sql", combine_before_shuffle=combine,
    )
    assert len(expected) > 10
    pd.testing.assert_frame_equal(got, expected)


@pytest.mark.parametrize(
    "placement, extra",
    [("batch", {}), ("executor", {}), ("batch", {"first": First("v")})],
    ids=["sql-combine", "executor", "python-combine"],  # First() has no SQL twin: the Python combine
)
def test_a_timestamp_key_counts_each_instant_in_a_session_time_zone_other_than_utc(los_angeles, tmp_path, placement, extra):
    frames, _ = inputs(22, 10 * SECOND)
    frames = [f.assign(ts=f["ts"].dt.floor("5s")) for f in frames]  # several rows per instant
    source = write_batches(str(tmp_path / "in"), frames)
    out: list = []
    query = buffering.spark.run_stream(
        stream_of(los_angeles, source, SCHEMA), buffering.aggregate({"n": Count(), "s": Sum("v"), **extra}), key="ts",
        checkpoint_location=str(tmp_path / "ck"), sink=collect_sink(out), trigger={"availableNow": True},
        parallelism=3, placement=placement,
    )
    query.awaitTermination()
    assert query.runner.combine == ("python" if extra or placement == "executor" else "sql")
    # Spark's own count per instant, read back through the same session (naive wall-clock times of ZONE).
    expected = (
        los_angeles.read.schema(SCHEMA).parquet(source).groupBy("ts").agg({"*": "count", "v": "sum"}).toPandas()
        .rename(columns={"count(1)": "n", "sum(v)": "s"}).sort_values("ts").reset_index(drop=True)
    )
    rows = pd.concat([pdf for _, pdf in out if len(pdf)], ignore_index=True)
    got = rows.groupby("ts", as_index=False).last()[["ts", "n", "s"]]  # a key's last row holds its totals
    pd.testing.assert_frame_equal(
        got.astype({"n": "int64", "s": "int64"}), expected[["ts", "n", "s"]].astype({"n": "int64", "s": "int64"})
    )


def _epoch_micros_seen(key, rows, state):
    """The smallest event time of each key as the function sees it, a naive time read as UTC, in epoch microseconds."""
    seen = min(pd.Timestamp(t).value // 1000 for pdf in rows for t in pdf["ts"])
    yield pd.DataFrame({"k": [key[0]], "seen": [seen]})


def test_a_function_sees_timestamps_as_naive_utc_as_under_local_runner(los_angeles, tmp_path):
    base = dt.datetime(2026, 3, 8, 9, 30, tzinfo=dt.timezone.utc)  # 01:30 in ZONE, before the spring-forward gap
    ts = pd.to_datetime([base + dt.timedelta(minutes=m) for m in (0, 45, 90, 135)]).astype("datetime64[us, UTC]")
    frame = pd.DataFrame({"k": np.arange(4, dtype=np.int64), "ts": ts, "v": np.zeros(4, dtype=np.int64)})
    source = write_batches(str(tmp_path / "in"), [frame])
    out: list = []
    query = buffering.spark.run_stream(
        stream_of(los_angeles, source, SCHEMA), buffering.cached_state()(_epoch_micros_seen), key="k",
        output_schema="k long, seen long", checkpoint_location=str(tmp_path / "ck"), sink=collect_sink(out),
        trigger={"availableNow": True}, parallelism=2,
    )
    query.awaitTermination()
    got = pd.concat([pdf for _, pdf in out], ignore_index=True).sort_values("k")["seen"].tolist()
    local = buffering.LocalRunner(buffering.cached_state()(_epoch_micros_seen), key="k").process(frame)
    assert got == local.sort_values("k")["seen"].tolist() == ts.as_unit("us").astype("int64").tolist()


def _first_seen(key, rows, state):
    """The key (a timestamp) as the function sees it, read as UTC, in epoch microseconds; and its rows."""
    yield pd.DataFrame({"ts": [key[0]], "seen": [pd.Timestamp(key[0]).value // 1000], "n": [sum(len(p) for p in rows)]})


def test_run_batch_gives_timestamps_as_naive_utc_and_writes_them_back_as_the_same_instants(los_angeles, tmp_path):
    ts = pd.to_datetime(["2026-11-01 08:30", "2026-11-01 09:30", "2026-11-01 09:30"], utc=True).astype("datetime64[us, UTC]")
    frame = pd.DataFrame({"k": [1, 2, 3], "ts": ts, "v": [0, 0, 0]})  # 01:30 in ZONE twice: the repeated hour
    source = write_batches(str(tmp_path / "in"), [frame])
    df = los_angeles.read.schema(SCHEMA).parquet(source)
    out = buffering.spark.run_batch(df, _first_seen, key="ts", output_schema="ts timestamp, seen long, n long")
    got = out.select(F_unix_micros("ts").alias("instant"), "seen", "n").toPandas().sort_values("seen")
    expected = ts.unique().as_unit("us").astype("int64").tolist()
    assert got["instant"].tolist() == got["seen"].tolist() == expected
    assert got["n"].tolist() == [1, 2]


def F_unix_micros(name):
    from pyspark.sql import functions as F

    return F.unix_micros(F.col(name))


def test_an_event_time_of_wall_clock_times_is_refused_naming_it(spark, tmp_path):
    frames, _ = inputs(23, 10 * SECOND)
    source = write_batches(str(tmp_path / "in"), [f.assign(ts=f["ts"].dt.tz_localize(None)) for f in frames[:1]])
    with pytest.raises(ValueError, match="event_time column 'ts' is a TIMESTAMP_NTZ"):
        buffering.spark.run_stream(
            stream_of(spark, source, "k long, ts timestamp_ntz, v long"),
            buffering.aggregate({"n": Count()}, window=Tumbling("10 seconds")), key="k", event_time="ts",
            checkpoint_location=str(tmp_path / "ck"), sink=collect_sink([]), trigger={"availableNow": True},
        )


class SeededInstants(StatefulProcessor):
    """Keyed by a timestamp, its initial state another timestamp per key: each key reports its own instant
    and the seeded one as the processor sees them, read as UTC (epoch microseconds)."""

    def init(self, handle):
        self.seeded = handle.getValueState("seeded", "at long")

    def handleInitialState(self, key, initialState, timerValues):
        self.seeded.update((pd.Timestamp(initialState.at[0, "at"]).value // 1000,))

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(pdf) for pdf in rows)
        at = self.seeded.get()[0] if self.seeded.exists() else -1
        yield pd.DataFrame({"key": [pd.Timestamp(key[0]).value // 1000], "at": [at], "n": [n]})

    def close(self):
        pass


def test_a_processors_initial_state_reaches_its_keys_as_naive_utc_instants(los_angeles, tmp_path):
    base = pd.Timestamp("2026-11-01 08:30", tz="UTC")  # 01:30 in ZONE, the hour that repeats
    keys = pd.DatetimeIndex([base, base + pd.Timedelta(hours=1), base + pd.Timedelta(hours=5)]).astype("datetime64[us, UTC]")
    seeded = keys - pd.Timedelta(days=3)
    rows = pd.DataFrame({"ts": keys.repeat(2), "v": np.zeros(6, dtype=np.int64)})
    source = write_batches(str(tmp_path / "in"), [rows])
    initial = los_angeles.createDataFrame(pd.DataFrame({"ts": keys, "at": seeded}), "ts timestamp, at timestamp")
    out: list = []
    query = buffering.spark.run_stream(
        stream_of(los_angeles, source, "ts timestamp, v long"), SeededInstants(), key="ts",
        output_schema="key long, at long, n long", checkpoint_location=str(tmp_path / "ck"), sink=collect_sink(out),
        trigger={"availableNow": True}, parallelism=3, time_mode="None", initial_state=initial,
    )
    query.awaitTermination()
    got = pd.concat([pdf for _, pdf in out], ignore_index=True).sort_values("key").reset_index(drop=True)
    micros = keys.as_unit("us").astype("int64").tolist()
    assert got["key"].tolist() == micros  # two keys in the repeated hour stay two instants
    assert got["at"].tolist() == seeded.as_unit("us").astype("int64").tolist()  # each key found its own seed
    assert got["n"].tolist() == [2, 2, 2]
