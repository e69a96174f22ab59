"""What a micro-batch is, the same in every runner: the pieces LocalRunner, run_stream and run_batch share."""

from __future__ import annotations

import functools

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd

from state.keys import denormalize_key


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


_BARE_KEY_TYPES: dict[str, tuple[type, ...]] = {
    **{t: (int,) for t in ("long", "bigint", "int", "integer", "short", "smallint", "byte", "tinyint")},
    "string": (str,),
    "binary": (bytes,),
}


def spark_key_function(key_types: Optional[Sequence[str]]) -> Callable[[Any], tuple]:
    """:func:`spark_key` for keys of ``key_types``, with the common case chosen once.

    A one-column integral, string or binary key normalizes to the bare value
    (see :func:`state.keys.normalize_key`), which converts in one step: 0.3 µs
    a key against 1.5 µs for the general walk over the key's elements and
    types. Any other key, and a null, take the general way.
    """
    if key_types is None or len(key_types) != 1 or key_types[0] not in _BARE_KEY_TYPES:
        return lambda nkey: spark_key(nkey, key_types)
    type_name = key_types[0]
    bare = _BARE_KEY_TYPES[type_name]
    if type_name in _NUMPY_KEY_TYPES:
        scalar = getattr(np, _NUMPY_KEY_TYPES[type_name])

        def numeric(nkey: Any) -> tuple:
            return (scalar(nkey),) if type(nkey) in bare else spark_key(nkey, key_types)

        return numeric

    def plain(nkey: Any) -> tuple:
        return (nkey,) if type(nkey) in bare else spark_key(nkey, key_types)

    return plain


# ---------------------------------------------------------------- one micro-batch, the same in every runner
def watermark_for(max_event_time_ms: int, delay_ms: float, has_event_time: bool) -> int:
    """The event-time watermark of the next batch: max event time seen - delay (0 before any event).

    NO_TIMESTAMP when the runner has no event-time column.
    """
    from state.group_state import NO_TIMESTAMP

    if not has_event_time:
        return NO_TIMESTAMP
    if max_event_time_ms == NO_TIMESTAMP:
        return 0
    return max(0, int(max_event_time_ms - delay_ms))


def no_data_timeout(spec: Any, timeout_conf: str, event_time: Optional[str]) -> str:
    """The GroupStateTimeout for which Spark runs an operator's batches without data.

    Spark runs a batch without data for a stateful operator that asks: with a
    processing-time timeout (a processor's ``ProcessingTime`` mode) at every
    trigger; with an event-time timeout (``EventTime`` mode, a windowed
    aggregate that closes windows by the watermark) after a batch that moved the
    watermark. Such a batch fires timeouts and timers, closes windows and moves
    the late-row watermark before any later row is seen. ``NoTimeout``: never.
    """
    from state.group_state import GroupStateTimeout

    if timeout_conf == GroupStateTimeout.ProcessingTimeTimeout:
        return GroupStateTimeout.ProcessingTimeTimeout
    if event_time is not None and (
        timeout_conf == GroupStateTimeout.EventTimeTimeout or getattr(spec, "window", None) is not None
    ):
        return GroupStateTimeout.EventTimeTimeout
    return GroupStateTimeout.NoTimeout


#: Commit metadata: the event-time watermark a batch ran with (the next batch's watermark for late rows).
WATERMARK_FIELD = "watermark_ms"


def late_rows_watermark(watermark_ms: int, previous_metadata: Optional[dict]) -> int:
    """The watermark rows are filtered by as late: the one the previous batch ran with, as Spark's.

    Spark's stateful operators (flatMapGroupsWithState, applyInPandasWithState,
    transformWithState) drop rows at or before the watermark *for late events*
    (the watermark the previous batch ran with) and fire timeouts and timers by
    the watermark *for eviction* (``watermark_ms``). Without a previous batch,
    or one that did not record its watermark, ``watermark_ms``.
    """
    if not previous_metadata:
        return watermark_ms
    return int(previous_metadata.get(WATERMARK_FIELD, watermark_ms))


def drop_late_rows(
    frame: pd.DataFrame, event_time: Optional[str], timeout_conf: str, watermark_ms: int
) -> tuple[pd.DataFrame, int, int]:
    """As Spark's (flat)MapGroupsWithState: with an event-time timeout, rows at or before the watermark are late.

    Without an event-time timeout every row is processed. Returns the kept
    rows, how many were dropped and the max event time of the kept rows
    (NO_TIMESTAMP when there is none).
    """
    from state.group_state import NO_TIMESTAMP, GroupStateTimeout

    if event_time is None or not len(frame):
        return frame, 0, NO_TIMESTAMP
    event = event_time_ms(frame[event_time])
    dropped = 0
    if timeout_conf == GroupStateTimeout.EventTimeTimeout and watermark_ms != NO_TIMESTAMP:
        late = event <= watermark_ms
        if late.any():
            dropped = int(late.sum())
            frame = frame.loc[~late].reset_index(drop=True)
            event = event[~late]
    return frame, dropped, int(event.max()) if len(event) else NO_TIMESTAMP


def check_checkpoint_fits(
    manifest: Any,
    where: str,
    *,
    key_columns: Sequence[str],
    key_types: Optional[Sequence[str]],
    max_parallelism: int,
) -> Optional[tuple[str, ...]]:
    """Refuse a checkpoint written for other keys or key groups; return the key types to use.

    ``key_types`` None takes the checkpoint's (a LocalRunner infers them from
    the first rows otherwise). Every error names the checkpoint (``where``)
    and both values.
    """
    if manifest is None:
        return tuple(key_types) if key_types is not None else None
    if manifest.max_parallelism != max_parallelism:
        raise ValueError(
            f"checkpoint {where} has max_parallelism {manifest.max_parallelism}, not {max_parallelism}: "
            "it is fixed for the life of a checkpoint"
        )
    meta = manifest.metadata
    stored = meta.get("key_columns")
    if stored is not None and list(stored) != list(key_columns):
        raise ValueError(f"checkpoint {where} was written for key {list(stored)}, not {list(key_columns)}")
    stored_types = meta.get("key_types")
    if key_types is None:
        return tuple(stored_types) if stored_types is not None else None
    if stored_types and tuple(stored_types) != tuple(key_types):
        raise ValueError(
            f"checkpoint {where} was written with key_types {list(stored_types)}, not {list(key_types)}: "
            "key groups depend on them, so they are fixed per checkpoint"
        )
    return tuple(key_types)


def commit_metadata(
    *,
    max_event_time_ms: int,
    processing_time_ms: int,
    key_columns: Sequence[str],
    key_types: Optional[Sequence[str]],
    parallelism: int,
    state_key_columns: Optional[Sequence[str]] = None,
    **runner: Any,
) -> dict[str, Any]:
    """What every runner records with a committed version (``runner``: what only that runner needs).

    ``state_key_columns``: the columns of the state's keys where they are more
    than the key columns (a windowed aggregate's ``(key..., window_start)``),
    so that ``read_state`` names them."""
    return {
        "max_event_time_ms": int(max_event_time_ms),
        "processing_time_ms": int(processing_time_ms),
        "key_columns": list(key_columns),
        "key_types": list(key_types or ()),
        "parallelism": int(parallelism),
        **({"state_key_columns": list(state_key_columns)} if state_key_columns is not None else {}),
        **runner,
    }


def state_key_columns(spec: Any, key_columns: Sequence[str]) -> Optional[list[str]]:
    """The columns of ``spec``'s state keys when they are not ``key_columns``: a tumbling or hopping
    windowed aggregate keys its state by ``(key..., window_start)``; None otherwise."""
    window = getattr(spec, "window", None)
    if window is None or window.spec.merges:
        return None
    from .windows import WINDOW_START

    return [*key_columns, WINDOW_START]


# ---------------------------------------------------------------- calling the user's function
def output_frames(key: tuple, result: Any) -> list[pd.DataFrame]:
    """The DataFrames the user function produced for ``key``; anything else is an error naming the key.

    As applyInPandasWithState: the function returns an iterator of DataFrames
    (``yield df``); ``return df`` and other values are refused before anything
    of the batch is committed.
    """
    if result is None:
        return []
    if isinstance(result, pd.DataFrame):
        raise TypeError(
            f"the function returned a DataFrame for key {key!r}; it must return an iterator of DataFrames "
            "(`yield df`, not `return df`), as applyInPandasWithState requires"
        )
    if isinstance(result, (dict, str, bytes)) or not hasattr(result, "__iter__"):
        raise TypeError(
            f"the function returned {type(result).__name__} {result!r:.200} for key {key!r}; "
            "it must return an iterator of DataFrames (`yield df`)"
        )
    frames = []
    iterator = iter(result)
    while True:
        try:
            item = next(iterator)
        except StopIteration as stop:
            if isinstance(stop.value, pd.DataFrame):  # a generator that ends with `return df`: the frame would vanish
                raise TypeError(
                    f"the function ended with `return df` for key {key!r} inside a generator; use 'yield df' "
                    "(the returned frame is not output)"
                ) from None
            break
        if item is None:
            continue
        if not isinstance(item, pd.DataFrame):
            raise TypeError(
                f"the function yielded {type(item).__name__} {item!r:.200} for key {key!r}; "
                "it must yield pandas DataFrames"
            )
        frames.append(item)
    return frames


@functools.lru_cache(maxsize=64)
def _empty_frame(columns: tuple) -> pd.DataFrame:
    """The empty frame of a timed-out key's call, made once per column set (a new DataFrame costs ~200 us);
    each call gets its own shallow copy, so a function that adds a column changes only its own."""
    return pd.DataFrame(columns=list(columns))


def call_function(
    function: Any,
    nkey: Any,
    key_types: Optional[Sequence[str]],
    rows: Optional[pd.DataFrame],
    state: Any,
    value_columns: Sequence[str],
    to_spark_key: Optional[Callable[[Any], tuple]] = None,
) -> list[pd.DataFrame]:
    """Call an ``applyInPandasWithState`` function for one key as Spark does; return its frames.

    The key as Spark hands it (:func:`spark_key`, or ``to_spark_key``: the
    :func:`spark_key_function` of ``key_types``, made once by a caller that
    calls many keys); the key's rows as one frame, or, for a timed-out key,
    one empty frame with the value columns. Output errors name the key in
    plain Python (:func:`output_frames`).
    """
    key = spark_key(nkey, key_types) if to_spark_key is None else to_spark_key(nkey)
    values = iter([rows if rows is not None else _empty_frame(tuple(value_columns)).copy(deep=False)])
    return output_frames(denormalize_key(nkey), function(key, values, state))
