"""Event times are read by their unit and time zone, in every runner."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from buffering import LocalRunner
from buffering.protocol import event_time_ms

MS = [1_700_000_000_123, 1_700_000_005_000]  # epoch milliseconds


def stamps(unit: str, tz: str | None) -> pd.Series:
    series = pd.Series(pd.to_datetime(MS, unit="ms")).astype(f"datetime64[{unit}]")
    return series.dt.tz_localize("UTC").dt.tz_convert(tz) if tz else series


@pytest.mark.parametrize("unit", ["ms", "us", "ns"])
@pytest.mark.parametrize("tz", [None, "UTC", "Asia/Kolkata"])
def test_timestamps_of_any_unit_and_zone_become_epoch_milliseconds(unit, tz):
    assert event_time_ms(stamps(unit, tz)).tolist() == MS


def test_second_timestamps_become_epoch_milliseconds():
    series = pd.Series(pd.to_datetime([1_700_000_000, 1_700_000_005], unit="s")).astype("datetime64[s]")
    assert event_time_ms(series).tolist() == [1_700_000_000_000, 1_700_000_005_000]


def test_datetime_objects_become_epoch_milliseconds():
    series = pd.Series([dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc) for ms in MS], dtype=object)
    assert event_time_ms(series).tolist() == MS


def test_numbers_are_taken_as_epoch_milliseconds():
    assert event_time_ms(pd.Series(np.array(MS, dtype=np.int64))).tolist() == MS


def test_a_column_of_strings_is_refused_naming_the_column():
    with pytest.raises(TypeError, match="'ts'.*timestamps or epoch milliseconds"):
        event_time_ms(pd.Series([1.5j], name="ts"))


def test_local_runner_watermark_follows_microsecond_timestamps():
    def fn(key, rows, state):
        yield pd.DataFrame({"k": [key[0]]})

    runner = LocalRunner(fn, key="k", event_time="ts", watermark_delay_ms=1_000)
    runner.process(pd.DataFrame({"k": [1, 2], "ts": stamps("us", None)}))
    assert runner.watermark_ms == MS[1] - 1_000
