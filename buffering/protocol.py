"""What a micro-batch is, the same in every runner: the pieces LocalRunner, run_stream and run_batch share."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd


def check_delay_ms(name: str, value: Any) -> None:
    """A delay in milliseconds: a number >= 0, not NaN; the error names the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number of milliseconds, got {type(value).__name__} {value!r}")
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be a number of milliseconds >= 0, got {value!r}")


def event_time_ms(column: pd.Series) -> np.ndarray:
    """Event times as epoch milliseconds (int64), whatever the column's time unit and time zone.

    Timestamps may be ``datetime64[s|ms|us|ns]`` (``pd.read_parquet`` gives
    microseconds), with or without a time zone (naive ones are read as UTC),
    or datetime objects; numbers are taken as epoch milliseconds already.
    """
    dtype = column.dtype
    if dtype == object:
        column = pd.to_datetime(column, utc=True)
        dtype = column.dtype
    if isinstance(dtype, pd.DatetimeTZDtype):
        column = column.dt.tz_convert("UTC").dt.tz_localize(None)
        dtype = column.dtype
    if dtype.kind == "M":
        # numpy converts between units exactly; the int64 of datetime64[ms] is epoch milliseconds.
        return column.to_numpy(dtype="datetime64[ms]").astype(np.int64)
    if dtype.kind in ("i", "u", "f"):
        return column.to_numpy(np.int64)
    raise TypeError(
        f"event_time column {column.name!r} must be timestamps or epoch milliseconds, got dtype {dtype}"
    )
