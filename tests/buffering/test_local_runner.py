"""LocalRunner: micro-batches, versions, keys, processing- and event-time timeouts, late rows, restarts."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from buffering import LocalRunner, cached_state, mini_batch
from checkpoint import CheckpointStorage

from .helpers import Clock, Recorder, checkpoint_table, count_sum, frame, plain


# ---------------------------------------------------------------- process / version / close
def test_process_returns_the_outputs_of_the_batch():
    runner = LocalRunner(count_sum, key="k", clock=Clock())
    out = runner.process(frame(k=[1, 2, 1], v=[10, 20, 30]))
    assert sorted(out[["k", "n", "s"]].values.tolist()) == [[1, 2, 40], [2, 1, 20]]
    out = runner.process(frame(k=[1], v=[1]))
    assert out[["k", "n", "s"]].values.tolist() == [[1, 3, 41]]


def test_a_batch_without_output_returns_an_empty_frame():
    runner = LocalRunner(mini_batch(max_rows=10)(count_sum), key="k", clock=Clock())
    out = runner.process(frame(k=[1], v=[1]))
    assert isinstance(out, pd.DataFrame) and out.empty


def test_version_counts_the_batches_from_zero():
    runner = LocalRunner(count_sum, key="k", clock=Clock())
    assert runner.version is None
    runner.process(frame(k=[1], v=[1]))
    assert runner.version == 0
    runner.process(frame(k=[2], v=[1]))
    runner.advance_time(10)
    assert runner.version == 2


def test_every_batch_commits_one_checkpoint_version(tmp_path):
    location = tmp_path / "ckpt"
    runner = LocalRunner(count_sum, key="k", clock=Clock(), checkpoint_location=location)
    for i in range(4):
        runner.process(frame(k=[i], v=[i]))
        assert runner.version == i
        assert CheckpointStorage(location).latest_version() == i
    runner.advance_time(1)
    assert CheckpointStorage(location).latest_version() == 4


def test_state_returns_every_keys_state_as_tuples():
    runner = LocalRunner(count_sum, key="k", clock=Clock())
    runner.process(frame(k=[1, 2, 1], v=[10, 20, 30]))
    assert plain(runner.state()) == {(1,): (2, 40), (2,): (1, 20)}
    assert plain(runner.get_state(1)) == (2, 40)
    assert runner.get_state(99) is None


def test_state_before_the_first_batch_is_an_error():
    with pytest.raises(RuntimeError, match="no batch"):
        LocalRunner(count_sum, key="k").state()


def test_state_after_an_empty_first_batch_is_the_empty_state():
    runner = LocalRunner(count_sum, key="k", clock=Clock())
    runner.process(frame(k=[], v=[]))
    assert runner.state() == {}
    assert runner.get_state(1) is None


def test_a_batch_with_rows_after_an_empty_first_batch_keeps_its_state():
    runner = LocalRunner(count_sum, key="k", clock=Clock())
    runner.process(frame(k=[], v=[]))
    runner.process(frame(k=[1, 1], v=[2, 3]))
    assert plain(runner.state()) == {(1,): (2, 5)}


def test_close_keeps_the_checkpoint_and_a_context_manager_closes(tmp_path):
    location = tmp_path / "ckpt"
    with LocalRunner(count_sum, key="k", clock=Clock(), checkpoint_location=location) as runner:
        runner.process(frame(k=[1], v=[5]))
    assert runner._instances is None
    assert checkpoint_table(location) == {(1,): (1, 5)}


def test_close_twice_is_harmless():
    runner = LocalRunner(count_sum, key="k", clock=Clock())
    runner.process(frame(k=[1], v=[5]))
    runner.close()
    runner.close()


def test_process_after_close_without_a_checkpoint_raises_instead_of_starting_from_empty_state():
    """Without a checkpoint, close() drops the state: a later process() must not silently start over."""
    runner = LocalRunner(count_sum, key="k", clock=Clock())
    runner.process(frame(k=[1], v=[1]))
    runner.close()
    with pytest.raises(RuntimeError, match="closed"):
        runner.process(frame(k=[1], v=[1]))


def test_process_after_close_with_a_checkpoint_resumes_from_it(tmp_path):
    runner = LocalRunner(count_sum, key="k", clock=Clock(), checkpoint_location=tmp_path / "ckpt")
    runner.process(frame(k=[1], v=[1]))
    runner.close()
    out = runner.process(frame(k=[1], v=[1]))
    assert out[["k", "n", "s"]].values.tolist() == [[1, 2, 2]]
    runner.close()


def test_advanced_time_survives_a_restart(tmp_path):
    seen = []

    def fn(key, rows, state):
        seen.append(state.getCurrentProcessingTimeMs())
        return iter(())

    clock = Clock(1_000)
    first = LocalRunner(fn, key="k", clock=clock, checkpoint_location=tmp_path / "ckpt")
    first.process(frame(k=[1], v=[1]))
    first.advance_time(5_000)
    first.close()
    second = LocalRunner(fn, key="k", clock=clock, checkpoint_location=tmp_path / "ckpt")
    second.process(frame(k=[1], v=[1]))
    assert seen == [1_000, 6_000]


def test_process_rejects_a_batch_without_the_key_column():
    runner = LocalRunner(count_sum, key="k")
    with pytest.raises(KeyError, match="k"):
        runner.process(frame(x=[1], v=[1]))
    with pytest.raises(TypeError, match="DataFrame"):
        runner.process([{"k": 1, "v": 1}])


def _key_recorder(seen: list):
    def fn(key, rows, state):
        n = state.get[0] if state.exists else 0
        for pdf in rows:
            n += len(pdf)
        state.update((n,))
        seen.append(key)
        yield pd.DataFrame({"n": [n]})

    return fn


def test_null_keys_are_one_group_each_handed_as_spark_hands_them_and_survive_a_restart(tmp_path):
    seen: list = []
    batch = pd.DataFrame({"k": [1.0, np.nan, np.nan], "s": ["a", None, None], "v": [1, 2, 3]})
    with LocalRunner(_key_recorder(seen), key=["k", "s"], key_types=["long", "string"], checkpoint_location=str(tmp_path)) as runner:
        runner.process(batch)
        assert runner.state() == {(1, "a"): (1,), (None, None): (2,)}
    with LocalRunner(_key_recorder(seen), key=["k", "s"], key_types=["long", "string"], checkpoint_location=str(tmp_path)) as runner:
        out = runner.process(batch.iloc[1:])
        assert out["n"].tolist() == [4]
        assert runner.get_state((None, None)) == (4,)
    assert [type(e) for e in seen[0]] == [np.int64, str]
    null_key = seen[1]
    assert np.isnan(null_key[0]) and type(null_key[0]) is np.float64 and null_key[1] is None  # as Spark's s[0]


def test_a_timed_out_key_gets_one_empty_frame_with_the_value_columns():
    frames: list = []

    def fn(key, rows, state):
        frames.extend(rows)
        if not state.hasTimedOut:
            state.setTimeoutDuration(10)
        return iter(())

    clock = Clock()
    runner = LocalRunner(fn, key="k", timeout="processing", clock=clock)
    runner.process(pd.DataFrame({"k": [1], "v": [2]}))
    runner.advance_time(20)
    assert len(frames) == 2 and frames[1].empty and list(frames[1].columns) == ["k", "v"]


def test_advance_time_rejects_going_backwards():
    runner = LocalRunner(count_sum, key="k")
    with pytest.raises(ValueError, match="forward"):
        runner.advance_time(-1)


def test_advance_time_before_any_batch_does_nothing():
    runner = LocalRunner(count_sum, key="k", clock=Clock())
    assert runner.advance_time(100).empty


# ---------------------------------------------------------------- keys
def test_key_is_a_tuple_of_spark_typed_scalars_in_key_column_order():
    """As Spark's applyInPandasWithState (s[0] of each key Series): np.int64 for a long, str for a string."""
    rec = Recorder(lambda key, rows, state: iter(()))
    runner = LocalRunner(rec, key=["name", "id"], clock=Clock())
    runner.process(pd.DataFrame({"id": np.array([7, 7, 8], dtype=np.int64), "name": ["a", "a", "b"], "v": [1, 2, 3]}))
    keys = sorted(k for k, _, _ in rec.calls)
    assert keys == [("a", 7), ("b", 8)]
    for key in keys:
        assert type(key) is tuple
        assert type(key[0]) is str and type(key[1]) is np.int64


def test_a_single_column_key_is_a_one_element_tuple():
    rec = Recorder(lambda key, rows, state: iter(()))
    runner = LocalRunner(rec, key="k", clock=Clock())
    runner.process(pd.DataFrame({"k": np.array([3], dtype=np.int32), "v": [1]}))
    [(key, _, _)] = rec.calls
    assert key == (3,) and type(key[0]) is np.int32  # an int32 column is a Spark int


@pytest.mark.parametrize(
    "key_types, values",
    [
        (("long",), [5, -(2**63), None]),
        (("int",), [3, None]),
        (("tinyint",), [1, None]),
        (("string",), ["a", "", None]),
        (("binary",), [b"x", None]),
        (("double",), [1.5, float("nan"), None]),
        (("boolean",), [True, None]),
        (("timestamp",), [None]),
        (("long", "string"), [(1, "a"), (None, "b")]),
    ],
)
def test_the_key_conversion_chosen_once_for_the_key_types_equals_spark_key(key_types, values):
    from buffering.protocol import spark_key, spark_key_function
    from state.keys import normalize_key

    convert = spark_key_function(key_types)
    for value in values:
        nkey = normalize_key(value if isinstance(value, tuple) else (value,))
        got, expected = convert(nkey), spark_key(nkey, key_types)
        assert repr(got) == repr(expected)  # NaN == NaN as text
        assert [type(v) for v in got] == [type(v) for v in expected]


def test_two_column_keys_keep_separate_state_per_pair():
    def fn(key, rows, state):
        n = (state.get[0] if state.exists else 0) + sum(len(f) for f in rows)
        state.update((n,))
        return iter(())

    runner = LocalRunner(fn, key=["a", "b"], clock=Clock(), parallelism=3)
    runner.process(pd.DataFrame({"a": [1, 1, 2, 1], "b": ["x", "y", "x", "x"]}))
    assert plain(runner.state()) == {(1, "x"): (2,), (1, "y"): (1,), (2, "x"): (1,)}


def test_rows_given_to_fn_hold_every_column_of_the_batch():
    rec = Recorder(lambda key, rows, state: iter(()))
    LocalRunner(rec, key="k", clock=Clock()).process(pd.DataFrame({"k": [1], "v": [2], "w": ["z"]}))
    assert list(rec.calls[0][1][0].columns) == ["k", "v", "w"]


def test_each_keys_rows_come_as_spark_hands_them_in_arrival_order_with_the_index_0_to_n():
    seen = {}

    def fn(key, rows, state):
        for f in rows:
            seen[key[0]] = f.copy()
        return iter(())

    batch = pd.DataFrame({
        "k": [2, 1, 2, 3, 1, 2],
        "v": [0.5, 1.5, 2.5, 3.5, 4.5, 5.5],
        "s": list("abcdef"),
        "t": pd.date_range("2024-01-01", periods=6, freq="min", tz="UTC"),
    }, index=[10, 11, 12, 13, 14, 15])
    LocalRunner(fn, key="k", clock=Clock()).process(batch)
    for key in (1, 2, 3):
        expected = batch[batch["k"] == key].reset_index(drop=True)
        pd.testing.assert_frame_equal(seen[key], expected, check_index_type=True)
        assert isinstance(seen[key].index, pd.RangeIndex)


def test_rows_of_a_key_buffered_over_several_batches_come_as_one_frame_in_arrival_order():
    seen = {}

    def fn(key, rows, state):
        seen[key[0]] = pd.concat(list(rows))
        return iter(())

    runner = LocalRunner(mini_batch(max_rows=5)(fn), key="k", clock=Clock())
    runner.process(pd.DataFrame({"k": [1, 2], "v": [1, 2]}))
    runner.process(pd.DataFrame({"k": [2, 1, 1], "v": [3, 4, 5]}))
    pd.testing.assert_frame_equal(seen[1], pd.DataFrame({"k": [1, 1, 1], "v": [1, 4, 5]}))
    pd.testing.assert_frame_equal(seen[2], pd.DataFrame({"k": [2, 2], "v": [2, 3]}))


def test_outputs_of_many_keys_of_differing_layouts_join_as_pd_concat_joins_them():
    def fn(key, rows, state):
        k = int(key[0])
        if k % 7 == 0:  # another dtype for "n": its own run of frames
            yield pd.DataFrame({"k": [k], "n": [float(k)]})
        elif k % 11 == 0:  # no frame at all
            return
        else:
            yield pd.DataFrame({"k": [k], "n": [k * 2]})
            if k % 5 == 0:
                yield pd.DataFrame({"k": [k, k], "n": [1, 2]})

    keys = list(range(300))
    out = LocalRunner(fn, key="k", clock=Clock()).process(pd.DataFrame({"k": keys}))
    expected = pd.concat([f for k in keys for f in fn((np.int64(k),), iter(()), None)], ignore_index=True)
    pd.testing.assert_frame_equal(out, expected)


# ---------------------------------------------------------------- processing time and its timeouts
def processing_timeout_fn(duration_ms: int = 1_000):
    def fn(key, rows, state):
        if state.hasTimedOut:
            n = state.get[0]
            state.remove()
            yield pd.DataFrame({"k": [key[0]], "event": ["timeout"], "n": [n]})
            return
        n = (state.get[0] if state.exists else 0) + sum(len(f) for f in rows)
        state.update((n,))
        state.setTimeoutDuration(duration_ms)
        yield pd.DataFrame({"k": [key[0]], "event": ["data"], "n": [n]})

    return fn


def test_getCurrentProcessingTimeMs_is_the_injected_clock_plus_advanced_time():
    seen = []

    def fn(key, rows, state):
        seen.append(state.getCurrentProcessingTimeMs())
        return iter(())

    clock = Clock(5_000)
    runner = LocalRunner(fn, key="k", clock=clock)
    runner.process(frame(k=[1], v=[1]))
    clock.now = 6_000
    runner.process(frame(k=[1], v=[1]))
    runner.advance_time(500)
    runner.process(frame(k=[1], v=[1]))
    assert seen == [5_000, 6_000, 6_500]


def test_processing_time_timeout_fires_on_advance_time_with_hasTimedOut_and_no_rows():
    rec = Recorder(processing_timeout_fn(1_000))
    runner = LocalRunner(rec, key="k", timeout="processing", clock=Clock(0))
    runner.process(frame(k=[1, 2], v=[1, 2]))
    assert runner.advance_time(1_000).empty  # due at 1000: fires once time is past it
    out = runner.advance_time(1)
    assert sorted(out["k"]) == [1, 2] and set(out["event"]) == {"timeout"}
    timeouts = [(k, frames, timed_out) for k, frames, timed_out in rec.calls if timed_out]
    assert sorted(k for k, _, _ in timeouts) == [(1,), (2,)]
    # As Spark: one empty frame with the value columns.
    assert all(len(frames) == 1 and frames[0].empty and list(frames[0].columns) == ["k", "v"] for _, frames, _ in timeouts)
    assert runner.state() == {}


def test_processing_time_timeout_is_reset_by_new_data():
    rec = Recorder(processing_timeout_fn(1_000))
    clock = Clock(0)
    runner = LocalRunner(rec, key="k", timeout="processing", clock=clock)
    runner.process(frame(k=[1, 2], v=[1, 2]))
    clock.now = 800
    runner.process(frame(k=[1], v=[1]))  # key 1 now times out after 1800
    clock.now = 1_500
    out = runner.process(frame(k=[3], v=[1]).iloc[:0])
    assert out[["k", "event"]].values.tolist() == [[2, "timeout"]]
    clock.now = 1_801
    out = runner.advance_time(0)
    assert out[["k", "event", "n"]].values.tolist() == [[1, "timeout", 2]]


def test_a_timeout_not_set_again_is_cleared():
    calls = []

    def fn(key, rows, state):
        calls.append(state.hasTimedOut)
        if not state.exists:
            state.setTimeoutDuration(100)
        state.update((1,))
        return iter(())

    runner = LocalRunner(fn, key="k", timeout="processing", clock=Clock(0))
    runner.process(frame(k=[1], v=[1]))
    runner.process(frame(k=[1], v=[1]))  # no setTimeoutDuration on this call: as in Spark, the timeout goes
    runner.advance_time(1_000)
    assert calls == [False, False]


def test_processing_time_timeouts_survive_a_restart(tmp_path):
    location = tmp_path / "ckpt"
    first = LocalRunner(processing_timeout_fn(1_000), key="k", timeout="processing", clock=Clock(0),
                        checkpoint_location=location)
    first.process(frame(k=[1], v=[1]))
    first.close()
    second = LocalRunner(processing_timeout_fn(1_000), key="k", timeout="processing", clock=Clock(1_001),
                         checkpoint_location=location)
    out = second.advance_time(0)
    assert out[["k", "event", "n"]].values.tolist() == [[1, "timeout", 1]]


def test_processing_time_of_a_batch_is_reused_by_its_retry(tmp_path):
    """DESIGN "Time": chosen once, recorded before the batch runs, reused by every retry."""
    location = tmp_path / "ckpt"
    seen = []
    fail = [True]

    def fn(key, rows, state):
        seen.append(state.getCurrentProcessingTimeMs())
        if fail[0]:
            raise RuntimeError("crash")
        return iter(())

    clock = Clock(1_000)
    crashed = LocalRunner(fn, key="k", clock=clock, checkpoint_location=location)
    with pytest.raises(RuntimeError):
        crashed.process(frame(k=[1], v=[1]))
    fail[0] = False
    clock.now = 9_000
    LocalRunner(fn, key="k", clock=clock, checkpoint_location=location).process(frame(k=[1], v=[1]))
    assert seen == [1_000, 1_000]


# ---------------------------------------------------------------- event time
def event_timeout_fn(gap_ms: int = 5_000):
    """A session per key: closes ``gap_ms`` after the key's latest event (event-time timeout)."""

    def fn(key, rows, state):
        if state.hasTimedOut:
            count = state.get[0]
            state.remove()
            yield pd.DataFrame({"k": [key[0]], "closed": [True], "n": [count]})
            return
        frames = [f for f in rows if len(f)]
        count, latest = state.get if state.exists else (0, 0)
        count += sum(len(f) for f in frames)
        latest = max([latest] + [int(f["ts"].max()) for f in frames])
        state.update((count, latest))
        state.setTimeoutTimestamp(latest + gap_ms)
        yield pd.DataFrame({"k": [key[0]], "closed": [False], "n": [count]})

    return fn


def event_runner(fn, **kwargs) -> LocalRunner:
    return LocalRunner(fn, key="k", timeout="event", event_time="ts", clock=Clock(), **kwargs)


def test_watermark_is_the_max_event_time_seen_minus_the_delay():
    seen = []

    def fn(key, rows, state):
        seen.append(state.getCurrentWatermarkMs())
        return iter(())

    runner = LocalRunner(fn, key="k", event_time="ts", watermark_delay_ms=1_000, clock=Clock())
    runner.process(frame(k=[1, 1], ts=[10_000, 30_000]))
    runner.process(frame(k=[1], ts=[35_000]))
    runner.process(frame(k=[1], ts=[40_000]))
    assert seen == [0, 29_000, 34_000]
    assert runner.watermark_ms == 39_000


def test_event_time_timeout_fires_when_the_watermark_passes_it():
    runner = event_runner(event_timeout_fn(5_000))
    runner.process(frame(k=[1, 2], ts=[10_000, 12_000]))
    out = runner.process(frame(k=[3], ts=[15_000]))  # watermark 12000: nothing is due
    assert not out["closed"].any()
    out = runner.process(frame(k=[3], ts=[17_500]))  # watermark 15000: key 1 (due 15000) is not past it yet
    assert not out["closed"].any()
    out = runner.advance_time(0)  # watermark 17500: key 1 (15000) and key 2 (17000) close
    closed = out[out["closed"]]
    assert sorted(closed[["k", "n"]].values.tolist()) == [[1, 1], [2, 1]]
    assert set(k for (k,) in runner.state()) == {3}


def test_event_time_timeouts_fire_with_hasTimedOut_and_no_rows():
    rec = Recorder(event_timeout_fn(1_000))
    runner = event_runner(rec)
    runner.process(frame(k=[1], ts=[1_000]))
    runner.process(frame(k=[2], ts=[5_000]))
    runner.advance_time(0)
    [(key, frames, timed_out)] = [c for c in rec.calls if c[2]]
    assert (key, timed_out) == ((1,), True)
    assert len(frames) == 1 and frames[0].empty


def test_rows_at_or_before_the_previous_batchs_watermark_are_dropped():
    """As Spark's stateful operators: late rows are filtered by the watermark the previous batch ran
    with (its watermark for late events), timeouts fire by the current one."""
    rec = Recorder(event_timeout_fn(100_000))
    runner = event_runner(rec, watermark_delay_ms=1_000)
    runner.process(frame(k=[1], ts=[10_000]))  # the next batch runs with watermark 9000
    runner.process(frame(k=[3], ts=[9_800]))  # runs with 9000: the batch after it filters by 9000
    runner.process(frame(k=[1, 1, 2], ts=[8_999, 9_500, 100]))
    assert rec.rows_of((1,), "ts") == [10_000, 9_500]
    assert rec.rows_of((2,), "ts") == []
    assert runner.stats()["dropped_late_rows"] == 2


def test_rows_between_the_previous_and_the_current_watermark_are_kept_as_in_spark():
    """Checked on Spark 4.3 (tests/spark/test_upstream_parity.py, event_time_timeout_watermark): a row
    behind the current watermark but after the previous batch's reaches the function."""
    rec = Recorder(event_timeout_fn(100_000))
    runner = event_runner(rec, watermark_delay_ms=1_000)
    runner.process(frame(k=[1], ts=[10_000]))  # the next batch runs with watermark 9000; this one with 0
    runner.process(frame(k=[2], ts=[5_000]))
    assert rec.rows_of((2,), "ts") == [5_000]
    assert runner.stats()["dropped_late_rows"] == 0


def test_a_row_at_exactly_the_watermark_is_late_as_in_spark():
    """Spark drops rows with ``event_time <= watermark`` (WatermarkSupport.watermarkExpression uses
    LessThanOrEqual; checked on Spark 4.3: a row at the watermark never reaches the function)."""
    rec = Recorder(event_timeout_fn(100_000))
    runner = event_runner(rec, watermark_delay_ms=1_000)
    runner.process(frame(k=[1], ts=[10_000]))  # the next batch runs with watermark 9000
    runner.process(frame(k=[3], ts=[9_500]))  # and filters the batch after it by 9000
    runner.process(frame(k=[2], ts=[9_000]))
    assert rec.rows_of((2,), "ts") == []


def test_late_rows_reach_fn_without_an_event_time_timeout_as_in_spark():
    """Spark filters late rows in (flat)MapGroupsWithState / applyInPandasWithState only when the
    timeout is EventTimeTimeout (checked on Spark 4.3: with NoTimeout late rows reach the function)."""
    rec = Recorder(lambda key, rows, state: iter(()))
    runner = LocalRunner(rec, key="k", event_time="ts", watermark_delay_ms=0, clock=Clock())
    runner.process(frame(k=[1], ts=[10_000]))
    runner.process(frame(k=[1], ts=[5_000]))
    assert rec.rows_of((1,), "ts") == [10_000, 5_000]


def test_event_time_column_may_hold_timestamps():
    seen = []

    def fn(key, rows, state):
        seen.append(state.getCurrentWatermarkMs())
        return iter(())

    runner = LocalRunner(fn, key="k", event_time="ts", clock=Clock())
    runner.process(pd.DataFrame({"k": [1], "ts": pd.to_datetime(["1970-01-01T00:00:10Z"])}))
    runner.process(pd.DataFrame({"k": [1], "ts": pd.to_datetime(["1970-01-01T00:00:20Z"])}))
    assert seen == [0, 10_000]


def test_watermark_and_event_timers_survive_a_restart(tmp_path):
    location = tmp_path / "ckpt"
    first = event_runner(event_timeout_fn(1_000), checkpoint_location=location)
    first.process(frame(k=[1], ts=[10_000]))
    first.process(frame(k=[2], ts=[20_000]))
    first.close()
    second = event_runner(event_timeout_fn(1_000), checkpoint_location=location)
    assert second.watermark_ms == 20_000
    out = second.advance_time(0)
    assert out[out["closed"]][["k", "n"]].values.tolist() == [[1, 1]]


# ---------------------------------------------------------------- stores and restarts
def test_rocksdb_store_without_a_path_works_and_cleans_up():
    fn = cached_state(store="rocksdb")(count_sum)
    runner = LocalRunner(fn, key="k", clock=Clock())
    runner.process(frame(k=[1, 2, 1], v=[1, 2, 3]))
    workdir = os.path.dirname(runner.instances[0].workdir)  # the temporary directory it made
    assert os.path.isdir(workdir)
    assert plain(runner.state()) == {(1,): (2, 4), (2,): (1, 2)}
    runner.close()
    assert not os.path.exists(workdir)


def test_rocksdb_store_with_a_cache_evicts_without_losing_state():
    fn = cached_state(max_entries=2, store="rocksdb")(count_sum)
    runner = LocalRunner(fn, key="k", clock=Clock())
    for batch in range(5):
        runner.process(frame(k=list(range(10)), v=[batch] * 10))
    assert runner.instances[0].cache.stats()["evictions"] > 0
    assert plain(runner.state()) == {(k,): (5, 10) for k in range(10)}


def test_rocksdb_store_with_a_path_keeps_its_working_copy_there(tmp_path):
    fn = cached_state(store="rocksdb", path=str(tmp_path / "work"))(count_sum)
    runner = LocalRunner(fn, key="k", clock=Clock(), parallelism=2)
    runner.process(frame(k=list(range(20)), v=[1] * 20))
    visible = sorted(name for name in os.listdir(tmp_path / "work") if not name.startswith("."))  # not the claims
    assert visible == ["instance-0-of-2", "instance-1-of-2"]
    runner.close()


@pytest.mark.parametrize("store", ["memory", "rocksdb"])
def test_a_new_runner_on_a_location_resumes_at_its_version_with_its_state(tmp_path, store):
    location = tmp_path / "ckpt"
    fn = cached_state(store=store)(count_sum)
    first = LocalRunner(fn, key="k", clock=Clock(), checkpoint_location=location)
    first.process(frame(k=[1, 2], v=[1, 2]))
    first.process(frame(k=[1], v=[3]))
    first.close()
    second = LocalRunner(fn, key="k", clock=Clock(), checkpoint_location=location)
    assert second.version == 1
    assert plain(second.state()) == {(1,): (2, 4), (2,): (1, 2)}
    out = second.process(frame(k=[2], v=[10]))
    assert second.version == 2
    assert out[["k", "n", "s"]].values.tolist() == [[2, 2, 12]]


def test_a_new_runner_remembers_the_key_types_of_the_location(tmp_path):
    location = tmp_path / "ckpt"
    first = LocalRunner(count_sum, key=["a", "b"], clock=Clock(), checkpoint_location=location)
    first.process(pd.DataFrame({"a": [1], "b": ["x"], "v": [4]}))
    first.close()
    second = LocalRunner(count_sum, key=["a", "b"], clock=Clock(), checkpoint_location=location)
    assert second.key_types == first.key_types
    assert plain(second.get_state((1, "x"))) == (1, 4)


def test_a_location_refuses_other_key_columns(tmp_path):
    location = tmp_path / "ckpt"
    LocalRunner(count_sum, key="k", clock=Clock(), checkpoint_location=location).process(frame(k=[1], v=[1]))
    with pytest.raises(ValueError, match="key"):
        LocalRunner(count_sum, key="other", checkpoint_location=location)


def test_a_location_refuses_another_max_parallelism(tmp_path):
    location = tmp_path / "ckpt"
    LocalRunner(count_sum, key="k", clock=Clock(), checkpoint_location=location).process(frame(k=[1], v=[1]))
    with pytest.raises(ValueError, match="max_parallelism"):
        LocalRunner(count_sum, key="k", checkpoint_location=location, max_parallelism=64)


def test_checkpointed_state_equals_the_runners_state(tmp_path):
    location = tmp_path / "ckpt"
    fn = mini_batch(max_rows=4)(cached_state(max_entries=2, store="rocksdb")(count_sum))
    runner = LocalRunner(fn, key="k", clock=Clock(), checkpoint_location=location, parallelism=2)
    rng = np.random.default_rng(5)
    for _ in range(5):
        runner.process(frame(k=rng.integers(0, 6, 9), v=rng.integers(0, 9, 9)))
    assert checkpoint_table(location) == plain(runner.state())


def test_a_checkpoint_with_null_keys_reads_back_and_verifies(tmp_path):
    import subprocess
    import sys

    from checkpoint import read_state

    seen: list = []
    batch = pd.DataFrame({"k": [np.nan, 2.0], "s": ["x", None], "v": [1, 2]})
    with LocalRunner(_key_recorder(seen), key=["k", "s"], key_types=["long", "string"], checkpoint_location=str(tmp_path)) as runner:
        runner.process(batch)
    table = read_state(str(tmp_path))
    assert sorted(zip(table["k"], table["s"], table["state"]), key=repr) == sorted([(None, "x", (1,)), (2, None, (1,))], key=repr)
    done = subprocess.run([sys.executable, "-m", "checkpoint", "inspect", "--verify", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_state_schema_stores_state_as_spark_reads_it_back():
    """With state_schema, the next call reads what Spark would: an int in a double field is null,
    a datetime in a date field its date (within the call, state.get is the value as given, as in Spark)."""
    import datetime as dt

    seen: list = []

    def fn(key, rows, state):
        for _ in rows:
            pass
        if state.exists:
            seen.append(state.get)
        else:
            state.update((1, dt.datetime(2024, 5, 6, 7, 8)))
            seen.append(state.get)
        return iter(())

    runner = LocalRunner(fn, key="k", state_schema="a double, b date")
    runner.process(pd.DataFrame({"k": [1]}))
    runner.process(pd.DataFrame({"k": [1]}))
    assert seen == [(1, dt.datetime(2024, 5, 6, 7, 8)), (None, dt.date(2024, 5, 6))]
