"""GroupState parity: the same calls give the same results and errors as pyspark's GroupState.

Each case builds ``pyspark.sql.streaming.state.GroupState`` (as the
applyInPandasWithState worker does) and ``state.group_state.GroupState`` with
equivalent arguments, runs the same calls on both, and compares every
result, or the exception's type, error class and message parameters.
"""

from __future__ import annotations

import datetime as dt
import json
import warnings
from typing import Any, Callable

import numpy as np
import pandas as pd
import pytest

from state.group_state import NO_TIMESTAMP, GroupState, GroupStateTimeout

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from pyspark.errors import PySparkException
    from pyspark.sql.streaming.state import GroupState as SparkGroupState
    from pyspark.sql.types import LongType, Row, StringType, StructField, StructType

SCHEMA = StructType([StructField("n", LongType()), StructField("name", StringType())])
PROCESSING_TIME = 1_700_000_000_000
WATERMARK = 1_699_999_990_000

# (timeout conf, watermark present, watermark ms)
SETUPS = {
    "no-timeout": (GroupStateTimeout.NoTimeout, False, NO_TIMESTAMP),
    "processing-timeout": (GroupStateTimeout.ProcessingTimeTimeout, False, NO_TIMESTAMP),
    "event-timeout": (GroupStateTimeout.EventTimeTimeout, True, WATERMARK),
    "event-timeout-no-watermark-yet": (GroupStateTimeout.EventTimeTimeout, True, NO_TIMESTAMP),
    "no-timeout-with-watermark": (GroupStateTimeout.NoTimeout, True, WATERMARK),
}
VALUES = {"missing": None, "present": (3, "x")}


def make_pair(setup: str, value: Any, timed_out: bool = False) -> tuple[SparkGroupState, GroupState]:
    conf, watermark_present, watermark = SETUPS[setup]
    spark = SparkGroupState(
        None if value is None else Row(*value), PROCESSING_TIME, watermark, conf, timed_out, watermark_present,
        value is not None, False, False, NO_TIMESTAMP, b"", SCHEMA,
    )
    ours = GroupState(
        value, batch_processing_time_ms=PROCESSING_TIME, event_time_watermark_ms=watermark, timeout_conf=conf,
        has_timed_out=timed_out, watermark_present=watermark_present,
    )
    return spark, ours


def error_class(exc: BaseException) -> Any:
    if not isinstance(exc, PySparkException):
        return None
    getter = getattr(exc, "getCondition", None) or exc.getErrorClass
    return getter()


def outcome(state: Any, call: Callable[[Any], Any]) -> tuple:
    """What ``call(state)`` gives: ("ok", result) or ("error", type, error class, message parameters)."""
    try:
        return ("ok", call(state))
    except Exception as exc:  # noqa: BLE001 - the exception is what is compared
        params = exc.getMessageParameters() if isinstance(exc, PySparkException) else None
        return ("error", type(exc), error_class(exc), params)


def timeout_of(state: Any) -> int:
    """The timeout timestamp a call set: pyspark reports it in ``json()`` (what the JVM reads), ours as a property."""
    if isinstance(state, SparkGroupState):
        return json.loads(state.json())["timeoutTimestamp"]
    return state.timeout_timestamp


def then_timeout(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def call(state: Any) -> Any:
        fn(state)
        return timeout_of(state)

    return call


CALLS: dict[str, Callable[[Any], Any]] = {
    "exists": lambda s: s.exists,
    "get": lambda s: s.get,
    "getOption": lambda s: s.getOption,
    "hasTimedOut": lambda s: s.hasTimedOut,
    "str": lambda s: str(s),
    "update-then-get": lambda s: (s.update((5, "y")), s.exists, s.get, s.getOption)[1:],
    "update-numpy-values": lambda s: (s.update((np.int64(5), np.str_("y"))), s.get, [type(v) for v in s.get])[1:],
    "update-pandas-values": lambda s: (s.update((pd.Timestamp("2024-05-01 12:00"), pd.Timedelta(seconds=3))), s.get)[1],
    "update-list": lambda s: (s.update([1, "z"]), s.get)[1],
    "update-None": lambda s: s.update(None),
    "remove": lambda s: (s.remove(), s.exists, s.getOption)[1:],
    "remove-then-get": lambda s: (s.remove(), s.get),
    "remove-then-update": lambda s: (s.remove(), s.update((8, "w")), s.get)[2],
    "setTimeoutDuration": then_timeout(lambda s: s.setTimeoutDuration(5_000)),
    "setTimeoutDuration-float": then_timeout(lambda s: s.setTimeoutDuration(2.0)),
    "setTimeoutDuration-zero": lambda s: s.setTimeoutDuration(0),
    "setTimeoutDuration-negative": lambda s: s.setTimeoutDuration(-10),
    "setTimeoutDuration-str": lambda s: s.setTimeoutDuration("10 seconds"),
    "setTimeoutTimestamp": then_timeout(lambda s: s.setTimeoutTimestamp(WATERMARK + 1)),
    "setTimeoutTimestamp-at-watermark": then_timeout(lambda s: s.setTimeoutTimestamp(WATERMARK)),
    "setTimeoutTimestamp-older-than-watermark": lambda s: s.setTimeoutTimestamp(WATERMARK - 1),
    "setTimeoutTimestamp-zero": lambda s: s.setTimeoutTimestamp(0),
    "setTimeoutTimestamp-negative": lambda s: s.setTimeoutTimestamp(-5),
    "setTimeoutTimestamp-aware-datetime": then_timeout(
        lambda s: s.setTimeoutTimestamp(dt.datetime(2030, 1, 2, 3, 4, 5, 678_000, tzinfo=dt.timezone.utc))
    ),
    "setTimeoutTimestamp-naive-datetime": then_timeout(
        lambda s: s.setTimeoutTimestamp(dt.datetime(2030, 1, 2, 3, 4, 5, 678_000))
    ),
    "setTimeoutTimestamp-old-datetime": lambda s: s.setTimeoutTimestamp(
        dt.datetime(2001, 1, 1, tzinfo=dt.timezone.utc)
    ),
    "getCurrentWatermarkMs": lambda s: s.getCurrentWatermarkMs(),
    "getCurrentProcessingTimeMs": lambda s: s.getCurrentProcessingTimeMs(),
    "no-timeout-set": timeout_of,
}


@pytest.mark.parametrize("value", list(VALUES), ids=list(VALUES))
@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("call", list(CALLS))
def test_same_call_gives_the_same_result_or_error_as_pyspark(call, setup, value):
    spark, ours = make_pair(setup, VALUES[value])
    expected = outcome(spark, CALLS[call])
    assert outcome(ours, CALLS[call]) == expected


@pytest.mark.parametrize("setup", list(SETUPS))
def test_hasTimedOut_and_empty_state_of_a_timeout_call_match_pyspark(setup):
    spark, ours = make_pair(setup, (1, "a"), timed_out=True)
    for name in ("hasTimedOut", "get", "exists", "remove"):
        assert outcome(ours, CALLS[name]) == outcome(spark, CALLS[name])


@pytest.mark.parametrize(
    "call, error_type_name, condition",
    [
        ("update-None", "PySparkTypeError", "CANNOT_BE_NONE"),
        ("get", "PySparkValueError", "STATE_NOT_EXISTS"),
        ("setTimeoutDuration-str", "PySparkTypeError", "NOT_EXPECTED_TYPE"),
        ("setTimeoutDuration", "PySparkRuntimeError", "CANNOT_WITHOUT"),
        ("getCurrentWatermarkMs", "PySparkRuntimeError", "CANNOT_WITHOUT"),
        ("setTimeoutTimestamp", "PySparkRuntimeError", "CANNOT_WITHOUT"),
    ],
)
def test_misuse_raises_pysparks_own_error_classes(call, error_type_name, condition):
    _, ours = make_pair("no-timeout", None)
    result = outcome(ours, CALLS[call])
    assert result[0] == "error"
    assert result[1].__name__ == error_type_name
    assert result[2] == condition


def test_the_error_of_a_misuse_is_catchable_as_the_builtin_python_error():
    _, ours = make_pair("no-timeout", None)
    with pytest.raises(ValueError):
        ours.get
    with pytest.raises(TypeError):
        ours.update(None)


def test_a_sequence_of_calls_leaves_both_in_the_same_state():
    spark, ours = make_pair("processing-timeout", (1, "a"))
    for state in (spark, ours):
        state.update((2, "b"))
        state.setTimeoutDuration(100)
        state.remove()
        state.update((3, "c"))
        state.setTimeoutDuration(50)
    assert (ours.exists, ours.get, timeout_of(ours)) == (spark.exists, spark.get, timeout_of(spark))
    spark_json = json.loads(spark.json())
    assert (ours.updated, ours.removed) == (spark_json["updated"], spark_json["removed"])


def test_the_class_constants_match_pyspark():
    assert GroupState.NO_TIMESTAMP == SparkGroupState.NO_TIMESTAMP
    from pyspark.sql.streaming.state import GroupStateTimeout as SparkTimeout

    for name in ("NoTimeout", "ProcessingTimeTimeout", "EventTimeTimeout"):
        assert getattr(GroupStateTimeout, name) == getattr(SparkTimeout, name)


def test_the_state_a_function_receives_is_a_pyspark_group_state():
    from buffering import LocalRunner

    seen = []

    def fn(key, rows, state):
        seen.append(isinstance(state, SparkGroupState))
        state.update((sum(len(r) for r in rows),))
        yield pd.DataFrame({"k": [key[0]]})

    LocalRunner(fn, key="k").process(pd.DataFrame({"k": [1, 2, 2]}))
    assert seen == [True, True]


def test_json_reports_the_same_fields_as_pysparks_after_the_same_calls():
    spark, ours = make_pair("event-timeout", (1, "a"))
    for state in (spark, ours):
        state.update((2, "b"))
        state.setTimeoutTimestamp(WATERMARK + 5)
    assert json.loads(ours.json()) == json.loads(spark.json())
