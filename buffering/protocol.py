"""What a micro-batch is, the same in every runner: the pieces LocalRunner, run_stream and run_batch share."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

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


# Spark type -> the numpy scalar type Spark's Arrow-to-pandas conversion gives a non-null key.
_NUMPY_KEY_TYPES = {
    "long": "int64", "bigint": "int64", "int": "int32", "integer": "int32", "short": "int16",
    "smallint": "int16", "byte": "int8", "tinyint": "int8", "double": "float64", "float": "float32",
    "real": "float32", "boolean": "bool_",
}
_NAN_NULL_TYPES = frozenset(t for t in _NUMPY_KEY_TYPES if t != "boolean")


def spark_key(nkey: Any, key_types: Optional[Sequence[str]]) -> tuple:
    """The key tuple Spark's applyInPandasWithState hands the function (``s[0]`` of each key Series).

    Measured on PySpark 4.3: ``np.int64``/``np.float64``/... for numeric columns,
    ``str``, ``pd.Timestamp`` for timestamps; a null is ``np.float64('nan')`` in a
    numeric column (the all-null Series is float64), ``pd.NaT`` in a timestamp
    column and ``None`` otherwise. Without ``key_types`` the Python values are
    handed as they are.
    """
    from state.keys import denormalize_key

    key = denormalize_key(nkey)
    if key_types is None:
        return key
    out: list[Any] = []
    for value, type_name in zip(key, key_types):
        if value is None:
            if type_name in _NAN_NULL_TYPES:
                out.append(np.float64("nan"))
            elif type_name in ("timestamp", "timestamp_ntz"):
                out.append(pd.NaT)
            else:
                out.append(None)
        elif type_name in _NUMPY_KEY_TYPES:
            out.append(getattr(np, _NUMPY_KEY_TYPES[type_name])(value))
        elif type_name in ("timestamp", "timestamp_ntz"):
            out.append(pd.Timestamp(value))
        else:
            out.append(value)
    return tuple(out)
