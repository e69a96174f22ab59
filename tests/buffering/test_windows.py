"""aggregate(..., window=...) through LocalRunner: tumbling, hopping and session windows by event time.

Each window's rows are compared with a plain-Python reference over all the
input (every row put in its windows one by one); closing, grace, late rows,
deleted state and checkpoint restores are checked one behaviour per test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from buffering import Count, LocalRunner, Sum, aggregate, cached_state, mini_batch
from buffering.windows import Hopping, Session, Tumbling, WindowConfig, window_starts
from state import encode_key, normalize_key

from .helpers import Clock, plain

AGGS = {"n": Count(), "s": Sum("v")}
SECOND = 1000
FAR = 10**9  # an event time far after every other: its batch moves the watermark past every window


def ms(values) -> pd.Series:
    return pd.Series(pd.to_datetime(np.asarray(values, dtype=np.int64), unit="ms"))


def rows(k, ts, v=None) -> pd.DataFrame:
    v = list(range(len(ts))) if v is None else v
    return pd.DataFrame({"k": k, "ts": ms(ts), "v": np.asarray(v, dtype=np.int64)})


def batches(seed: int = 0, n: int = 6, span: int = 20 * SECOND, keys: int = 5) -> list[pd.DataFrame]:
    """Batch b has event times in [b * span, (b + 1) * span): with a delay of ``span`` no row is late."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(n):
        count = int(rng.integers(5, 40))
        out.append(rows(rng.integers(0, keys, count), rng.integers(b * span, (b + 1) * span, count),
                        rng.integers(-5, 50, count)))
    return out


def closing_batches() -> list[pd.DataFrame]:
    """A far-future row of key -1 (its batch sets the watermark), then an empty batch that runs with it."""
    return [rows([-1], [FAR], [0]), rows([], [], [])]


def table(frames: list[pd.DataFrame], drop_key=-1) -> dict[tuple, tuple]:
    """{(k, start ms, end ms): (n, s)} of output rows (each window must appear once)."""
    out: dict[tuple, tuple] = {}
    for frame in frames:
        for row in frame.to_dict("records"):
            if row["k"] == drop_key:
                continue
            key = (plain(row["k"]), _ms(row["window_start"]), _ms(row["window_end"]))
            assert key not in out, f"window {key} emitted twice"
            out[key] = (plain(row["n"]), plain(row["s"]))
    return out


def _ms(value) -> int:
    return int(pd.Timestamp(value).value // 1_000_000)


def fixed_reference(frames: list[pd.DataFrame], size: int, slide: int) -> dict[tuple, tuple]:
    """Every row added to each window [start, start + size) holding it, starts at multiples of slide."""
    out: dict[tuple, list[int]] = {}
    for frame in frames:
        for k, t, v in zip(frame["k"].tolist(), frame["ts"].tolist(), frame["v"].tolist()):
            t = _ms(t)
            start = t - t % slide
            while start + size > t:
                acc = out.setdefault((k, start, start + size), [0, 0])
                acc[0] += 1
                acc[1] += v
                start -= slide
    return {key: tuple(acc) for key, acc in out.items()}


def session_reference(frames: list[pd.DataFrame], gap: int) -> dict[tuple, tuple]:
    """Per key, rows by time; a row at or before the current session's end joins it."""
    df = pd.concat(frames, ignore_index=True)
    out = {}
    for k, group in df.groupby("k"):
        events = sorted(zip((_ms(t) for t in group["ts"]), group["v"].tolist()))
        start = end = None
        n = s = 0
        for t, v in events:
            if start is not None and t <= end:
                end, n, s = max(end, t + gap), n + 1, s + v
                continue
            if start is not None:
                out[(k, start, end)] = (n, s)
            start, end, n, s = t, t + gap, 1, v
        out[(k, start, end)] = (n, s)
    return out


def run(op, frames, **kwargs) -> tuple[LocalRunner, list[pd.DataFrame]]:
    kwargs.setdefault("watermark_delay_ms", 20 * SECOND)
    runner = LocalRunner(op, key="k", event_time="ts", clock=Clock(), **kwargs)
    return runner, [runner.process(f) for f in frames]


# ---------------------------------------------------------------- results
@pytest.mark.parametrize("parallelism", [1, 3])
def test_tumbling_windows_are_emitted_once_each_with_all_their_rows(parallelism):
    frames = batches(1)
    runner, outputs = run(aggregate(AGGS, window=Tumbling("10s")), frames + closing_batches(), parallelism=parallelism)
    assert table(outputs) == fixed_reference(frames, 10 * SECOND, 10 * SECOND)


def test_a_tumbling_window_is_emitted_in_the_first_batch_whose_watermark_reaches_its_end():
    runner = LocalRunner(aggregate(AGGS, window=Tumbling("10s")), key="k", event_time="ts", watermark_delay_ms=0)
    assert len(runner.process(rows([1, 1], [1 * SECOND, 9 * SECOND]))) == 0  # watermark 0
    assert len(runner.process(rows([1], [9_999]))) == 0  # watermark 9 s: [0 s, 10 s) still open
    out = runner.process(rows([2], [15 * SECOND]))  # watermark 9.999 s: still open
    assert len(out) == 0
    out = runner.process(rows([2], [16 * SECOND]))  # watermark 15 s >= 10 s: closes
    assert table([out]) == {(1, 0, 10 * SECOND): (3, 0 + 1 + 0)}


def test_hopping_windows_hold_each_row_once_per_window_that_covers_it():
    frames = batches(2)
    runner, outputs = run(aggregate(AGGS, window=Hopping("10s", "4s")), frames + closing_batches())
    expected = fixed_reference(frames, 10 * SECOND, 4 * SECOND)
    assert table(outputs) == expected
    assert any(start % (10 * SECOND) for _, start, _ in expected)  # windows between the tumbling ones exist


def test_session_windows_merge_rows_within_the_gap_across_batches():
    frames = batches(3, span=30 * SECOND, keys=3)
    runner, outputs = run(aggregate(AGGS, window=Session("4s")), frames + closing_batches(), watermark_delay_ms=30 * SECOND)
    expected = session_reference(frames, 4 * SECOND)
    assert table(outputs) == expected
    assert any(n > 1 for n, _ in expected.values()) and len(expected) > 3  # merged and separate sessions both occur


def test_a_late_row_that_bridges_two_open_sessions_merges_them_into_one():
    runner = LocalRunner(aggregate(AGGS, window=Session("5s")), key="k", event_time="ts", watermark_delay_ms=60 * SECOND)
    runner.process(rows([1, 1], [0, 8 * SECOND], [1, 2]))  # two sessions: [0, 5 s) and [8 s, 13 s)
    runner.process(rows([1], [4 * SECOND], [4]))  # [4 s, 9 s) overlaps both
    assert runner.get_state(1) == [[0, 13 * SECOND, {"n": 3, "s": 7}]]
    out = [runner.process(f) for f in closing_batches()]
    assert table(out) == {(1, 0, 13 * SECOND): (3, 7)}


def test_event_times_given_as_epoch_milliseconds_give_the_same_windows():
    frames = batches(4)
    numeric = [f.assign(ts=f["ts"].astype("int64") // 1_000_000) for f in frames + closing_batches()]
    _, outputs = run(aggregate(AGGS, window=Tumbling(10 * SECOND)), numeric)
    assert table(outputs) == fixed_reference(frames, 10 * SECOND, 10 * SECOND)


def test_window_columns_are_utc_timestamps_after_the_key_columns():
    runner = LocalRunner(aggregate(AGGS, window=Tumbling("1 minute")), key="k", event_time="ts")
    runner.process(rows([7], [61 * SECOND]))
    runner.process(rows([8], [200 * SECOND]))
    out = runner.process(rows([8], [201 * SECOND]))  # watermark 200 s: [60 s, 120 s) closes
    assert list(out.columns) == ["k", "window_start", "window_end", "n", "s"]
    assert out["window_start"].iloc[0] == pd.Timestamp("1970-01-01 00:01:00", tz="UTC")
    assert out["window_end"].iloc[0] == pd.Timestamp("1970-01-01 00:02:00", tz="UTC")


def test_update_mode_emits_the_running_result_of_every_window_a_batch_changed():
    runner = LocalRunner(
        aggregate(AGGS, window=Tumbling("10s"), emit="update"), key="k", event_time="ts", watermark_delay_ms=60 * SECOND
    )
    first = runner.process(rows([1, 1, 2], [1 * SECOND, 12 * SECOND, 3 * SECOND], [1, 2, 3]))
    assert table([first]) == {(1, 0, 10 * SECOND): (1, 1), (1, 10 * SECOND, 20 * SECOND): (1, 2), (2, 0, 10 * SECOND): (1, 3)}
    second = runner.process(rows([1], [5 * SECOND], [10]))
    assert table([second]) == {(1, 0, 10 * SECOND): (2, 11)}  # only the window that changed, with its total


def test_update_mode_emits_nothing_when_a_window_closes():
    runner = LocalRunner(aggregate(AGGS, window=Tumbling("10s"), emit="update"), key="k", event_time="ts")
    runner.process(rows([1], [1 * SECOND]))
    out = runner.process(rows([2], [50 * SECOND]))  # watermark 1 s
    assert table([out]) == {(2, 50 * SECOND, 60 * SECOND): (1, 0)}
    out = runner.process(rows([], []))  # watermark 50 s: key 1's window closes
    assert len(out) == 0
    assert runner.state() == {(2, 50 * SECOND): {"n": 1, "s": 0}}  # key 1's window closed: gone, not emitted again


def test_update_mode_emits_a_session_with_its_bounds_after_a_merge():
    runner = LocalRunner(
        aggregate(AGGS, window=Session("5s"), emit="update"), key="k", event_time="ts", watermark_delay_ms=60 * SECOND
    )
    first = runner.process(rows([1, 1], [0, 8 * SECOND], [1, 2]))
    assert table([first]) == {(1, 0, 5 * SECOND): (1, 1), (1, 8 * SECOND, 13 * SECOND): (1, 2)}
    second = runner.process(rows([1], [4 * SECOND], [4]))
    assert table([second]) == {(1, 0, 13 * SECOND): (3, 7)}


# ---------------------------------------------------------------- grace and late rows
def test_grace_keeps_a_window_open_for_rows_after_its_end():
    runner = LocalRunner(aggregate(AGGS, window=Tumbling("10s"), grace="5s"), key="k", event_time="ts")
    runner.process(rows([1], [1 * SECOND], [1]))
    assert len(runner.process(rows([2], [13 * SECOND], [0]))) == 0  # watermark 1 s
    out = runner.process(rows([1], [2 * SECOND], [5]))  # watermark 13 s < 10 s + 5 s: the window takes the row
    assert len(out) == 0 and runner.stats()["dropped_late_rows"] == 0
    out = runner.process(rows([2], [20 * SECOND], [0]))  # watermark 13 s: still open
    assert len(out) == 0
    out = runner.process(rows([2], [21 * SECOND], [0]))  # watermark 20 s >= 15 s: closes; [10 s, 20 s) needs 25 s
    assert table([out]) == {(1, 0, 10 * SECOND): (2, 6)}


def test_rows_of_windows_the_previous_batchs_watermark_closed_are_dropped_and_counted_in_the_batch_stats():
    runner = LocalRunner(aggregate(AGGS, window=Tumbling("10s")), key="k", event_time="ts")
    runner.process(rows([1, 1], [1 * SECOND, 30 * SECOND]))  # the next batch runs with watermark 30 s
    closed = runner.process(rows([9], [30 * SECOND]))  # closes [0, 10 s); the batch after filters by 30 s
    out = runner.process(rows([1, 1, 2, 1], [2 * SECOND, 25 * SECOND, 29_999, 31 * SECOND]))
    assert runner.stats()["dropped_late_rows"] == 3  # [0, 10 s) and [20 s, 30 s) closed by 30 s
    assert table([closed]) == {(1, 0, 10 * SECOND): (1, 0)}
    assert table([out]) == {}
    assert {k: v for k, v in runner.state().items() if k[0] == 1} == {(1, 30 * SECOND): {"n": 2, "s": 4}}


def test_a_row_behind_the_watermark_but_not_the_previous_batchs_is_counted_as_in_spark():
    """Spark filters a batch's rows by its watermark for late events (the one the previous batch ran
    with) and closes windows by the batch's own (tests/spark/test_windows_parity.py checks it on Spark)."""
    runner = LocalRunner(aggregate(AGGS, window=Tumbling("10s")), key="k", event_time="ts")
    runner.process(rows([1, 1], [1 * SECOND, 30 * SECOND]))  # the next batch runs with 30 s, filters by 0
    out = runner.process(rows([1, 1, 2, 1], [2 * SECOND, 25 * SECOND, 29_999, 31 * SECOND]))
    assert runner.stats()["dropped_late_rows"] == 0
    assert table([out]) == {(1, 0, 10 * SECOND): (2, 0), (1, 20 * SECOND, 30 * SECOND): (1, 1), (2, 20 * SECOND, 30 * SECOND): (1, 2)}


def test_a_hopping_row_late_for_some_of_its_windows_counts_once_per_closed_window():
    runner = LocalRunner(aggregate(AGGS, window=Hopping("10s", "5s")), key="k", event_time="ts")
    runner.process(rows([1], [20 * SECOND]))  # the next batch runs with watermark 20 s
    runner.process(rows([9], [20 * SECOND]))  # the batch after it filters by 20 s
    runner.process(rows([1], [17 * SECOND], [3]))  # windows [10 s, 20 s) closed, [15 s, 25 s) open
    assert runner.stats()["dropped_late_rows"] == 1
    assert runner.state()[(1, 15 * SECOND)] == {"n": 2, "s": 3}


def test_a_row_whose_own_session_closed_is_late():
    runner = LocalRunner(aggregate(AGGS, window=Session("5s")), key="k", event_time="ts")
    runner.process(rows([1], [30 * SECOND]))  # the next batch runs with watermark 30 s
    runner.process(rows([9], [30 * SECOND]))  # the batch after it filters by 30 s
    runner.process(rows([2, 2], [20 * SECOND, 26 * SECOND]))  # [20 s, 25 s) closed; [26 s, 31 s) open
    assert runner.stats()["dropped_late_rows"] == 1
    assert runner.get_state(2) == [[26 * SECOND, 31 * SECOND, {"n": 1, "s": 1}]]


# ---------------------------------------------------------------- state lifetime
@pytest.mark.parametrize(
    "window", [Tumbling("10s"), Hopping("10s", "5s"), Session("3s")], ids=["tumbling", "hopping", "session"]
)
def test_the_state_of_closed_windows_is_deleted(window):
    frames = batches(5)
    runner, _ = run(aggregate(AGGS, window=window), frames)
    assert runner.state()  # open windows are held
    for f in closing_batches():
        runner.process(f)
    kept = runner.state()
    assert all(k[0] == -1 for k in kept), kept  # only the far-future row's window is left
    assert sum(i["closed_windows"] for i in runner.stats()["instances"]) > 0


def test_windows_are_closed_with_the_pending_partials_of_a_delay_buffer():
    op = mini_batch(max_delay_ms=10_000)(aggregate(AGGS, window=Tumbling("10s")))
    frames = batches(6)
    _, outputs = run(op, frames + closing_batches())  # the clock never moves: the delay trigger never fires
    assert table(outputs) == fixed_reference(frames, 10 * SECOND, 10 * SECOND)


# ---------------------------------------------------------------- checkpoints
@pytest.mark.parametrize(
    "window", [Tumbling("30s"), Hopping("30s", "10s"), Session("3s")], ids=["tumbling", "hopping", "session"]
)
@pytest.mark.parametrize("parallelism_after", [2, 3])
def test_a_restore_mid_window_at_another_parallelism_gives_the_uninterrupted_output(tmp_path, window, parallelism_after):
    op = cached_state(max_entries=50, store="rocksdb")(aggregate(AGGS, window=window))
    frames = batches(7, n=8) + closing_batches()
    _, uninterrupted = run(op, frames, parallelism=2)
    first, before = run(op, frames[:4], parallelism=2, checkpoint_location=str(tmp_path / "ckpt"))
    assert first.state()  # windows are open at the restart
    first.close()
    second, after = run(op, frames[4:], parallelism=parallelism_after, checkpoint_location=str(tmp_path / "ckpt"))
    assert table(before + after) == table(uninterrupted)
    assert table(uninterrupted)


def test_a_windows_state_is_restored_to_the_instance_that_owns_its_keys_key_group(tmp_path):
    from state.keys import key_group

    op = aggregate(AGGS, window=Tumbling("1h"))
    first, _ = run(op, batches(8, keys=40), parallelism=2, checkpoint_location=str(tmp_path / "ckpt"))
    windows = set(first.state())
    first.close()
    second = LocalRunner(op, key="k", event_time="ts", parallelism=3, checkpoint_location=str(tmp_path / "ckpt"))
    held = 0
    for instance in second.instances:
        for k, start in instance.state_items():
            assert key_group((k,), types=["long"]) in instance.key_groups, (k, start, instance.index)
            held += 1
    assert held == len(windows) > 20


def test_a_windowed_checkpoint_reads_back_with_a_window_start_column(tmp_path):
    from checkpoint import read_state

    runner, _ = run(aggregate(AGGS, window=Tumbling("1h")), batches(4, keys=10), checkpoint_location=str(tmp_path / "ckpt"))
    expected = sorted(runner.state())
    runner.close()
    state = read_state(str(tmp_path / "ckpt"))
    assert list(state.columns) == ["k", "window_start", "state"]
    assert sorted(zip(state["k"], state["window_start"])) == expected and expected


def test_windows_of_a_two_column_string_key_survive_a_restore_at_another_parallelism(tmp_path):
    frames = [f.assign(user=f["k"].map(lambda k: f"u{k % 3}"), k=f["k"].map(lambda k: f"t{k}")) for f in batches(9)]
    closing = [f.assign(user="u", k=f["k"].astype(str)) for f in closing_batches()]
    op = aggregate(AGGS, window=Tumbling("30s"))

    def run_at(parallelism, parts, location):
        runner = LocalRunner(op, key=["k", "user"], event_time="ts", watermark_delay_ms=20 * SECOND,
                             parallelism=parallelism, checkpoint_location=location)
        outs = [runner.process(f) for f in parts]
        runner.close()
        return outs

    location = str(tmp_path / "ckpt")
    outputs = run_at(2, frames[:3], location) + run_at(3, frames[3:] + closing, location)
    got = {}
    for out in outputs:
        for row in out.to_dict("records"):
            if row["user"] != "u":
                key = (row["k"], row["user"], _ms(row["window_start"]))
                assert key not in got
                got[key] = (row["n"], row["s"])
    df = pd.concat(frames, ignore_index=True)
    start = df["ts"].astype("int64") // 1_000_000 // (30 * SECOND) * (30 * SECOND)
    expected = df.assign(start=start).groupby(["k", "user", "start"])["v"].agg(["size", "sum"])
    assert got == {key: (int(n), int(v)) for key, (n, v) in zip(expected.index, expected.to_numpy())}


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Tumbling("ten seconds"), "'ten seconds'"),
        (lambda: Tumbling(0), "Tumbling(size) must be a positive duration, got 0"),
        (lambda: Tumbling(-5), "got -5"),
        (lambda: Tumbling(1.5), "1.5"),
        (lambda: Tumbling("10s", offset="10s"), "offset='10s'"),
        (lambda: Tumbling(None), "Tumbling(size) must be a duration"),
        (lambda: Hopping("10s", "20s"), "slide='20s'"),
        (lambda: Hopping("10s", 0), "Hopping(slide) must be a positive duration, got 0"),
        (lambda: Session(True), "Session(gap) must be a duration"),
        (lambda: aggregate(AGGS, window="10s"), "'10s'"),
        (lambda: aggregate(AGGS, window=Tumbling("1s"), emit="append"), "'append'"),
        (lambda: aggregate(AGGS, window=Tumbling("1s"), grace="-1s"), "grace"),
        (lambda: aggregate(AGGS, grace="1s"), "window="),
        (lambda: aggregate({"window_start": Count()}, window=Tumbling("1s")), "window_start"),
        (lambda: cached_state(ttl_ms=1000)(aggregate(AGGS, window=Tumbling("1s"))), "ttl_ms=1000"),
    ],
)
def test_a_bad_window_setting_is_an_error_naming_the_value(make, message):
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    assert message in str(info.value)


def test_a_windowed_aggregate_needs_the_runners_event_time_column():
    with pytest.raises(ValueError, match="event_time="):
        LocalRunner(aggregate(AGGS, window=Tumbling("10s")), key="k")


def test_a_key_column_named_like_a_window_column_is_refused():
    runner = LocalRunner(aggregate(AGGS, window=Tumbling("10s")), key="window_end", event_time="ts")
    with pytest.raises(ValueError, match="window_end"):
        runner.process(pd.DataFrame({"window_end": [1], "ts": ms([1]), "v": [1]}))


@pytest.mark.parametrize(
    "keys",
    [[(k, k * 60_000 - 10**12) for k in range(40)], [("x" * (k % 5), k, -(2**63) + k) for k in range(40)]],
    ids=["one-width", "several-widths"],
)
def test_window_starts_are_the_last_element_of_each_raw_key(keys):
    raws = [b"\x00\x03" + encode_key(normalize_key(k)) for k in keys]
    assert window_starts(raws).tolist() == [k[-1] for k in keys]


def test_window_config_reads_durations_as_milliseconds():
    config = WindowConfig.of(Hopping("1 minute", pd.Timedelta(seconds=15)), grace="2s")
    assert (config.spec.size_ms, config.spec.slide_ms, config.grace_ms) == (60_000, 15_000, 2_000)


def test_partials_of_closed_windows_given_as_columns_are_dropped_counted_and_not_merged(tmp_path):
    import numpy as np

    from buffering import OperatorInstance

    op = aggregate({"n": Count()}, window=Tumbling("1 minute"))
    instance = OperatorInstance(op.__opbuffer__, key_columns=["k"], key_types=("long",), index=0, parallelism=1,
                                max_parallelism=128, watermark_present=True, event_time="ts",
                                workdir=str(tmp_path / "db"))
    # watermark 2 minutes: the window of minute 0 has closed, the one of minute 2 is open
    out = instance.process_columns([(1, 0), (1, 120_000)], None, {"n": np.array([3, 4])}, [3, 4], 0, 120_000)
    assert out == []  # emission on watermark: nothing yet
    assert instance.metrics.late_rows == 3
    assert instance.metrics.calls == 1
    assert {k: dict(v) for k, v in instance.state_items().items()} == {(1, 120_000): {"n": 4}}
    instance.close()


@pytest.mark.parametrize("layout, pop", [("key", "pop_many"), ("key_group", "pop_selected")])
def test_a_batch_that_fails_while_closing_windows_leaves_them_open_and_a_retry_emits_each_once(
    monkeypatch, tmp_path, layout, pop
):
    from state.blocks import KeyGroupCache
    from state.cache.writeback import WriteBackCache

    frames = batches(2)
    op = cached_state(max_entries=10_000, layout=layout)(aggregate(AGGS, window=Tumbling("10s")))
    runner = LocalRunner(op, key="k", event_time="ts", watermark_delay_ms=20 * SECOND, clock=Clock(),
                         checkpoint_location=str(tmp_path / "ck"))
    outputs = [runner.process(f) for f in frames[:3]]
    cache = WriteBackCache if layout == "key" else KeyGroupCache
    popped = getattr(cache, pop)

    def pops_then_fails(self, *args, **kwargs):
        popped(self, *args, **kwargs)  # the closed windows' state is gone when the failure comes
        raise OSError("disk gone while closing windows")

    monkeypatch.setattr(cache, pop, pops_then_fails)
    with pytest.raises(OSError, match="closing windows"):
        runner.process(frames[3])
    monkeypatch.undo()
    outputs += [runner.process(f) for f in frames[3:] + closing_batches()]
    assert table(outputs) == fixed_reference(frames, 10 * SECOND, 10 * SECOND)
