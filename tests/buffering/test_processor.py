"""transformWithStateInPandas processors under LocalRunner: state variables, timers, TTL, initial state, checkpoints."""

from __future__ import annotations

from typing import Any, Iterator

import pandas as pd
import pytest
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.streaming.stateful_processor import ListState, MapState, ValueState

from buffering import LocalRunner, cached_state
from buffering.operator import OperatorInstance
from buffering.processor import LIST_CHUNK

from .helpers import Clock


class RunningCount(StatefulProcessor):
    """A ValueState count, a ListState of the last 3 values and a MapState of counts per value."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "count long")
        self.last = handle.getListState("last", "v long")
        self.per_value = handle.getMapState("per_value", "v long", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        n = self.count.get()[0] if self.count.exists() else 0
        for pdf in rows:
            n += len(pdf)
            for v in pdf["v"].tolist():
                self.last.appendValue((v,))
                old = self.per_value.getValue((v,))
                self.per_value.updateValue((v,), ((old[0] if old else 0) + 1,))
        self.count.update((n,))
        self.last.put(list(self.last.get())[-3:])
        yield pd.DataFrame({"id": [int(key[0])], "count": [n]})


def batch(ids: list[int], values: list[int] | None = None) -> pd.DataFrame:
    return pd.DataFrame({"id": ids, "v": values if values is not None else list(range(len(ids)))})


def state_of(runner: LocalRunner, name: str, key: Any) -> Any:
    """What the processor's variable ``name`` holds for ``key``, read through the owning instance's handle."""
    for instance in runner.instances:
        runtime = instance.processor
        if instance.key_groups.start <= runtime_key_group(runner, key) < instance.key_groups.stop:
            runtime.set_key(key)
            variable = runtime.variables[name]
            if isinstance(variable, ValueState):
                return variable.get()
            if isinstance(variable, ListState):
                return list(variable.get())
            return dict(variable.iterator())
    raise AssertionError(f"no instance owns {key!r}")


def runtime_key_group(runner: LocalRunner, key: Any) -> int:
    from state.keygroups import key_group_from_hash
    from state.keys import normalize_key, spark_hash

    return key_group_from_hash(spark_hash(normalize_key(key), runner.key_types), runner.max_parallelism)


# ------------------------------------------------------------------ state variables


def test_a_value_state_counts_across_batches():
    runner = LocalRunner(RunningCount(), key="id")
    runner.process(batch([1, 1, 2]))
    out = runner.process(batch([1, 3]))
    assert sorted(out.itertuples(index=False, name=None)) == [(1, 3), (3, 1)]
    assert state_of(runner, "count", 2) == (1,)


def test_list_and_map_state_hold_what_the_processor_wrote():
    runner = LocalRunner(RunningCount(), key="id")
    runner.process(batch([1, 1, 1, 1], [5, 6, 5, 7]))
    assert state_of(runner, "last", 1) == [(6,), (5,), (7,)]
    assert state_of(runner, "per_value", 1) == {(5,): (2,), (6,): (1,), (7,): (1,)}


def test_the_handles_state_objects_are_pysparks_state_classes():
    runner = LocalRunner(RunningCount(), key="id")
    runner.process(batch([1]))
    variables = runner.instances[0].processor.variables
    assert isinstance(variables["count"], ValueState)
    assert isinstance(variables["last"], ListState)
    assert isinstance(variables["per_value"], MapState)


class Appender(StatefulProcessor):
    def init(self, handle: Any) -> None:
        self.items = handle.getListState("items", "v long")
        self.entries = handle.getMapState("entries", "k long", "v long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        for pdf in rows:
            for v in pdf["v"].tolist():
                self.items.appendValue((v,))
                self.entries.updateValue((v,), (v,))
        return iter([])


def changed_entries(instance: OperatorInstance, table: str) -> int:
    for cache in instance.caches:
        cache.flush()
    return len(instance.tables[table].drain_changes())


def test_a_list_append_rewrites_only_the_last_chunk_and_the_count():
    instance = OperatorInstance(
        OperatorInstance_spec(Appender()), key_columns=["id"], key_types=("long",), index=0, parallelism=1, max_parallelism=16
    )
    instance.process(batch([1] * 1000, list(range(1000))), 0, -1)
    instance.end_of_batch(0, -1)
    changed_entries(instance, "tws.list.items")
    changed_entries(instance, "tws.list-chunks.items")
    instance.process(batch([1], [1000]), 0, -1)
    instance.end_of_batch(0, -1)
    assert changed_entries(instance, "tws.list.items") == 1  # the head: its count
    assert changed_entries(instance, "tws.list-chunks.items") == 1  # the last chunk
    instance.processor.set_key(1)
    assert len(list(instance.processor.variables["items"].get())) == 1001
    assert 1000 // LIST_CHUNK > 1
    instance.close()


def test_a_map_entry_update_writes_that_entry_only():
    instance = OperatorInstance(
        OperatorInstance_spec(Appender()), key_columns=["id"], key_types=("long",), index=0, parallelism=1, max_parallelism=16
    )
    instance.process(batch([1] * 5000, list(range(5000))), 0, -1)
    instance.end_of_batch(0, -1)
    changed_entries(instance, "tws.map.entries")
    instance.process(batch([1], [7]), 0, -1)
    instance.end_of_batch(0, -1)
    assert changed_entries(instance, "tws.map.entries") == 1
    instance.close()


def OperatorInstance_spec(processor: StatefulProcessor) -> Any:
    from buffering.decorators import spec_of

    return spec_of(processor)


class LateVariable(StatefulProcessor):
    def init(self, handle: Any) -> None:
        self.handle = handle

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        self.handle.getValueState("late", "v long")
        return iter([])


def test_a_state_variable_created_outside_init_is_refused_naming_it():
    runner = LocalRunner(LateVariable(), key="id")
    with pytest.raises(RuntimeError, match="'late'.*created in the processor's init"):
        runner.process(batch([1]))


# ------------------------------------------------------------------ timers


class Reminder(StatefulProcessor):
    """Registers a timer ``delay`` ms after each batch's time; emits -1 rows when one fires."""

    def __init__(self, delay: int = 100, event_time: bool = False) -> None:
        self.delay = delay
        self.event_time = event_time

    def init(self, handle: Any) -> None:
        self.handle = handle

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        if self.event_time:
            latest = max(int(pdf["ts"].max()) for pdf in rows)
            self.handle.registerTimer(latest + self.delay)
        else:
            for _ in rows:
                pass
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + self.delay)
        yield pd.DataFrame({"id": [int(key[0])], "fired": [0], "timers": [str(list(self.handle.listTimers()))]})

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        yield pd.DataFrame({"id": [int(key[0])], "fired": [expiredTimerInfo.getExpiryTimeInMs()], "timers": [""]})


def fired(out: pd.DataFrame) -> list[tuple[int, int]]:
    return sorted((int(r.id), int(r.fired)) for r in out.itertuples() if r.fired)


def test_processing_time_timers_fire_once_when_their_time_passes():
    clock = Clock(1000)
    runner = LocalRunner(Reminder(100), key="id", time_mode="ProcessingTime", clock=clock)
    runner.process(batch([1, 2]))
    clock.now = 1099
    assert fired(runner.advance_time(0)) == []
    clock.now = 1100
    assert fired(runner.advance_time(0)) == [(1, 1100), (2, 1100)]
    clock.now = 5000
    assert fired(runner.advance_time(0)) == []  # deleted once fired


def test_a_key_may_hold_several_timers_and_list_them():
    clock = Clock(0)
    runner = LocalRunner(Reminder(100), key="id", time_mode="ProcessingTime", clock=clock)
    runner.process(batch([1]))
    clock.now = 50
    out = runner.process(batch([1]))
    assert out["timers"].tolist() == ["[100, 150]"]


def test_event_time_timers_fire_when_the_watermark_passes_them():
    runner = LocalRunner(
        Reminder(100, event_time=True), key="id", time_mode="EventTime", event_time="ts", watermark_delay_ms=0, clock=Clock()
    )
    runner.process(pd.DataFrame({"id": [1], "ts": [1000]}))  # timer at 1100
    assert fired(runner.process(pd.DataFrame({"id": [2], "ts": [1050]}))) == []  # watermark 1000
    out = runner.process(pd.DataFrame({"id": [2], "ts": [1200]}))  # watermark 1050
    assert fired(out) == []
    out = runner.process(pd.DataFrame({"id": [3], "ts": [1300]}))  # watermark 1200
    assert fired(out) == [(1, 1100), (2, 1150)]  # key 2 registered 1050 + 100


def test_a_processor_takes_time_mode_not_timeout():
    with pytest.raises(TypeError, match="time_mode=, not timeout='processing'"):
        LocalRunner(Reminder(), key="id", timeout="processing")


def test_an_unknown_time_mode_is_refused_naming_it():
    with pytest.raises(ValueError, match="time_mode must be .* got 'Sometimes'"):
        LocalRunner(Reminder(), key="id", time_mode="Sometimes")


# ------------------------------------------------------------------ TTL


class Expiring(StatefulProcessor):
    def init(self, handle: Any) -> None:
        self.value = handle.getValueState("value", "v long", ttlDurationMs=1000)
        self.items = handle.getListState("items", "v long", ttlDurationMs=1000)
        self.entries = handle.getMapState("entries", "k long", "v long", ttlDurationMs=1000)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        values = [v for pdf in rows for v in pdf["v"].tolist()]
        seen = (self.value.get(), list(self.items.get()), dict(self.entries.iterator()))
        for v in values:
            if v >= 0:
                self.value.update((v,))
                self.items.appendValue((v,))
                self.entries.updateValue((v,), (v,))
        yield pd.DataFrame({"id": [int(key[0])], "seen": [repr(seen)]})


def test_ttl_state_is_invisible_once_its_time_passed_and_each_element_expires_on_its_own():
    clock = Clock(0)
    runner = LocalRunner(Expiring(), key="id", clock=clock)
    runner.process(batch([1], [5]))  # expires at 1000
    clock.now = 600
    runner.process(batch([1], [6]))  # value/entry 6 expire at 1600; list element 5 still at 1000
    clock.now = 1000
    out = runner.process(batch([1], [-1]))
    assert out["seen"].tolist() == [repr(((6,), [(6,)], {(6,): (6,)}))]
    clock.now = 1600
    out = runner.process(batch([1], [-1]))
    assert out["seen"].tolist() == [repr((None, [], {}))]


def test_the_ttl_sweep_deletes_only_what_expired():
    clock = Clock(0)
    runner = LocalRunner(Expiring(), key="id", clock=clock)
    runner.process(batch([1], [5]))
    clock.now = 600
    runner.process(batch([2], [6]))
    clock.now = 1000
    runner.advance_time(0)
    runtime = runner.instances[0].processor
    expiry = runtime.variables["value"].expiry
    assert expiry.due(10**12) == [2]  # key 1 was swept, key 2 expires at 1600
    assert state_of(runner, "value", 2) == (6,)


def test_ttl_expiry_survives_a_restore_at_another_parallelism(tmp_path):
    clock = Clock(0)
    runner = LocalRunner(Expiring(), key="id", clock=clock, checkpoint_location=str(tmp_path))
    runner.process(batch([1, 2, 3], [5, 5, 5]))
    runner.close()
    clock.now = 1000
    restored = LocalRunner(Expiring(), key="id", clock=clock, checkpoint_location=str(tmp_path), parallelism=3)
    out = restored.process(batch([1, 2, 3], [-1, -1, -1]))
    assert set(out["seen"]) == {repr((None, [], {}))}


# ------------------------------------------------------------------ initial state, checkpoints, failures


class Seeded(RunningCount):
    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        self.count.update((int(initialState["count"].sum()),))


def test_initial_state_seeds_the_keys_before_the_first_batch_only(tmp_path):
    initial = pd.DataFrame({"id": [1, 9], "count": [100, 50]})
    runner = LocalRunner(Seeded(), key="id", initial_state=initial, checkpoint_location=str(tmp_path))
    out = runner.process(batch([1, 2]))
    assert sorted(out.itertuples(index=False, name=None)) == [(1, 101), (2, 1)]
    assert state_of(runner, "count", 9) == (50,)
    runner.close()
    again = LocalRunner(Seeded(), key="id", initial_state=initial, checkpoint_location=str(tmp_path))
    out = again.process(batch([1]))
    assert out.itertuples(index=False, name=None).__next__() == (1, 102)


@pytest.mark.parametrize("parallelism", [1, 3])
def test_every_variable_and_timer_comes_back_from_a_checkpoint_at_any_parallelism(tmp_path, parallelism):
    clock = Clock(0)
    runner = LocalRunner(RunningCount(), key="id", checkpoint_location=str(tmp_path), clock=clock)
    runner.process(batch([1, 1, 2, 3, 4], [5, 6, 7, 8, 9]))
    runner.close()
    restored = LocalRunner(RunningCount(), key="id", checkpoint_location=str(tmp_path), parallelism=parallelism, clock=clock)
    out = restored.process(batch([1, 2, 3, 4], [5, 5, 5, 5]))
    assert sorted(out.itertuples(index=False, name=None)) == [(1, 3), (2, 2), (3, 2), (4, 2)]
    assert state_of(restored, "per_value", 1) == {(5,): (2,), (6,): (1,)}
    assert state_of(restored, "last", 2) == [(7,), (5,)]


def test_timers_come_back_from_a_checkpoint(tmp_path):
    clock = Clock(0)
    runner = LocalRunner(Reminder(100), key="id", time_mode="ProcessingTime", checkpoint_location=str(tmp_path), clock=clock)
    runner.process(batch([1, 2]))
    runner.close()
    clock.now = 100
    restored = LocalRunner(Reminder(100), key="id", time_mode="ProcessingTime", checkpoint_location=str(tmp_path), clock=clock, parallelism=2)
    assert fired(restored.advance_time(0)) == [(1, 100), (2, 100)]


class FailsOnce(RunningCount):
    fail = False

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        out = list(super().handleInputRows(key, rows, timerValues))
        if int(key[0]) == 2 and FailsOnce.fail:
            FailsOnce.fail = False
            raise RuntimeError("boom")
        return iter(out)


def test_a_failed_batch_leaves_every_variable_at_the_last_version_so_a_retry_counts_once():
    runner = LocalRunner(FailsOnce(), key="id")
    runner.process(batch([1, 2]))
    FailsOnce.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        runner.process(batch([1, 2], [7, 7]))
    out = runner.process(batch([1, 2], [7, 7]))
    assert sorted(out.itertuples(index=False, name=None)) == [(1, 2), (2, 2)]
    assert state_of(runner, "per_value", 1) == {(0,): (1,), (7,): (1,)}


def test_cache_bounds_apply_to_each_variables_table():
    runner = LocalRunner(cached_state(max_entries=10)(RunningCount()), key="id")
    runner.process(batch(list(range(100))))
    caches = runner.stats()["instances"][0]["caches"]
    assert set(caches) == {
        "tws.value.count[0/1]", "tws.list.last[0/1]", "tws.list-chunks.last[0/1]", "tws.map.per_value[0/1]"
    }
    assert all(c["entries"] <= 10 for c in caches.values())
    assert state_of(runner, "count", 42) == (1,)


class Purger(StatefulProcessor):
    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        values = [v for pdf in rows for v in pdf["v"].tolist()]
        if -1 in values:
            self.handle.deleteIfExists("count")
        else:
            n = self.count.get()[0] if self.count.exists() else 0
            self.count.update((n + len(values),))
        return iter([])


def test_delete_if_exists_purges_the_variable_for_every_key():
    runner = LocalRunner(Purger(), key="id")
    runner.process(batch([1, 2, 3]))
    runner.process(batch([1], [-1]))
    assert [state_of(runner, "count", k) for k in (1, 2, 3)] == [None, None, None]


class LateRows(StatefulProcessor):
    def init(self, handle: Any) -> None:
        self.handle = handle

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        yield pd.DataFrame({"id": [int(key[0])], "ts": [int(max(pdf["ts"].max() for pdf in rows))]})


def test_in_event_time_rows_are_late_by_the_previous_batchs_watermark_as_in_spark():
    runner = LocalRunner(LateRows(), key="id", time_mode="EventTime", event_time="ts", clock=Clock())
    runner.process(pd.DataFrame({"id": [1], "ts": [10_000]}))  # ran with watermark 0
    out = runner.process(pd.DataFrame({"id": [2, 3], "ts": [4_000, 0]}))  # watermark 10 s; late rows: by 0
    assert sorted(out.itertuples(index=False, name=None)) == [(2, 4_000)]
    out = runner.process(pd.DataFrame({"id": [4, 5], "ts": [9_000, 10_001]}))  # late rows: by 10 s
    assert sorted(out.itertuples(index=False, name=None)) == [(5, 10_001)]


class Snooze(StatefulProcessor):
    """Registers a timer at 100; a row with v == -1 deletes it again."""

    closed = 0

    def init(self, handle: Any) -> None:
        self.handle = handle

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        values = [v for pdf in rows for v in pdf["v"].tolist()]
        if -1 in values:
            self.handle.deleteTimer(100)
        else:
            self.handle.registerTimer(100)
        return iter([])

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        yield pd.DataFrame({"id": [int(key[0])], "fired": [expiredTimerInfo.getExpiryTimeInMs()], "timers": [""]})

    def close(self) -> None:
        Snooze.closed += 1


def test_a_deleted_timer_never_fires():
    clock = Clock(0)
    runner = LocalRunner(Snooze(), key="id", time_mode="ProcessingTime", clock=clock)
    runner.process(batch([1, 2]))
    runner.process(batch([2], [-1]))
    clock.now = 100
    assert fired(runner.advance_time(0)) == [(1, 100)]


def test_closing_the_runner_closes_each_instances_processor():
    Snooze.closed = 0
    runner = LocalRunner(Snooze(), key="id", parallelism=2)
    runner.process(batch([1, 2, 3]))
    runner.close()
    assert Snooze.closed == 2


class SeedFailsOnce(Seeded):
    fail = False

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        super().handleInitialState(key, initialState, timerValues)
        if int(key[0]) == 9 and SeedFailsOnce.fail:
            SeedFailsOnce.fail = False
            raise RuntimeError("seed boom")


def test_a_failed_initial_state_leaves_nothing_applied_so_the_retry_seeds_each_key_once():
    initial = pd.DataFrame({"id": [1, 9], "count": [100, 50]})
    runner = LocalRunner(SeedFailsOnce(), key="id", initial_state=initial)
    SeedFailsOnce.fail = True
    with pytest.raises(RuntimeError, match="seed boom"):
        runner.process(batch([1]))
    out = runner.process(batch([1]))
    assert out.itertuples(index=False, name=None).__next__() == (1, 101)
    assert state_of(runner, "count", 9) == (50,)


class TimerFailsOnce(Reminder):
    fail = False

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        if int(key[0]) == 2 and TimerFailsOnce.fail:
            TimerFailsOnce.fail = False
            raise RuntimeError("timer boom")
        return super().handleExpiredTimer(key, timerValues, expiredTimerInfo)


def test_a_failed_timer_call_leaves_every_timer_set_so_the_retry_fires_each_once():
    clock = Clock(0)
    runner = LocalRunner(TimerFailsOnce(100), key="id", time_mode="ProcessingTime", clock=clock)
    runner.process(batch([1, 2]))
    clock.now = 100
    TimerFailsOnce.fail = True
    with pytest.raises(RuntimeError, match="timer boom"):
        runner.advance_time(0)
    assert fired(runner.advance_time(0)) == [(1, 100), (2, 100)]
    assert fired(runner.advance_time(0)) == []


class DeletesInInit(StatefulProcessor):
    """Creates a ValueState and deletes it in init (as PySpark's own SimpleStatefulProcessor does)."""

    def init(self, handle: Any) -> None:
        self.temp = handle.getValueState("temp", "value int")
        handle.deleteIfExists("temp")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        from pyspark.errors import PySparkRuntimeError

        try:
            self.temp.exists()
            error = ""
        except PySparkRuntimeError as exc:
            error = str(exc)
        yield pd.DataFrame({"id": [int(key[0])], "error": [error]})


def test_a_variable_deleted_in_init_fails_with_sparks_error():
    out = LocalRunner(DeletesInInit(), key="id").process(batch([1]))
    assert out["error"].iloc[0].startswith("Error checking value state exists")
