"""cached_state(ttl_ms=...): state not updated for ttl_ms of processing time expires (Spark's TTL rule).

Every update sets a key's expiry to the batch's processing time + ttl_ms; from
the first batch whose processing time reaches it the function sees the key
without state, and the batch's end sweeps it away. The expiries are a
checkpointed table, so they survive restores at any parallelism.
"""

from __future__ import annotations

from typing import Any, Iterator

import pandas as pd
import pytest

from buffering import Count, LocalRunner, aggregate, cached_state

from .helpers import Clock, checkpoint_table, count_sum, frame, plain

TTL = 100


def seen(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """Emits the state the call saw (None: no state), then counts the rows into it."""
    before = state.get[0] if state.exists else None
    n = (before or 0) + sum(len(f) for f in rows)
    state.update((n,))
    yield pd.DataFrame({"k": [key[0]], "before": [before]}, dtype=object)


def saw(out: pd.DataFrame) -> dict:
    return {plain(k): plain(b) for k, b in zip(out["k"], out["before"])}


def batch(*keys: int) -> pd.DataFrame:
    return frame(k=list(keys), v=[1] * len(keys))


def empty() -> pd.DataFrame:
    return pd.DataFrame({"k": pd.Series([], dtype="int64"), "v": pd.Series([], dtype="int64")})


def test_state_is_invisible_to_the_function_once_processing_time_reaches_update_plus_ttl(tmp_path):
    clock = Clock(1_000)
    runner = LocalRunner(cached_state(ttl_ms=TTL)(seen), key="k", clock=clock)
    runner.process(batch(1, 2))
    clock.now = 1_000 + TTL - 1
    assert saw(runner.process(batch(1))) == {1: 1}  # one ms before its expiry: still there
    clock.now = 1_000 + TTL
    assert saw(runner.process(batch(2))) == {2: None}  # at its expiry: gone (Spark: expiry <= batch time)


def test_an_update_resets_the_expiry_to_processing_time_plus_ttl():
    clock = Clock(1_000)
    runner = LocalRunner(cached_state(ttl_ms=TTL)(seen), key="k", clock=clock)
    runner.process(batch(1))
    clock.now = 1_060
    assert saw(runner.process(batch(1))) == {1: 1}  # the update moves the expiry to 1_160
    clock.now = 1_150
    assert saw(runner.process(batch(1))) == {1: 2}  # past the first expiry, not the second; moves it to 1_250
    clock.now = 1_250
    assert saw(runner.process(batch(1))) == {1: None}


def test_a_call_that_does_not_update_the_state_leaves_its_expiry():
    def update_once(key, rows, state):
        for _ in rows:
            pass
        if not state.exists:
            state.update((1,))
        yield pd.DataFrame({"k": [key[0]], "exists": [state.exists]})

    clock = Clock(0)
    runner = LocalRunner(cached_state(ttl_ms=TTL)(update_once), key="k", clock=clock)
    runner.process(batch(1))
    clock.now = TTL - 1
    runner.process(batch(1))  # reads the state, does not update it
    clock.now = TTL
    runner.process(empty())
    assert runner.state() == {}


@pytest.mark.parametrize("cache", [{}, {"max_entries": 1}], ids=["unbounded-cache", "one-entry-cache"])
def test_the_end_of_the_batch_sweeps_exactly_the_expired_keys_from_state_and_checkpoint(tmp_path, cache):
    clock = Clock(0)
    location = tmp_path / "cp"
    runner = LocalRunner(cached_state(ttl_ms=TTL, **cache)(count_sum), key="k", clock=clock, checkpoint_location=location)
    runner.process(batch(1, 2, 3))
    clock.now = 50
    runner.process(batch(3, 4))
    clock.now = TTL  # 1 and 2 expire; 3 was updated at 50, 4 written at 50
    assert runner.process(empty()).empty
    assert set(runner.state()) == {(3,), (4,)}
    assert set(checkpoint_table(location)) == {(3,), (4,)}
    assert checkpoint_table(location, "ttl") == {(3,): 50 + TTL, (4,): 50 + TTL}
    assert runner.stats()["instances"][0]["expired"] == 2


def test_the_sweep_deletes_only_the_expired_keys_and_reads_no_other_entry(tmp_path, monkeypatch):
    """Work proportional to what expires: 3 of 3,003 keys expire; the sweep deletes 3 entries of each table
    (state, ttl, ttl.order) and reads the order entries due plus at most one more per key group."""
    clock = Clock(0)
    fn = cached_state(ttl_ms=TTL, store="rocksdb")(count_sum)  # no cache: state writes reach the table at once
    runner = LocalRunner(fn, key="k", clock=clock)
    runner.process(batch(-1, -2, -3))
    clock.now = 50
    runner.process(batch(*range(3_000)))
    instance = runner.instances[0]
    counts = {name: {"written": 0, "read": 0} for name in ("state", "ttl", "ttl.order")}
    for name, count in counts.items():
        table = instance.tables[name]

        def counted_writes(method, count=count):
            def wrapper(items, **kwargs):
                items = list(items)
                count["written"] += len(items)
                return method(items, **kwargs)
            return wrapper

        def counted_reads(method, count=count):
            def wrapper(*args, **kwargs):
                for item in method(*args, **kwargs):
                    count["read"] += 1
                    yield item
            return wrapper

        for method in ("_write", "write_raw"):
            monkeypatch.setattr(table, method, counted_writes(getattr(table, method)))
        for method in ("_iter_items", "iter_raw", "iter_raw_keys"):
            monkeypatch.setattr(table, method, counted_reads(getattr(table, method)))
    clock.now = TTL
    instance.end_of_batch(TTL, -1)  # the end of the batch at TTL: 3 keys expire
    assert {name: c["written"] for name, c in counts.items()} == {"state": 3, "ttl": 3, "ttl.order": 3}
    assert counts["state"]["read"] == counts["ttl"]["read"] == 0
    assert 3 <= counts["ttl.order"]["read"] <= 6
    assert set(instance.state_items()) == {(k,) for k in range(3_000)}


def test_expiries_survive_a_checkpoint_and_a_restore(tmp_path):
    clock = Clock(0)
    location = tmp_path / "cp"
    fn = cached_state(ttl_ms=TTL)(seen)
    first = LocalRunner(fn, key="k", clock=clock, checkpoint_location=location)
    first.process(batch(1, 2))
    clock.now = 50
    first.process(batch(2))
    first.close()
    restored = LocalRunner(fn, key="k", clock=clock, checkpoint_location=location)
    assert dict(restored.instances[0].ttl.items()) == {1: TTL, 2: 50 + TTL}
    clock.now = TTL
    assert saw(restored.process(batch(1, 2))) == {1: None, 2: 2}


def test_expiries_follow_their_keys_to_another_parallelism(tmp_path):
    clock = Clock(0)
    location = tmp_path / "cp"
    fn = cached_state(ttl_ms=TTL)(count_sum)
    runner = LocalRunner(fn, key="k", clock=clock, checkpoint_location=location)
    runner.process(batch(*range(0, 40)))
    clock.now = 50
    runner.process(batch(*range(20, 60)))  # 0..19 expire at 100, 20..59 at 150
    runner.close()
    rescaled = LocalRunner(fn, key="k", clock=clock, checkpoint_location=location, parallelism=3)
    expiries = {}
    for instance in rescaled.instances:
        assert all(instance.state.get(k) is not None for k, _ in instance.ttl.items())  # each key's expiry is with its state
        expiries.update(instance.ttl.items())
    assert expiries == {**{k: TTL for k in range(20)}, **{k: 50 + TTL for k in range(20, 60)}}
    clock.now = TTL
    rescaled.process(empty())
    assert set(rescaled.state()) == {(k,) for k in range(20, 60)}
    assert sum(i.stats()["expired"] for i in rescaled.instances) == 20


def test_a_restore_without_ttl_ms_keeps_the_state_and_drops_the_expiries(tmp_path):
    clock = Clock(0)
    location = tmp_path / "cp"
    LocalRunner(cached_state(ttl_ms=TTL)(count_sum), key="k", clock=clock, checkpoint_location=location).process(batch(1))
    runner = LocalRunner(count_sum, key="k", clock=clock, checkpoint_location=location)
    clock.now = 10 * TTL
    runner.process(empty())
    assert plain(runner.state()) == {(1,): (1, 1)}
    assert checkpoint_table(location, "ttl") == {}


def test_a_timeout_of_an_expired_key_sees_no_state():
    def timing_out(key, rows, state):
        frames = list(rows)
        if state.hasTimedOut:
            yield pd.DataFrame({"k": [key[0]], "timed_out_with_state": [state.exists]})
            return
        state.update((sum(len(f) for f in frames),))
        state.setTimeoutDuration(TTL)

    clock = Clock(0)
    runner = LocalRunner(cached_state(ttl_ms=TTL)(timing_out), key="k", clock=clock, timeout="processing")
    runner.process(batch(1))
    clock.now = TTL + 1  # the timeout (due at 100) fires in the batch that expires the state
    out = runner.process(empty())
    assert out.to_dict("list") == {"k": [1], "timed_out_with_state": [False]}
    assert runner.state() == {}


def test_an_aggregate_starts_again_from_empty_once_its_accumulator_expired():
    clock = Clock(0)
    runner = LocalRunner(cached_state(ttl_ms=TTL)(aggregate({"n": Count()})), key="k", clock=clock)
    assert runner.process(batch(1, 1)).to_dict("list") == {"k": [1], "n": [2]}
    clock.now = 50
    assert runner.process(batch(1)).to_dict("list") == {"k": [1], "n": [3]}  # updated: expires at 150
    clock.now = 50 + TTL
    assert runner.process(batch(1)).to_dict("list") == {"k": [1], "n": [1]}


@pytest.mark.parametrize("bad", [0, -5, 2.5, "100", True])
def test_cached_state_refuses_a_ttl_that_is_not_a_positive_int_naming_it(bad):
    with pytest.raises(ValueError, match=rf"cached_state\(ttl_ms=\.\.\.\) must be a positive int .*got {bad!r}"):
        cached_state(ttl_ms=bad)


def test_a_working_store_adopted_after_a_restore_without_ttl_ms_keeps_checkpointing_its_ttl_table(tmp_path):
    """run_stream's executor placement hands suspended working stores to other processes: the adopter must
    write every table of the version it continues, the ttl table a restore brought in too."""
    from buffering import OperatorInstance

    clock = Clock(0)
    location = tmp_path / "cp"
    LocalRunner(cached_state(ttl_ms=TTL)(count_sum), key="k", clock=clock, checkpoint_location=location).process(batch(1))
    fn = cached_state(store="rocksdb", path=str(tmp_path / "work"))(count_sum)
    runner = LocalRunner(fn, key="k", clock=clock, checkpoint_location=location)
    held = runner.instances[0]
    held.suspend()
    held.release_workdir()
    adopter = OperatorInstance.for_runner(runner, 0, storage=runner.storage, manager=None, workdir=held.workdir, fresh=False)
    adopter.adopt()
    adopter.process(batch(2), 10, -1)
    adopter.end_of_batch(10, -1)
    report = adopter.checkpoint(runner.version + 1, runner._manifest)  # refused when a table of the version is missing
    assert report.bytes > 0
    assert plain(adopter.state_items()) == {(1,): (1, 1), (2,): (1, 1)}


def test_expiries_survive_suspending_and_resuming_the_working_store(tmp_path):
    clock = Clock(0)
    runner = LocalRunner(cached_state(ttl_ms=TTL, store="rocksdb")(seen), key="k", clock=clock, checkpoint_location=tmp_path / "cp")
    runner.process(batch(1))
    instance = runner.instances[0]
    instance.suspend()  # what run_stream's executor placement does between batches
    instance.resume()
    assert dict(instance.ttl.items()) == {1: TTL}
    clock.now = TTL
    assert saw(runner.process(batch(1))) == {1: None}


def test_cached_state_refuses_ttl_ms_for_a_processor_whose_variables_carry_their_own():
    from pyspark.sql.streaming import StatefulProcessor

    class Counting(StatefulProcessor):
        def init(self, handle):
            self.count = handle.getValueState("count", "count long", ttlDurationMs=TTL)

        def handleInputRows(self, key, rows, timerValues):
            yield from ()

    with pytest.raises(ValueError, match=r"cached_state\(ttl_ms=100\) .* processor Counting sets a TTL per state variable"):
        cached_state(ttl_ms=TTL)(Counting())
