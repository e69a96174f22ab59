"""A failed batch is rolled back: state, pending rows and timers stay at the last committed version."""

from __future__ import annotations

import errno
import threading

import pandas as pd
import pytest

from buffering import LocalRunner, cached_state, mini_batch
from checkpoint import CheckpointWriter
from state import StateSerializationError

from .helpers import Clock


class Switch:
    """Makes the operator fail on one key while ``armed``."""

    def __init__(self) -> None:
        self.fail_key = None

    def check(self, key) -> None:
        if key == self.fail_key:
            raise RuntimeError(f"injected failure on key {key}")


def counting(switch: Switch):
    def fn(key, rows, state):
        counts = state.get[0] if state.exists else []
        counts.append(sum(len(r) for r in rows))  # changed in place: the cache holds this very list
        state.update((counts,))
        switch.check(key[0])
        yield pd.DataFrame({"k": [key[0]], "n": [sum(counts)]})

    return fn


def totals(runner: LocalRunner) -> dict:
    return {k[0]: sum(v[0]) for k, v in runner.state().items()}


def batch(*keys: int) -> pd.DataFrame:
    return pd.DataFrame({"k": list(keys)})


LOCATIONS = ["checkpoint", "no-checkpoint"]


def runner_for(fn, where: str, tmp_path, **kwargs) -> LocalRunner:
    location = tmp_path / "ckpt" if where == "checkpoint" else None
    return LocalRunner(fn, key="k", clock=Clock(), checkpoint_location=location, **kwargs)


@pytest.mark.parametrize("where", LOCATIONS)
def test_a_function_failing_mid_batch_leaves_state_at_the_last_version(where, tmp_path):
    switch = Switch()
    runner = runner_for(cached_state(max_entries=100)(counting(switch)), where, tmp_path)
    runner.process(batch(1, 2, 3))
    switch.fail_key = 3
    with pytest.raises(RuntimeError, match="injected"):
        runner.process(batch(1, 1, 2, 3))  # keys 1 and 2 are updated before key 3 fails
    assert totals(runner) == {1: 1, 2: 1, 3: 1}
    assert runner.version == 0


@pytest.mark.parametrize("where", LOCATIONS)
def test_a_retry_of_a_failed_batch_counts_each_row_once(where, tmp_path):
    switch = Switch()
    runner = runner_for(counting(switch), where, tmp_path)
    runner.process(batch(1, 2, 3))
    switch.fail_key = 3
    with pytest.raises(RuntimeError):
        runner.process(batch(1, 1, 2, 3))
    switch.fail_key = None
    out = runner.process(batch(1, 1, 2, 3))
    assert dict(zip(out["k"], out["n"])) == {1: 3, 2: 2, 3: 2}
    assert totals(runner) == {1: 3, 2: 2, 3: 2}


@pytest.mark.parametrize("where", LOCATIONS)
def test_after_a_failed_batch_the_next_one_builds_on_the_last_committed_state(where, tmp_path):
    switch = Switch()
    runner = runner_for(counting(switch), where, tmp_path)
    runner.process(batch(1, 2))
    switch.fail_key = 2
    with pytest.raises(RuntimeError):
        runner.process(batch(1, 2))
    switch.fail_key = None
    runner.process(batch(1))
    assert totals(runner) == {1: 2, 2: 1}


@pytest.mark.parametrize("where", LOCATIONS)
def test_pending_rows_of_a_committed_batch_survive_a_failed_flush(where, tmp_path):
    switch = Switch()
    fn = mini_batch(max_rows=5)(counting(switch))
    runner = runner_for(fn, where, tmp_path)
    assert runner.process(batch(1, 2, 1)).empty  # 3 rows pending, committed as pending
    switch.fail_key = 2
    with pytest.raises(RuntimeError):
        runner.process(batch(2, 3))  # the 5th row triggers a flush; key 2 fails in it
    switch.fail_key = None
    runner.process(batch(2, 3))
    assert totals(runner) == {1: 2, 2: 2, 3: 1}


@pytest.mark.parametrize("where", LOCATIONS)
def test_a_timeout_call_failing_in_advance_time_keeps_the_timer_and_the_clock(where, tmp_path):
    calls = []
    switch = Switch()

    def fn(key, rows, state):
        if state.hasTimedOut:
            calls.append(key[0])
            switch.check(key[0])
            state.remove()
            yield pd.DataFrame({"k": [key[0]], "n": [-1]})
            return
        state.update((1,))
        state.setTimeoutDuration(1_000)
        yield pd.DataFrame({"k": [key[0]], "n": [1]})

    runner = runner_for(fn, where, tmp_path, timeout="processing")
    runner.process(batch(1, 2))
    switch.fail_key = 2
    with pytest.raises(RuntimeError):
        runner.advance_time(1_500)
    assert set(runner.state()) == {(1,), (2,)}
    switch.fail_key = None
    out = runner.advance_time(1_500)  # the retry moves time by 1500 ms, not 3000
    assert sorted(out["k"]) == [1, 2] and runner.state() == {}
    assert calls == [1, 2, 1, 2] or sorted(calls) == [1, 1, 2, 2]


@pytest.mark.parametrize("where", LOCATIONS)
def test_a_value_that_cannot_be_pickled_fails_the_batch_and_leaves_state_as_it_was(where, tmp_path):
    def fn(key, rows, state):
        value = threading.Lock() if key[0] == 9 else sum(len(r) for r in rows)
        state.update((value,))
        yield pd.DataFrame({"k": [key[0]]})

    runner = runner_for(cached_state(max_entries=100)(fn), where, tmp_path)
    runner.process(batch(1, 2))
    with pytest.raises(StateSerializationError, match=r"key \(9,\)"):
        runner.process(batch(1, 9))
    assert runner.state() == {(1,): (1,), (2,): (1,)}
    runner.process(batch(1))
    assert runner.state() == {(1,): (1,), (2,): (1,)}


@pytest.mark.parametrize("where", LOCATIONS)
def test_a_value_that_cannot_be_pickled_into_an_uncached_store_fails_naming_the_key_and_leaves_state_as_it_was(
    where, tmp_path
):
    def fn(key, rows, state):
        count = (state.get[0] if state.exists else 0) + sum(len(r) for r in rows)
        state.update((threading.Lock() if key[0] == 9 else count,))
        yield pd.DataFrame({"k": [key[0]]})

    runner = runner_for(cached_state(store="rocksdb")(fn), where, tmp_path)  # no bound: every update is a put
    runner.process(batch(1, 2))
    with pytest.raises(StateSerializationError, match=r"key \(9,\) .*table='state'") as info:
        runner.process(batch(1, 9))
    assert isinstance(info.value, TypeError) and isinstance(info.value.__cause__, TypeError)
    assert runner.state() == {(1,): (1,), (2,): (1,)}  # key 1's count of the failed batch is gone too


def test_a_full_disk_while_writing_the_checkpoint_leaves_state_as_it_was(tmp_path, monkeypatch):
    switch = Switch()
    runner = runner_for(counting(switch), "checkpoint", tmp_path)
    runner.process(batch(1, 2))
    original = CheckpointWriter.write

    def full_disk(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(CheckpointWriter, "write", full_disk)
    with pytest.raises(OSError, match="No space"):
        runner.process(batch(1, 1, 2))
    monkeypatch.setattr(CheckpointWriter, "write", original)
    assert totals(runner) == {1: 1, 2: 1}
    runner.process(batch(1, 1, 2))
    assert totals(runner) == {1: 3, 2: 2}


@pytest.mark.parametrize("where", LOCATIONS)
def test_a_function_returning_a_dataframe_is_refused_naming_the_key_and_commits_nothing(where, tmp_path):
    def fn(key, rows, state):
        state.update((1,))
        return pd.DataFrame({"k": [key[0]]})

    runner = runner_for(fn, where, tmp_path)
    with pytest.raises(TypeError, match=r"returned a DataFrame for key \(7,\).*yield df"):
        runner.process(batch(7))
    assert runner.version is None and runner.state() == {}


@pytest.mark.parametrize(
    "bad, shown",
    [({"k": [1]}, "dict"), ([1, 2], "int"), ("text", "str")],
    ids=["dict", "list of ints", "str"],
)
def test_a_function_yielding_anything_but_dataframes_is_refused_naming_the_key(bad, shown, tmp_path):
    def fn(key, rows, state):
        if isinstance(bad, list):
            yield from bad
        else:
            yield bad

    runner = runner_for(fn, "checkpoint", tmp_path)
    with pytest.raises(TypeError, match=rf"{shown}.*key \(5,\)"):
        runner.process(batch(5))
    assert runner.version is None


def test_a_function_returning_a_dict_is_refused_naming_the_key(tmp_path):
    def fn(key, rows, state):
        return {"k": key[0]}

    runner = runner_for(fn, "checkpoint", tmp_path)
    with pytest.raises(TypeError, match=r"returned dict .*key \(4,\)"):
        runner.process(batch(4))


def test_without_a_location_the_private_checkpoint_is_deleted_on_close():
    import os

    runner = LocalRunner(counting(Switch()), key="k", clock=Clock())
    runner.process(batch(1))
    private = runner.storage.root if hasattr(runner.storage, "root") else runner._private_dir
    assert os.path.isdir(private)
    runner.close()
    assert not os.path.exists(private)


def test_a_generator_that_returns_its_frame_instead_of_yielding_it_is_refused(tmp_path):
    def fn(key, rows, state):
        if False:
            yield None
        return pd.DataFrame({"k": [key[0]]})

    runner = runner_for(fn, "checkpoint", tmp_path)
    with pytest.raises(TypeError, match=r"key \(6,\).*use 'yield df'"):
        runner.process(batch(6))
