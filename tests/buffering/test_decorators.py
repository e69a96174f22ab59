"""The decorators: they compose in any order, stay introspectable and stay valid applyInPandasWithState functions.

A decorated function must remain callable exactly as Spark's
``applyInPandasWithState`` calls it: ``fn(key_tuple, iterator_of_frames, GroupState)``
returning an iterator of frames; bad configurations fail when the decorator
is built, with an error naming the bad argument.
"""

from __future__ import annotations

import warnings

import pandas as pd
import pytest

import buffering
from buffering import (
    AggregateOperator,
    Count,
    LocalRunner,
    MiniBatchConfig,
    OperatorSpec,
    StateConfig,
    Sum,
    aggregate,
    cached_state,
    mini_batch,
    spec_of,
)
from state.group_state import GroupState, GroupStateTimeout

from .helpers import Recorder, count_sum, count_sum_of_partials, frame

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from pyspark.sql.streaming.state import GroupState as SparkGroupState
    from pyspark.sql.types import LongType, Row, StructField, StructType

COUNT_SUM_SCHEMA = StructType([StructField("n", LongType()), StructField("s", LongType())])


def spark_state(value=None, *, timed_out=False, timeout=GroupStateTimeout.NoTimeout) -> SparkGroupState:
    """A pyspark GroupState as applyInPandasWithState's worker builds it."""
    return SparkGroupState(
        None if value is None else Row(*value), 1_000, -1, timeout, timed_out, False,
        value is not None, False, False, -1, b"", COUNT_SUM_SCHEMA,
    )


def our_state(value=None, *, timed_out=False, timeout=GroupStateTimeout.NoTimeout) -> GroupState:
    return GroupState(value, batch_processing_time_ms=1_000, timeout_conf=timeout, has_timed_out=timed_out)


def doc_fn(key, rows, state):
    """Documented."""
    yield from count_sum(key, rows, state)


# ---------------------------------------------------------------- composition and introspection
def test_mini_batch_and_cached_state_compose_in_either_order():
    a = mini_batch(max_rows=10, max_delay_ms=5)(cached_state(max_entries=3, store="rocksdb")(count_sum))
    b = cached_state(max_entries=3, store="rocksdb")(mini_batch(max_rows=10, max_delay_ms=5)(count_sum))
    assert spec_of(a) == spec_of(b)
    assert spec_of(a).function is count_sum


def test_decorated_function_exposes_its_configuration_in___opbuffer__():
    fn = mini_batch(max_rows=100, max_bytes=1 << 20, max_delay_ms=250)(
        cached_state(max_entries=5, policy="lfu", store="rocksdb", low_watermark=0.5, high_watermark=0.8)(count_sum)
    )
    spec = fn.__opbuffer__
    assert isinstance(spec, OperatorSpec)
    assert spec.mini_batch == MiniBatchConfig(max_rows=100, max_bytes=1 << 20, max_delay_ms=250)
    assert spec.state == StateConfig(
        max_entries=5, policy="lfu", store="rocksdb", low_watermark=0.5, high_watermark=0.8
    )
    assert spec.state.cached
    assert spec.aggregations is None
    assert spec_of(fn) is spec


def test_a_plain_function_has_a_default_spec():
    spec = spec_of(count_sum)
    assert spec == OperatorSpec(function=count_sum)
    assert spec.mini_batch is None and spec.state == StateConfig() and not spec.state.cached


def test_decorating_leaves_the_original_function_untouched():
    mini_batch(max_rows=3)(count_sum)
    assert not hasattr(count_sum, "__opbuffer__")


def test_applying_a_decorator_again_replaces_only_its_own_layer():
    fn = mini_batch(max_rows=3)(cached_state(max_entries=7)(count_sum))
    again = mini_batch(max_delay_ms=9)(fn)
    assert spec_of(again).mini_batch == MiniBatchConfig(max_delay_ms=9)
    assert spec_of(again).state == StateConfig(max_entries=7)
    assert spec_of(fn).mini_batch == MiniBatchConfig(max_rows=3)  # the earlier function is unchanged


def test_decorated_function_keeps_the_name_and_docstring():
    fn = cached_state(max_entries=3)(mini_batch(max_rows=2)(doc_fn))
    assert fn.__name__ == "doc_fn"
    assert fn.__doc__ == "Documented."


def test_spec_of_rejects_what_is_not_a_function():
    with pytest.raises(TypeError, match="expected a function"):
        spec_of(42)


def test_aggregate_operator_is_introspectable_and_takes_both_decorators():
    aggs = {"n": Count(), "s": Sum("v")}
    op = cached_state(max_entries=4, store="rocksdb")(mini_batch(max_rows=50)(aggregate(aggs)))
    spec = spec_of(op)
    assert isinstance(op, AggregateOperator)
    assert spec.function is None
    assert spec.aggregations == buffering.Aggregations(aggs)
    assert spec.mini_batch.max_rows == 50 and dict(spec.mini_batch.combine) == aggs
    assert spec.state == StateConfig(max_entries=4, store="rocksdb")


def test_aggregate_with_key_writes_the_key_columns_first_under_apply_in_pandas_with_state():
    op = cached_state(max_entries=4)(aggregate({"n": Count(), "s": Sum("v")}, key=["k", "day"]))
    state = our_state()
    out = pd.concat(list(op((7, "mon"), iter([pd.DataFrame({"k": [7, 7], "day": ["mon"] * 2, "v": [1, 2]})]), state)))
    assert out.columns.tolist() == ["k", "day", "n", "s"]
    assert out.values.tolist() == [[7, "mon", 2, 3]]


def test_aggregate_without_key_writes_only_the_outputs():
    out = pd.concat(list(aggregate({"n": Count()})((7,), iter([frame(k=[7], v=[1])]), our_state())))
    assert out.columns.tolist() == ["n"]


def test_aggregate_with_key_refuses_a_key_of_another_width():
    op = aggregate({"n": Count()}, key="k")
    with pytest.raises(ValueError, match=r"\(7, 'mon'\)"):
        list(op((7, "mon"), iter([frame(k=[7], v=[1])]), our_state()))


@pytest.mark.parametrize("key", [[], [""], [1], {"k": 1}])
def test_aggregate_refuses_a_key_that_is_not_column_names(key):
    with pytest.raises(TypeError, match="aggregate\\(key="):
        aggregate({"n": Count()}, key=key)


def test_aggregate_refuses_a_key_column_that_is_also_an_output():
    with pytest.raises(ValueError, match="'n'"):
        aggregate({"n": Count()}, key="n")


def test_runner_refuses_an_aggregate_declared_with_another_key():
    with pytest.raises(ValueError, match=r"key=\['user'\].*\['k'\]"):
        LocalRunner(aggregate({"n": Count()}, key="user"), key="k")


def test_runner_accepts_an_aggregate_declared_with_its_key():
    runner = LocalRunner(aggregate({"n": Count()}, key="k"), key="k")
    try:
        runner.process(frame(k=[1, 1, 2], v=[1, 2, 3]))
        assert runner.get_state(1)["n"] == 2 and runner.get_state(2)["n"] == 1
    finally:
        runner.close()


def test_mini_batch_on_aggregate_refuses_its_own_combiner():
    with pytest.raises(ValueError, match="combine"):
        mini_batch(combine={"x": Count()})(aggregate({"n": Count()}))


# ---------------------------------------------------------------- callable as applyInPandasWithState calls it
@pytest.mark.parametrize("make_state", [spark_state, our_state], ids=["pyspark", "opbuffer"])
def test_decorated_function_runs_with_applyInPandasWithState_signature(make_state):
    fn = mini_batch(max_rows=1000, max_delay_ms=50)(cached_state(max_entries=10, store="rocksdb")(count_sum))
    state = make_state((2, 10))
    result = fn((7,), iter([frame(k=[7, 7], v=[1, 2]), frame(k=[7], v=[3])]), state)
    out = pd.concat(list(result), ignore_index=True)
    assert out.values.tolist() == [[7, 5, 16]]
    assert state.get == (5, 16)


@pytest.mark.parametrize("make_state", [spark_state, our_state], ids=["pyspark", "opbuffer"])
def test_decorated_function_with_combine_hands_one_combined_row_in_a_direct_call(make_state):
    rec = Recorder(count_sum_of_partials)
    fn = mini_batch(combine={"n": Count(), "s": Sum("v")})(rec)
    state = make_state(None)
    out = pd.concat(list(fn((7,), iter([frame(k=[7, 7], v=[1, 2]), frame(k=[7], v=[3])]), state)))
    [(_, frames, _)] = rec.calls
    assert len(frames) == 1 and len(frames[0]) == 1
    assert frames[0][["n", "s"]].values.tolist() == [[3, 6]]
    assert out[["n", "s"]].values.tolist() == [[3, 6]]
    assert state.get == (3, 6)


@pytest.mark.parametrize("make_state", [spark_state, our_state], ids=["pyspark", "opbuffer"])
def test_decorated_function_with_combine_passes_a_timeout_call_through_without_rows(make_state):
    calls = []

    def on_timeout(key, rows, state):
        calls.append((key, list(rows), state.hasTimedOut))
        state.remove()
        return iter(())

    fn = mini_batch(combine={"n": Count()})(on_timeout)
    state = make_state((1, 1), timed_out=True, timeout=GroupStateTimeout.ProcessingTimeTimeout)
    assert list(fn((7,), iter(()), state)) == []
    assert calls == [((7,), [], True)]
    assert not state.exists


def test_combined_row_has_the_same_columns_in_a_direct_call_and_through_LocalRunner():
    """The same decorated function runs under Spark (direct call) and LocalRunner: the combined
    row it receives must look the same in both, or a function written against one breaks on the other."""
    rec = Recorder(count_sum_of_partials)
    fn = mini_batch(combine={"n": Count(), "s": Sum("v")})(rec)
    list(fn((7,), iter([frame(k=[7, 7], v=[1, 2])]), spark_state()))
    LocalRunner(fn, key="k").process(frame(k=[7, 7], v=[1, 2]))
    direct, local = rec.calls[0][1][0], rec.calls[1][1][0]
    assert list(direct.columns) == list(local.columns)


def test_aggregate_operator_runs_with_applyInPandasWithState_signature():
    op = aggregate({"n": Count(), "s": Sum("v")})
    state = spark_state()
    first = pd.concat(list(op((7,), iter([frame(k=[7, 7], v=[1, 2])]), state)))
    second = pd.concat(list(op((7,), iter([frame(k=[7], v=[4])]), state)))
    assert first[["n", "s"]].values.tolist() == [[2, 3]]
    assert second[["n", "s"]].values.tolist() == [[3, 7]]


# ---------------------------------------------------------------- bad configurations fail at construction
@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"max_rows": -1}, "max_rows"),
        ({"max_rows": 0}, "max_rows"),
        ({"max_rows": 2.5}, "max_rows"),
        ({"max_rows": True}, "max_rows"),
        ({"max_rows": "10"}, "max_rows"),
        ({"max_bytes": -5}, "max_bytes"),
        ({"max_bytes": 0}, "max_bytes"),
        ({"max_delay_ms": -1}, "max_delay_ms"),
        ({"max_delay_ms": 0}, "max_delay_ms"),
    ],
)
def test_mini_batch_rejects_non_positive_triggers_at_construction(kwargs, name):
    with pytest.raises(ValueError, match=name):
        mini_batch(**kwargs)


@pytest.mark.parametrize("combine", [{}, {"n": "count"}, {1: Count()}, "count"])
def test_mini_batch_rejects_a_bad_combiner_at_construction(combine):
    with pytest.raises(TypeError, match="combine"):
        mini_batch(combine=combine)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_entries": -1}, "max_entries"),
        ({"max_entries": 0}, "max_entries"),
        ({"max_bytes": -1}, "max_bytes"),
        ({"store": "redis"}, "store"),
        ({"path": "/tmp/x"}, "rocksdb"),
        ({"max_entries": 10, "low_watermark": 0.5}, "both"),
        ({"max_entries": 10, "high_watermark": 0.8}, "both"),
        ({"max_entries": 10, "low_watermark": 0.8, "high_watermark": 0.5}, "low_watermark"),
        ({"max_entries": 10, "low_watermark": 0.5, "high_watermark": 1.5}, "high_watermark"),
        ({"low_watermark": 0.5, "high_watermark": 0.8}, "max_entries"),
    ],
)
def test_cached_state_rejects_bad_settings_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cached_state(**kwargs)


def test_cached_state_rejects_an_unknown_policy_at_construction():
    with pytest.raises((ValueError, KeyError), match="nope"):
        cached_state(max_entries=10, policy="nope")


@pytest.mark.parametrize("aggs", [{}, [("n", Count())], None])
def test_aggregate_rejects_anything_but_a_non_empty_mapping(aggs):
    with pytest.raises(TypeError, match="aggregate"):
        aggregate(aggs)


def test_LocalRunner_rejects_a_bad_key_and_parallelism():
    with pytest.raises(ValueError, match="key"):
        LocalRunner(count_sum, key=[])
    with pytest.raises(ValueError, match="parallelism"):
        LocalRunner(count_sum, key="k", parallelism=0)
    with pytest.raises(ValueError, match="parallelism"):
        LocalRunner(count_sum, key="k", parallelism=129)
    with pytest.raises(ValueError, match="timeout"):
        LocalRunner(count_sum, key="k", timeout="sometimes")
    with pytest.raises(ValueError, match="event_time"):
        LocalRunner(count_sum, key="k", timeout="event")
    with pytest.raises(ValueError, match="watermark_delay_ms"):
        LocalRunner(count_sum, key="k", event_time="ts", watermark_delay_ms=-1)
