"""buffering.spark._instants: TIMESTAMP columns as epoch microseconds across the Spark/pandas boundary (no JVM)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.types import LongType, StructField, StructType, TimestampNTZType, TimestampType

from buffering.spark._instants import instant_columns, mark_utc, micros, restore

US = [1_772_962_200_000_000, 1_772_964_900_123_456]


def test_instant_columns_are_the_timestamp_fields_with_a_time_zone():
    schema = StructType(
        [StructField("ts", TimestampType()), StructField("wall", TimestampNTZType()), StructField("k", LongType())]
    )
    assert instant_columns(schema) == ("ts",)


def test_restore_turns_epoch_microseconds_into_naive_utc_nanosecond_timestamps():
    frame = restore(pd.DataFrame({"ts": np.array(US, dtype=np.int64), "k": [1, 2]}), ["ts"])
    assert frame["ts"].dtype == "datetime64[ns]"
    assert (frame["ts"].astype("int64") // 1000).tolist() == US
    assert frame["k"].tolist() == [1, 2]


def test_restore_makes_a_null_nat():
    frame = restore(pd.DataFrame({"ts": [float(US[0]), np.nan]}), ["ts"])
    assert frame["ts"].iloc[0] == pd.Timestamp(US[0], unit="us") and pd.isna(frame["ts"].iloc[1])


def test_restore_leaves_columns_that_are_timestamps_already_and_names_not_in_the_frame():
    ts = pd.to_datetime(US, unit="us")
    frame = restore(pd.DataFrame({"ts": ts}), ["ts", "absent"])
    assert frame["ts"].tolist() == list(ts)


def test_micros_is_the_inverse_of_restore_with_nat_as_null():
    values = pd.Series(pd.to_datetime([US[0], None, US[1]], unit="us"))
    out = micros(values)
    assert str(out.dtype) == "Int64"
    assert out.tolist() == [US[0], pd.NA, US[1]]
    assert micros(values.dt.tz_localize("UTC").dt.tz_convert("America/Los_Angeles")).tolist() == out.tolist()


def test_mark_utc_marks_naive_timestamps_and_leaves_the_rest():
    aware = pd.to_datetime(US, unit="us", utc=True).tz_convert("Asia/Tokyo")
    frame = pd.DataFrame({"naive": pd.to_datetime(US, unit="us"), "aware": aware, "k": [1, 2]})
    out = mark_utc(frame, ["naive", "aware", "k"])
    assert str(out["naive"].dtype) == "datetime64[ns, UTC]"
    assert (out["naive"].astype("int64") // 1000).tolist() == US
    assert out["aware"].equals(frame["aware"]) and out["k"].equals(frame["k"])
    assert str(frame["naive"].dtype) == "datetime64[ns]"  # a new frame: the caller's is unchanged
    assert mark_utc(frame, ["aware"]) is frame


def test_restore_equals_pandas_own_conversion_for_longs_and_for_floats_with_nulls():
    longs = np.array([0, -1, 1, *US, -(2**53), 2**53, 9_223_372_036_854_775, -9_223_372_036_854_775], dtype=np.int64)
    got = restore(pd.DataFrame({"ts": longs}), ["ts"])["ts"]
    assert got.equals(pd.to_datetime(pd.Series(longs, name="ts"), unit="us"))
    floats = pd.Series([float(US[0]), np.nan, float(US[1]), -1.0], name="ts")
    got = restore(pd.DataFrame({"ts": floats}), ["ts"])["ts"]
    assert got.equals(pd.to_datetime(floats, unit="us"))


def test_restore_keeps_the_frame_index():
    frame = pd.DataFrame({"ts": np.array(US, dtype=np.int64)}, index=[7, 3])
    assert restore(frame, ["ts"]).index.tolist() == [7, 3]


def test_restore_refuses_an_instant_outside_the_nanosecond_range_as_pandas_does():
    with pytest.raises(pd.errors.OutOfBoundsDatetime):
        restore(pd.DataFrame({"ts": np.array([0, 9_223_372_036_854_776], dtype=np.int64)}), ["ts"])
