"""The mini-batch buffer: count, size and time triggers, per-key order, combining, and its memory bound.

Most tests drive the buffer through a LocalRunner with an injected clock (that
is where the triggers are evaluated, DESIGN "The path of one micro-batch" step
3); a few use MiniBatchBuffer directly.
"""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest

from buffering import Count, LocalRunner, MiniBatchBuffer, MiniBatchConfig, Sum, mini_batch
from state.keys import denormalize_key, normalize_key

from .helpers import Clock, Recorder, count_sum, count_sum_of_partials, frame, plain, random_batches

ROW_BYTES = 16  # a row of two int64 columns (k, v), as the buffer estimates it (no index, no deep)


def runner_for(fn, clock=None, **kwargs) -> LocalRunner:
    return LocalRunner(fn, key="k", clock=clock or Clock(), **kwargs)


def sorted_rows(out: pd.DataFrame, columns=("k", "n", "s")) -> list[tuple]:
    """A batch's output rows as sorted tuples (an empty output has no columns at all)."""
    if out.empty:
        return []
    return sorted(tuple(plain(r)) for r in out[list(columns)].itertuples(index=False, name=None))


def rows_per_call(recorder: Recorder) -> list[int]:
    return [sum(len(f) for f in frames) for _, frames, _ in recorder.calls]


# ---------------------------------------------------------------- count trigger
def test_max_rows_waits_until_n_rows_are_buffered():
    rec = Recorder()
    runner = runner_for(mini_batch(max_rows=4)(rec))
    runner.process(frame(k=[1, 2, 3], v=[1, 2, 3]))
    assert rec.calls == []
    assert runner.instances[0].buffer.rows == 3


def test_max_rows_counts_the_rows_of_all_keys_together():
    rec = Recorder()
    runner = runner_for(mini_batch(max_rows=4)(rec))
    runner.process(frame(k=[1, 2, 3], v=[1, 2, 3]))
    out = runner.process(frame(k=[4], v=[4]))
    assert sorted(k for k, _, _ in rec.calls) == [(1,), (2,), (3,), (4,)]
    assert sorted(out["k"]) == [1, 2, 3, 4]
    assert runner.instances[0].buffer.rows == 0


def test_max_rows_flushes_mid_batch_exactly_every_n_rows():
    rec = Recorder()
    runner = runner_for(mini_batch(max_rows=3)(rec))
    runner.process(frame(k=[7] * 8, v=range(8)))
    assert rows_per_call(rec) == [3, 3]
    assert [f["v"].tolist() for _, frames, _ in rec.calls for f in frames] == [[0, 1, 2], [3, 4, 5]]
    assert runner.instances[0].buffer.rows == 2  # rows 6 and 7 wait for the next trigger


def test_max_rows_counts_rows_left_from_earlier_batches():
    rec = Recorder()
    runner = runner_for(mini_batch(max_rows=5)(rec))
    runner.process(frame(k=[1, 1, 1], v=[0, 1, 2]))
    runner.process(frame(k=[1, 1, 1, 1], v=[3, 4, 5, 6]))
    assert rows_per_call(rec) == [5]
    assert rec.rows_of((1,)) == [0, 1, 2, 3, 4]


def test_max_rows_bounds_the_buffered_rows_and_every_flush_hands_exactly_n_rows():
    max_rows = 6
    rec = Recorder()
    runner = runner_for(mini_batch(max_rows=max_rows)(rec))
    for batch in random_batches(np.random.default_rng(1), 30, 20, 4):
        runner.process(batch)
        assert runner.instances[0].buffer.rows < max_rows
    flushes = runner.instances[0].metrics.flushes
    assert flushes > 5
    assert sum(rows_per_call(rec)) == flushes * max_rows


# ---------------------------------------------------------------- size trigger
def test_max_bytes_waits_until_the_buffered_bytes_reach_the_bound():
    rec = Recorder()
    runner = runner_for(mini_batch(max_bytes=4 * ROW_BYTES)(rec))
    runner.process(frame(k=[1, 2, 3], v=[1, 2, 3]))
    assert rec.calls == []
    runner.process(frame(k=[1], v=[4]))
    assert sorted(k for k, _, _ in rec.calls) == [(1,), (2,), (3,)]
    assert rec.rows_of((1,)) == [1, 4]
    assert runner.instances[0].buffer.bytes == 0


def test_max_bytes_flushes_mid_batch_so_the_buffer_stays_within_the_bound():
    """Like max_rows, the size trigger is evaluated while a batch is added, not only at its end:
    a 20-row batch with room for 4 rows is handed to the function in flushes of at most 4 rows."""
    rec = Recorder()
    runner = runner_for(mini_batch(max_bytes=4 * ROW_BYTES)(rec))
    runner.process(frame(k=[1] * 20, v=range(20)))
    assert rec.rows_of((1,)) == list(range(20))[: sum(rows_per_call(rec))]
    assert max(rows_per_call(rec)) <= 4, f"rows per flush: {rows_per_call(rec)}"


def test_max_bytes_bounds_the_buffered_bytes_after_every_batch():
    max_bytes = 10 * ROW_BYTES
    rec = Recorder()
    runner = runner_for(mini_batch(max_bytes=max_bytes)(rec))
    for batch in random_batches(np.random.default_rng(2), 20, 40, 4):
        runner.process(batch)
        assert runner.instances[0].buffer.bytes < max_bytes
    assert max(rows_per_call(rec)) <= 10


def _reduce_rows(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.groupby("k", as_index=False)[["v", "w"]].sum()


def _weighted_count_sum(key, rows, state):
    n, s = state.get if state.exists else (0, 0)
    for f in rows:
        n += int(f["w"].sum()) if "w" in f else int(f["n"].sum())
        s += int(f["v"].sum()) if "w" in f else int(f["s"].sum())
    state.update((n, s))
    yield pd.DataFrame({"k": [key[0]], "n": [n], "s": [s]})


@pytest.mark.parametrize(
    "combine", [None, {"n": Count(), "s": Sum("v")}, _reduce_rows], ids=["rows", "aggregations", "callable"]
)
def test_the_size_trigger_fires_at_the_same_point_after_a_restart(tmp_path, combine):
    """Buffered bytes are part of what a restore brings back (as buffered rows are for max_rows):
    a restarted runner flushes exactly where an uninterrupted one does, so a replay gives the same output."""
    op = mini_batch(max_bytes=20 * ROW_BYTES, combine=combine)(_weighted_count_sum)
    batches = [frame(k=[1, 2] * 4, v=range(8), w=[1] * 8) for _ in range(3)]
    reference = runner_for(op, checkpoint_location=tmp_path / "reference")
    expected = [sorted_rows(reference.process(b)) for b in batches]
    first = runner_for(op, checkpoint_location=tmp_path / "restarted")
    got = [sorted_rows(first.process(batches[0]))]
    first.close()
    second = runner_for(op, checkpoint_location=tmp_path / "restarted")
    got += [sorted_rows(second.process(b)) for b in batches[1:]]
    assert any(expected), "the size trigger should fire within these batches"
    assert got == expected


# ---------------------------------------------------------------- time trigger
def test_max_delay_does_not_flush_before_the_oldest_row_is_old_enough():
    clock = Clock(1_000)
    rec = Recorder()
    runner = runner_for(mini_batch(max_delay_ms=100)(rec), clock)
    runner.process(frame(k=[1], v=[1]))
    clock.now = 1_099
    runner.process(frame(k=[2], v=[2]))
    assert rec.calls == []


def test_max_delay_flushes_on_process_when_the_oldest_pending_row_is_old_enough():
    clock = Clock(1_000)
    rec = Recorder()
    runner = runner_for(mini_batch(max_delay_ms=100)(rec), clock)
    runner.process(frame(k=[1], v=[1]))
    clock.now = 1_050
    runner.process(frame(k=[2], v=[2]))
    clock.now = 1_100  # the row of key 1 is now 100 ms old; key 2's rows go with it
    out = runner.process(frame(k=[3], v=[3]))
    assert sorted(out["k"]) == [1, 2, 3]
    assert runner.instances[0].buffer.rows == 0


def test_max_delay_flushes_on_an_empty_batch():
    clock = Clock(0)
    rec = Recorder()
    runner = runner_for(mini_batch(max_delay_ms=100)(rec), clock)
    runner.process(frame(k=[1], v=[1]))
    clock.now = 100
    out = runner.process(frame(k=[], v=[]).astype({"k": "int64", "v": "int64"}))
    assert out["k"].tolist() == [1]


def test_max_delay_flushes_on_advance_time():
    rec = Recorder()
    runner = runner_for(mini_batch(max_delay_ms=100)(rec), Clock(0))
    runner.process(frame(k=[1, 2], v=[1, 2]))
    assert runner.advance_time(99).empty
    out = runner.advance_time(1)
    assert sorted(out["k"]) == [1, 2]
    assert runner.instances[0].buffer.rows == 0


def test_max_delay_age_of_pending_rows_survives_a_restart(tmp_path):
    clock = Clock(0)
    first = runner_for(mini_batch(max_delay_ms=100)(count_sum), clock, checkpoint_location=tmp_path / "ckpt")
    first.process(frame(k=[1], v=[5]))
    first.close()
    clock.now = 100
    second = runner_for(mini_batch(max_delay_ms=100)(count_sum), clock, checkpoint_location=tmp_path / "ckpt")
    assert second.instances[0].buffer.rows == 1
    out = second.advance_time(0)
    assert out[["k", "n", "s"]].values.tolist() == [[1, 1, 5]]


def test_no_trigger_flushes_every_micro_batch_at_its_end():
    rec = Recorder()
    runner = runner_for(mini_batch()(rec))
    out = runner.process(frame(k=[1, 2, 1], v=[1, 2, 3]))
    assert sorted(out["k"]) == [1, 2]
    assert rec.rows_of((1,)) == [1, 3]
    assert runner.instances[0].buffer.rows == 0


# ---------------------------------------------------------------- per-key order
@pytest.mark.parametrize("parallelism", [1, 3])
def test_rows_of_a_key_reach_fn_in_arrival_order_across_micro_batches(parallelism):
    rng = np.random.default_rng(7)
    rec = Recorder()
    runner = runner_for(mini_batch(max_rows=9)(rec), parallelism=parallelism)
    arrived: dict[int, list[int]] = {}
    seq = 0
    for _ in range(12):
        n = int(rng.integers(1, 15))
        keys = rng.integers(0, 5, n)
        values = np.arange(seq, seq + n)
        seq += n
        for k, v in zip(keys.tolist(), values.tolist()):
            arrived.setdefault(k, []).append(v)
        runner.process(frame(k=keys, v=values))
    assert rec.calls, "the count trigger should have fired"
    for k, values in arrived.items():
        got = rec.rows_of((k,))
        assert got == values[: len(got)], f"key {k}"
    for _, frames, _ in rec.calls:
        for f in frames:
            assert f["v"].is_monotonic_increasing


def test_rows_of_a_key_keep_arrival_order_across_a_restart(tmp_path):
    location = tmp_path / "ckpt"
    first = runner_for(mini_batch(max_rows=100)(count_sum), checkpoint_location=location)
    first.process(frame(k=[1, 2, 1], v=[0, 1, 2]))
    first.process(frame(k=[2, 1], v=[3, 4]))
    first.close()
    rec = Recorder()
    second = runner_for(mini_batch(max_rows=100, max_delay_ms=1)(rec), checkpoint_location=location)
    second.process(frame(k=[1, 2], v=[5, 6]))
    second.advance_time(1)
    assert rec.rows_of((1,)) == [0, 2, 4, 5]
    assert rec.rows_of((2,)) == [1, 3, 6]


def test_a_keys_buffered_rows_reach_fn_before_its_timeout_fires():
    """A row that arrived before a key's timeout is due must not be handed to fn after the timeout call:
    without the buffer (and in Spark) that row would have reached fn first and reset the timeout."""
    events = []

    @mini_batch(max_rows=100, max_delay_ms=10_000)
    def session(key, rows, state):
        if state.hasTimedOut:
            events.append("timeout")
            state.remove()
            return iter(())
        frames = list(rows)
        events.append(f"rows:{sum(len(f) for f in frames)}")
        state.update(((state.get[0] if state.exists else 0) + sum(len(f) for f in frames),))
        state.setTimeoutDuration(1_000)
        return iter(())

    clock = Clock(0)
    runner = runner_for(session, clock, timeout="processing")
    runner.process(frame(k=[1] * 100, v=range(100)))  # flushed by the count trigger; times out after 1000
    clock.now = 500
    runner.process(frame(k=[1], v=[100]))  # buffered, arrived before the timeout is due
    clock.now = 1_500
    runner.advance_time(0)
    clock.now = 20_000
    runner.advance_time(0)
    assert events[:2] == ["rows:100", "rows:1"], events


def test_flush_calls_fn_once_per_buffered_key():
    rec = Recorder()
    runner = runner_for(mini_batch(max_rows=6)(rec))
    runner.process(frame(k=[1, 2, 1, 2, 1, 3], v=range(6)))
    assert sorted(k for k, _, _ in rec.calls) == [(1,), (2,), (3,)]


# ---------------------------------------------------------------- combine
COMBINE = {"n": Count(), "s": Sum("v")}


@pytest.mark.parametrize("max_rows", [1, 5, 23])
@pytest.mark.parametrize("parallelism", [1, 2])
def test_combine_ends_in_the_same_state_and_output_as_no_combine(max_rows, parallelism):
    batches = random_batches(np.random.default_rng(max_rows), 10, 25, 6)
    plain_runner = runner_for(mini_batch(max_rows=max_rows, max_delay_ms=1_000)(count_sum), parallelism=parallelism)
    combined_runner = runner_for(
        mini_batch(max_rows=max_rows, max_delay_ms=1_000, combine=COMBINE)(count_sum_of_partials),
        parallelism=parallelism,
    )
    for batch in batches:
        a = plain_runner.process(batch)
        b = combined_runner.process(batch)
        assert sorted_rows(b) == sorted_rows(a)
    plain_runner.advance_time(1_000)
    combined_runner.advance_time(1_000)
    assert plain(combined_runner.state()) == plain(plain_runner.state())
    expected = pd.concat(batches).groupby("k")["v"].agg(["size", "sum"])
    assert plain(plain_runner.state()) == {(k,): (int(r["size"]), int(r["sum"])) for k, r in expected.iterrows()}


def test_a_callable_combiner_ends_in_the_same_state_as_no_combine():
    def weighted(key, rows, state):
        n, s = state.get if state.exists else (0, 0)
        for f in rows:
            n += int(f["w"].sum())
            s += int(f["v"].sum())
        state.update((n, s))
        return iter(())

    def reduce_rows(pdf: pd.DataFrame) -> pd.DataFrame:
        return pdf.groupby("k", as_index=False)[["v", "w"]].sum()

    batches = [b.assign(w=1) for b in random_batches(np.random.default_rng(3), 8, 20, 5)]
    expected = runner_for(mini_batch(max_rows=7, max_delay_ms=10)(weighted))
    combined = runner_for(mini_batch(max_rows=7, max_delay_ms=10, combine=reduce_rows)(weighted))
    for batch in batches:
        expected.process(batch)
        combined.process(batch)
    expected.advance_time(10)
    combined.advance_time(10)
    assert plain(combined.state()) == plain(expected.state())


def test_with_combine_fn_receives_one_combined_row_per_key_and_flush():
    rec = Recorder(count_sum_of_partials)
    runner = runner_for(mini_batch(max_rows=6, combine=COMBINE)(rec))
    runner.process(frame(k=[1, 2, 1, 1, 2, 3], v=[1, 2, 3, 4, 5, 6]))
    by_key = {k: frames for k, frames, _ in rec.calls}
    assert set(by_key) == {(1,), (2,), (3,)}
    for frames in by_key.values():
        assert sum(len(f) for f in frames) == 1
    assert by_key[(1,)][0][["n", "s"]].values.tolist() == [[3, 8]]


def test_with_combine_the_buffer_holds_one_partial_per_key_not_rows():
    runner = runner_for(mini_batch(max_delay_ms=10**9, combine=COMBINE)(count_sum_of_partials))
    rng = np.random.default_rng(0)
    runner.process(frame(k=rng.integers(0, 5, 100), v=rng.integers(0, 9, 100)))
    buffer = runner.instances[0].buffer
    small = len(pickle.dumps(buffer.snapshot()))
    for _ in range(20):
        runner.process(frame(k=rng.integers(0, 5, 500), v=rng.integers(0, 9, 500)))
    assert buffer.rows == 10_100
    assert len(buffer) == 5  # keys, not rows
    snapshot = buffer.snapshot()
    assert len(snapshot) == 5
    for _, (_, _, rows, _, payload) in snapshot.items():
        assert set(payload) == {"n", "s"}
        assert np.ndim(payload["n"]) == 0 and np.ndim(payload["s"]) == 0  # one partial, not rows
    assert len(pickle.dumps(snapshot)) <= small + 5 * 16  # O(keys): bigger sums only, no rows


def test_without_combine_the_buffer_keeps_every_row():
    runner = runner_for(mini_batch(max_delay_ms=10**9)(count_sum))
    runner.process(frame(k=[1, 1, 2], v=[1, 2, 3]))
    snapshot = runner.instances[0].buffer.snapshot()
    assert {denormalize_key(k): plain(p["v"]) for k, (*_, p) in snapshot.items()} == {(1,): [1, 2], (2,): [3]}


# ---------------------------------------------------------------- MiniBatchBuffer directly
def test_buffer_room_is_what_fits_before_the_count_trigger():
    buffer = MiniBatchBuffer(["k"], MiniBatchConfig(max_rows=5))
    assert buffer.room() == 5
    buffer.add(frame(k=[1, 2], v=[1, 2]), arrival_ms=0)
    assert buffer.room() == 3
    assert MiniBatchBuffer(["k"], MiniBatchConfig(max_delay_ms=5)).room() is None


def test_buffer_drain_yields_keys_in_first_arrival_order_and_empties_the_buffer():
    buffer = MiniBatchBuffer(["k"], MiniBatchConfig(max_rows=100))
    buffer.add(frame(k=[3, 1, 3], v=[0, 1, 2]), arrival_ms=0)
    buffer.add(frame(k=[2, 1], v=[3, 4]), arrival_ms=5)
    drained = [(denormalize_key(k), f["v"].tolist()) for k, f in buffer.drain()]
    assert drained == [((3,), [0, 2]), ((1,), [1, 4]), ((2,), [3])]
    assert buffer.rows == 0 and len(buffer) == 0 and not buffer.should_flush(10**9)


def test_buffer_snapshot_and_restore_give_back_the_same_pending_rows():
    config = MiniBatchConfig(max_rows=100, max_delay_ms=50)
    buffer = MiniBatchBuffer(["k"], config)
    buffer.add(frame(k=[3, 1, 3], v=[0, 1, 2]), arrival_ms=10)
    buffer.add(frame(k=[2, 1], v=[3, 4]), arrival_ms=20)
    copy = MiniBatchBuffer(["k"], config)
    copy.restore(iter(buffer.snapshot().items()))
    assert (copy.rows, len(copy), copy.oldest_ms) == (5, 3, 10)
    assert copy.should_flush(60) and not copy.should_flush(59)
    assert [(k, f["v"].tolist()) for k, f in copy.drain()] == [(k, f["v"].tolist()) for k, f in buffer.drain()]


def test_null_keys_are_grouped_as_one_key_as_spark_groups_them():
    buffer = MiniBatchBuffer(["k", "s"], MiniBatchConfig(max_rows=10), key_types=("long", "string"))
    frame = pd.DataFrame({"k": [1.0, None, np.nan, None], "s": ["a", None, None, "x"], "v": [1, 2, 3, 4]})
    buffer.add(frame, arrival_ms=0)
    assert [(k, f["v"].tolist()) for k, f in buffer.drain()] == [((1, "a"), [1]), ((None, None), [2, 3]), ((None, "x"), [4])]


def test_nan_in_a_double_key_column_is_a_key_of_its_own_and_null_elsewhere():
    doubles = MiniBatchBuffer(["k"], MiniBatchConfig(max_rows=10), key_types=("double",))
    doubles.add(pd.DataFrame({"k": [np.nan, 1.0, np.nan], "v": [1, 2, 3]}), arrival_ms=0)
    drained = [(k, f["v"].tolist()) for k, f in doubles.drain()]
    assert [v for _, v in drained] == [[1, 3], [2]] and drained[0][0] == normalize_key(float("nan"))
    longs = MiniBatchBuffer(["k"], MiniBatchConfig(max_rows=10), key_types=("long",))
    longs.add(pd.DataFrame({"k": [np.nan, 1.0], "v": [1, 2]}), arrival_ms=0)
    assert [k for k, _ in longs.drain()] == [(None,), 1]  # 1.0 of a long column with nulls is the long 1


@pytest.mark.parametrize("dtypes", [("int64", "int64"), ("int8", "uint16", "int32")], ids=["two-longs", "three-narrow-ints"])
def test_integer_key_columns_are_numbered_as_grouping_them_numbers_them(dtypes):
    """Several integer key columns are numbered by hashing (no groupby): the same codes, first-appearance
    order and plain int keys as the general way, which object columns take."""
    from buffering.buffer import factorize_keys

    rng = np.random.default_rng(5)
    n = 2_000
    frame = pd.DataFrame({f"c{i}": rng.integers(-9 if t[0] == "i" else 0, 9, n).astype(t) for i, t in enumerate(dtypes)})
    columns = list(frame.columns)
    codes, keys = factorize_keys(frame, columns)
    expected_codes, expected_keys = factorize_keys(frame.astype(object), columns)
    assert codes.tolist() == expected_codes.tolist()
    assert keys == expected_keys and all(type(e) is int for key in keys for e in key)
    assert len(keys) == len(frame.drop_duplicates())


@pytest.mark.parametrize(
    "values",
    [
        np.array([7, -3, 7, 2**63 - 1, -(2**63), 0], dtype=np.int64),
        np.array([5, 200, 5, 1], dtype=np.uint8),
        np.array([2**32 - 1, 3, 3], dtype=np.uint32),
        np.array(["b", "a", "b", "", "\u00e9"], dtype=object),
        np.array([2**63, 1, 2**63], dtype=np.uint64),  # past int64: refused by name, as before
        np.array(["a", 4, "a", 2.5], dtype=object),  # mixed: each value on its own
    ],
    ids=["int64", "uint8", "uint32", "str", "uint64-past-long", "mixed-object"],
)
def test_one_key_column_gives_the_keys_normalizing_each_value_gives(values):
    """One int or str column hands its unique values over as the keys; they are what normalizing each value
    one at a time gives (the way other columns take), in first-appearance order."""
    from buffering.buffer import factorize_keys

    frame = pd.DataFrame({"k": values})
    expected_codes, uniques = pd.factorize(frame["k"], sort=False, use_na_sentinel=False)
    try:
        expected = [normalize_key((v,)) for v in uniques.tolist()]
    except ValueError:
        with pytest.raises(ValueError, match=str(2**63)):
            factorize_keys(frame, ["k"])
        return
    codes, keys = factorize_keys(frame, ["k"])
    assert codes.tolist() == expected_codes.tolist()
    assert keys == expected and [type(k) for k in keys] == [type(k) for k in expected]


def test_integer_key_columns_too_many_to_number_in_one_long_take_the_general_way():
    from buffering.buffer import _integral_keys, factorize_keys

    wide = pd.DataFrame({f"c{i}": np.arange(300, dtype=np.int64) * (i + 1) for i in range(8)})  # 300**8 > 2**62
    assert _integral_keys(wide, list(wide.columns)) is None
    codes, keys = factorize_keys(wide, list(wide.columns))
    assert codes.tolist() == list(range(300)) and keys[7] == tuple(7 * (i + 1) for i in range(8))


# ------------------------------------------------------------------ accumulators combined upstream


def _accumulator_buffer(max_rows=None) -> MiniBatchBuffer:
    return MiniBatchBuffer(["k"], MiniBatchConfig(max_rows=max_rows, combine={"n": Count(), "s": Sum("v")}))


def test_add_accumulators_of_distinct_keys_keeps_each_key_and_its_row_count():
    buffer = _accumulator_buffer(max_rows=10)
    buffer.add_accumulators([1, 2], [{"n": 3, "s": 6}, {"n": 4, "s": 1}], [3, 4], arrival_ms=5)
    assert buffer.rows == 7 and buffer.oldest_ms == 5 and len(buffer) == 2
    assert not buffer.should_flush(5)
    assert buffer.drain_accumulators() == ([1, 2], [{"n": 3, "s": 6}, {"n": 4, "s": 1}])


def test_add_accumulators_merges_a_repeated_key_in_arrival_order():
    buffer = _accumulator_buffer()
    buffer.add_accumulators([1, 2, 1], [{"n": 1, "s": 1}, {"n": 1, "s": 2}, {"n": 2, "s": 3}], [1, 1, 2], arrival_ms=0)
    buffer.add_accumulators([2], [{"n": 5, "s": 5}], [5], arrival_ms=1)
    assert buffer.rows == 9
    assert buffer.drain_accumulators() == ([1, 2], [{"n": 3, "s": 4}, {"n": 6, "s": 7}])


def test_add_accumulators_counts_input_rows_for_the_count_trigger():
    buffer = _accumulator_buffer(max_rows=10)
    buffer.add_accumulators([1, 2], [{"n": 6, "s": 0}, {"n": 4, "s": 0}], [6, 4], arrival_ms=0)
    assert buffer.should_flush(0)
