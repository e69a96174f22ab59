"""The GroupState facade a user function receives: pyspark's ``GroupState``, call for call.

Results and errors match ``pyspark.sql.streaming.state.GroupState`` (the same
pyspark error classes where pyspark is importable), so a function written for
``applyInPandasWithState`` runs unchanged on opbuffer's runners. The runner
reads the outcome (``updated``, ``removed``, the timeout timestamp) after the
call and applies it to the store, as Spark's executor does.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Optional, Tuple

try:  # pyspark is a dependency; importing this module starts no JVM
    from pyspark.sql.streaming.state import GroupState as _SparkGroupState
except ImportError:  # pragma: no cover - keep the state layer usable without pyspark
    _SparkGroupState = object  # type: ignore[assignment,misc]

NO_TIMESTAMP = -1


class GroupStateTimeout:
    """The timeout modes of ``applyInPandasWithState``."""

    NoTimeout: str = "NoTimeout"
    ProcessingTimeTimeout: str = "ProcessingTimeTimeout"
    EventTimeTimeout: str = "EventTimeTimeout"


_TIMEOUTS = {
    "none": GroupStateTimeout.NoTimeout,
    "notimeout": GroupStateTimeout.NoTimeout,
    "processing": GroupStateTimeout.ProcessingTimeTimeout,
    "processingtimetimeout": GroupStateTimeout.ProcessingTimeTimeout,
    "event": GroupStateTimeout.EventTimeTimeout,
    "eventtimetimeout": GroupStateTimeout.EventTimeTimeout,
}


def timeout_conf(timeout: str) -> str:
    """Spark's timeout conf name from ``"none"``/``"processing"``/``"event"`` or a GroupStateTimeout value."""
    conf = _TIMEOUTS.get(str(timeout).lower().replace("_", ""))
    if conf is None:
        raise ValueError(
            f"unknown timeout {timeout!r}; use 'none', 'processing' or 'event' (or a GroupStateTimeout value)"
        )
    return conf


def _error(kind: str, error_class: str, parameters: dict[str, str], fallback: str) -> Exception:
    try:
        from pyspark import errors

        return getattr(errors, kind)(errorClass=error_class, messageParameters=parameters)  # type: ignore[no-any-return]
    except ImportError:  # pragma: no cover - pyspark is a dependency; keep working without it
        base = {"PySparkValueError": ValueError, "PySparkTypeError": TypeError}.get(kind, RuntimeError)
        return base(f"[{error_class}] {fallback}")


#: Values that are already plain Python: kept as they are without the four attribute probes below
#: (a failed ``hasattr`` raises and catches an AttributeError: about 1 µs a value for all four).
_PLAIN_VALUES = frozenset((int, float, str, bytes, bool, type(None)))


def _to_python(value: Any) -> Any:
    if type(value) in _PLAIN_VALUES:
        return value
    if hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy scalar
        return value.tolist()
    if hasattr(value, "to_pytimedelta"):
        return value.to_pytimedelta()
    if hasattr(value, "to_pydatetime"):
        return value.to_pydatetime()
    return value


class GroupState(_SparkGroupState):  # type: ignore[misc,valid-type]
    """Per-key state handle with pyspark's GroupState API (properties and methods alike).

    A subclass of ``pyspark.sql.streaming.state.GroupState``, so functions that
    check ``isinstance(state, GroupState)`` (PySpark's own tests do) run
    unchanged; it keeps its own constructor (Spark's takes JVM-side arguments)
    and the attribute names of pyspark's, so the inherited ``json()`` works.
    """

    NO_TIMESTAMP: int = NO_TIMESTAMP

    __slots__ = (
        "_value",
        "_batch_processing_time_ms",
        "_event_time_watermark_ms",
        "_timeout_conf",
        "_has_timed_out",
        "_watermark_present",
        "_defined",
        "_updated",
        "_removed",
        "_timeout_timestamp",
        "_old_timeout_timestamp",
    )

    def __init__(
        self,
        value: Optional[tuple],
        *,
        batch_processing_time_ms: int,
        event_time_watermark_ms: int = NO_TIMESTAMP,
        timeout_conf: str = GroupStateTimeout.NoTimeout,
        has_timed_out: bool = False,
        watermark_present: bool = False,
        old_timeout_timestamp: int = NO_TIMESTAMP,
    ) -> None:
        self._value = value
        self._batch_processing_time_ms = batch_processing_time_ms
        self._event_time_watermark_ms = event_time_watermark_ms
        self._timeout_conf = timeout_conf
        self._has_timed_out = has_timed_out
        self._watermark_present = watermark_present
        self._defined = value is not None
        self._updated = False
        self._removed = False
        # As in Spark, the timeout is reset on every call: set it again to keep one.
        self._timeout_timestamp = NO_TIMESTAMP
        self._old_timeout_timestamp = old_timeout_timestamp

    @property
    def exists(self) -> bool:
        """Whether state exists or not."""
        return self._defined

    @property
    def get(self) -> Tuple:
        """The state value if it exists, else PySparkValueError (STATE_NOT_EXISTS)."""
        if self._defined:
            return tuple(self._value)  # type: ignore[arg-type]
        raise _error("PySparkValueError", "STATE_NOT_EXISTS", {}, "State is either not defined or has already been removed.")

    @property
    def getOption(self) -> Optional[Tuple]:
        """The state value if it exists, or None."""
        return tuple(self._value) if self._defined else None  # type: ignore[arg-type]

    @property
    def hasTimedOut(self) -> bool:
        """Whether the function is called because the key timed out."""
        return self._has_timed_out

    @property
    def oldTimeoutTimestamp(self) -> int:
        return self._old_timeout_timestamp

    def update(self, newValue: Tuple) -> None:
        """Set the state value (an iterable of column values; not None)."""
        if newValue is None:
            raise _error("PySparkTypeError", "CANNOT_BE_NONE", {"arg_name": "newValue"}, "Argument `newValue` cannot be None.")
        self._value = tuple(_to_python(v) for v in newValue)
        self._defined = True
        self._updated = True
        self._removed = False

    def remove(self) -> None:
        """Remove the state."""
        self._defined = False
        self._updated = False
        self._removed = True

    def setTimeoutDuration(self, durationMs: int) -> None:
        """Time out this key ``durationMs`` after the batch's processing time (processing-time timeout only)."""
        if isinstance(durationMs, str):
            raise _error(
                "PySparkTypeError",
                "NOT_EXPECTED_TYPE",
                {"expected_type": "int", "arg_name": "durationMs", "arg_type": type(durationMs).__name__},
                f"Expected an int for durationMs, got {type(durationMs).__name__}.",
            )
        if self._timeout_conf != GroupStateTimeout.ProcessingTimeTimeout:
            raise _error(
                "PySparkRuntimeError",
                "CANNOT_WITHOUT",
                {
                    "condition1": "set timeout duration",
                    "condition2": "enabling processing time timeout in applyInPandasWithState",
                },
                "Cannot set timeout duration without enabling processing time timeout.",
            )
        if durationMs <= 0:
            raise _error(
                "PySparkValueError",
                "VALUE_NOT_POSITIVE",
                {"arg_name": "durationMs", "arg_value": type(durationMs).__name__},
                "durationMs must be positive.",
            )
        self._timeout_timestamp = durationMs + self._batch_processing_time_ms

    def setTimeoutTimestamp(self, timestampMs: Any) -> None:
        """Time out this key when the watermark passes ``timestampMs`` (event-time timeout only)."""
        if self._timeout_conf != GroupStateTimeout.EventTimeTimeout:
            raise _error(
                "PySparkRuntimeError",
                "CANNOT_WITHOUT",
                {
                    "condition1": "set timeout duration",
                    "condition2": "enabling processing time timeout in applyInPandasWithState",
                },
                "Cannot set timeout timestamp without enabling event time timeout.",
            )
        if isinstance(timestampMs, _dt.datetime):
            if timestampMs.tzinfo is None:
                timestampMs = timestampMs.astimezone()  # Spark reads naive datetimes as local time
            timestampMs = (timestampMs - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)) / _dt.timedelta(
                milliseconds=1
            )
        if timestampMs <= 0:
            raise _error(
                "PySparkValueError",
                "VALUE_NOT_POSITIVE",
                {"arg_name": "timestampMs", "arg_value": type(timestampMs).__name__},
                "timestampMs must be positive.",
            )
        if self._event_time_watermark_ms != NO_TIMESTAMP and timestampMs < self._event_time_watermark_ms:
            raise _error(
                "PySparkValueError",
                "INVALID_TIMEOUT_TIMESTAMP",
                {"timestamp": str(timestampMs), "watermark": str(self._event_time_watermark_ms)},
                f"Timeout timestamp {timestampMs} is older than the watermark {self._event_time_watermark_ms}.",
            )
        self._timeout_timestamp = timestampMs

    def getCurrentWatermarkMs(self) -> int:
        """The event-time watermark (only when the query has one)."""
        if not self._watermark_present:
            raise _error(
                "PySparkRuntimeError",
                "CANNOT_WITHOUT",
                {
                    "condition1": "get event time watermark timestamp",
                    "condition2": "setting watermark before applyInPandasWithState",
                },
                "Cannot get the watermark without setting one.",
            )
        return self._event_time_watermark_ms

    def getCurrentProcessingTimeMs(self) -> int:
        """The batch's processing time: one value for the whole batch and its retries."""
        return self._batch_processing_time_ms

    # ------------------------------------------------------------ outcome, read by the runner
    @property
    def updated(self) -> bool:
        return self._updated

    @property
    def removed(self) -> bool:
        return self._removed

    @property
    def value(self) -> Optional[tuple]:
        return self._value if self._defined else None

    @property
    def timeout_timestamp(self) -> int:
        return int(self._timeout_timestamp) if self._timeout_timestamp != NO_TIMESTAMP else NO_TIMESTAMP

    def __str__(self) -> str:
        return f"GroupState({self.get})" if self._defined else "GroupState(<undefined>)"

    __repr__ = __str__
