"""cached_state(layout="key_group"): one block per key group, in the cache and in RocksDB.

The layout changes how the state is kept, never what it is: outputs, the state
and every checkpoint's content equal the per-key layout's, across evictions,
restarts at other parallelisms, failed batches, and restarts that change the
layout of an existing checkpoint.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from buffering import ApproxDistinct, Count, LocalRunner, Max, Mean, Min, Sum, aggregate, cached_state, mini_batch
from buffering.operator import OperatorInstance
from buffering.windows import Hopping, Session, Tumbling
from state.blocks import KeyGroupCache, is_block_key

from .helpers import Clock, checkpoint_table, split_blocks_failing_once, with_batch

AGGS = {"n": Count(), "s": Sum("v"), "lo": Min("v"), "hi": Max("v"), "avg": Mean("v"), "users": ApproxDistinct("u")}


def batches(seed: int = 3, n: int = 9, timed: bool = False) -> list[pd.DataFrame]:
    """Random rows of 60 keys; ``timed``: 50 rows or more a batch, with event times (``ts``, ms) moving
    forward about 40 s a batch, some late."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        rows = int(rng.integers(50 if timed else 0, 300))
        frame = pd.DataFrame({
            "k": rng.integers(0, 60, rows).astype(np.int64),
            "u": rng.integers(0, 500, rows).astype(np.int64),
            "v": rng.integers(-50, 100, rows).astype(np.int64),
        })
        if timed:
            frame["ts"] = (i * 40_000 + rng.integers(-70_000, 40_000, rows)).clip(0).astype(np.int64)
        out.append(frame)
    return out


def operator(layout: str, max_entries: int = 1_000, window=None, emit: str = "watermark"):
    aggregation = aggregate(AGGS) if window is None else aggregate(AGGS, window=window, emit=emit)
    return cached_state(max_entries=max_entries, store="rocksdb", layout=layout)(aggregation)


def runner_of(op, location, parallelism: int = 1) -> LocalRunner:
    """A runner of ``op``; a windowed one reads event times from ``ts`` with a 20 s watermark delay."""
    timed = {"event_time": "ts", "watermark_delay_ms": 20_000} if op.__opbuffer__.window is not None else {}
    return LocalRunner(op, key="k", parallelism=parallelism, clock=Clock(), checkpoint_location=location, **timed)


def run(layout: str, location, frames, schedule=(1,), max_entries: int = 1_000, window=None, emit="watermark") -> list[pd.DataFrame]:
    """Process ``frames`` split evenly over restarts at the parallelisms of ``schedule``."""
    outputs = []
    per_run = -(-len(frames) // len(schedule))
    for run_index, parallelism in enumerate(schedule):
        runner = runner_of(operator(layout, max_entries, window, emit), location, parallelism)
        outputs += [runner.process(f) for f in frames[run_index * per_run : (run_index + 1) * per_run]]
        runner.close()
    return outputs


@pytest.mark.parametrize("parallelism", [1, 3])
def test_outputs_and_checkpoints_equal_the_per_key_layouts(tmp_path, parallelism):
    frames = batches()
    expected = run("key", tmp_path / "key", frames, (parallelism,))
    got = run("key_group", tmp_path / "key_group", frames, (parallelism,))
    pd.testing.assert_frame_equal(with_batch(got), with_batch(expected))
    assert checkpoint_table(tmp_path / "key_group") == checkpoint_table(tmp_path / "key")


def test_evicting_key_groups_loses_nothing(tmp_path):
    frames = batches(4)
    expected = run("key", tmp_path / "key", frames)
    got = run("key_group", tmp_path / "key_group", frames, max_entries=5)  # far fewer than the 60 keys
    pd.testing.assert_frame_equal(with_batch(got), with_batch(expected))
    assert checkpoint_table(tmp_path / "key_group") == checkpoint_table(tmp_path / "key")


def test_restarts_at_other_parallelisms_continue_the_state(tmp_path):
    frames = batches(5)
    expected = run("key", tmp_path / "key", frames)
    got = run("key_group", tmp_path / "key_group", frames, schedule=(1, 3, 8, 2))
    pd.testing.assert_frame_equal(with_batch(got), with_batch(expected))
    assert checkpoint_table(tmp_path / "key_group") == checkpoint_table(tmp_path / "key")


@pytest.mark.parametrize("first, second", [("key", "key_group"), ("key_group", "key")])
def test_a_restart_with_the_other_layout_converts_the_checkpoint(tmp_path, first, second):
    frames = batches(6)
    expected = run("key", tmp_path / "key", frames)
    location = tmp_path / "switched"
    outputs = run(first, location, frames[:4], (2,))
    outputs += run(second, location, frames[4:], (3,))
    pd.testing.assert_frame_equal(with_batch(outputs), with_batch(expected))
    assert checkpoint_table(location) == checkpoint_table(tmp_path / "key")


def test_the_working_store_holds_block_records_per_key_group(tmp_path):
    runner = LocalRunner(operator("key_group"), key="k", clock=Clock(), checkpoint_location=tmp_path / "ck")
    frames = batches(7, n=3)
    for frame in frames:
        runner.process(frame)
    instance = runner.instances[0]
    assert isinstance(instance.cache, KeyGroupCache)
    raw = instance.tables["state"]
    keys = [raw_key for raw_key, _ in raw.iter_raw()]
    groups = {raw.key_group(int(k)) for k in pd.concat(frames)["k"].unique()}
    assert keys and all(is_block_key(k) for k in keys)
    assert {int.from_bytes(k[:2], "big") for k in keys} == groups
    assert len(keys) == len(groups)  # small blocks: one record each
    runner.close()


def test_a_failed_write_back_fails_the_batch_and_its_retry_counts_each_row_once(tmp_path, monkeypatch):
    frames = batches(8, n=4)
    expected = run("key", tmp_path / "key", frames)
    runner = LocalRunner(operator("key_group"), key="k", clock=Clock(), checkpoint_location=tmp_path / "ck")
    outputs = [runner.process(f) for f in frames[:2]]
    flush = KeyGroupCache.flush
    calls = []

    def fails_once(self, durable=False):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("disk full")
        return flush(self, durable)

    monkeypatch.setattr(KeyGroupCache, "flush", fails_once)
    with pytest.raises(OSError, match="disk full"):
        runner.process(frames[2])
    outputs += [runner.process(f) for f in frames[2:]]
    pd.testing.assert_frame_equal(with_batch(outputs), with_batch(expected))
    runner.close()
    assert checkpoint_table(tmp_path / "ck") == checkpoint_table(tmp_path / "key")


def test_the_state_reads_back_per_key(tmp_path):
    frames = batches(9, n=3)
    runner = LocalRunner(operator("key_group"), key="k", clock=Clock())
    reference = LocalRunner(operator("key"), key="k", clock=Clock())
    for frame in frames:
        runner.process(frame)
        reference.process(frame)
    key = int(frames[0]["k"].iloc[0])
    assert runner.get_state(key)["n"] == reference.get_state(key)["n"] > 0
    assert bytes(runner.get_state(key)) == bytes(reference.get_state(key))  # the same packed accumulator
    assert {k: bytes(v) for k, v in runner.state().items()} == {k: bytes(v) for k, v in reference.state().items()}
    runner.close()
    reference.close()


def test_a_policy_other_than_lru_is_refused_naming_it():
    with pytest.raises(ValueError, match="policy='lfu'"):
        cached_state(max_entries=10, policy="lfu", store="rocksdb", layout="key_group")


def _sparse_batches(seed: int, n: int) -> list[pd.DataFrame]:
    """Rows of 5 to 15 of 60 keys a batch: a key often waits several batches for its next row."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        keys = rng.choice(60, int(rng.integers(5, 16)), replace=False)
        rows = rng.choice(keys, int(rng.integers(10, 40)))
        out.append(pd.DataFrame({"k": rows.astype(np.int64), "u": rng.integers(0, 500, len(rows)).astype(np.int64),
                                 "v": rng.integers(-50, 100, len(rows)).astype(np.int64)}))
    return out


def _run_expiring(layout: str, location, frames, schedule, max_entries: int = 1_000) -> tuple[list[pd.DataFrame], int]:
    """Outputs of ``frames`` through aggregate(AGGS) with ``ttl_ms=25``, the clock 10 ms further each batch,
    split over restarts at the parallelisms of ``schedule``; and how many keys expired."""
    clock = Clock(0)
    outputs, expired = [], 0
    per_run = -(-len(frames) // len(schedule))
    for run_index, parallelism in enumerate(schedule):
        op = cached_state(max_entries=max_entries, store="rocksdb", layout=layout, ttl_ms=25)(aggregate(AGGS))
        runner = LocalRunner(op, key="k", parallelism=parallelism, clock=clock, checkpoint_location=location)
        for frame in frames[run_index * per_run : (run_index + 1) * per_run]:
            clock.now += 10
            outputs.append(runner.process(frame))
        expired += sum(instance.stats()["expired"] for instance in runner.instances)
        runner.close()
    return outputs, expired


@pytest.mark.parametrize("max_entries", [1_000, 5], ids=["all-held", "evicting"])
def test_expiring_accumulators_equal_the_per_key_layouts_through_restarts_at_other_parallelisms(tmp_path, max_entries):
    """ttl_ms: a key not updated for 25 ms starts again from empty and is swept at a batch's end, as with
    the per-key layout; the expiries move with their keys to other parallelisms."""
    frames = _sparse_batches(7, 16)
    expected, expected_expired = _run_expiring("key", tmp_path / "key", frames, (1, 3, 2))
    got, expired = _run_expiring("key_group", tmp_path / "key_group", frames, (1, 3, 2), max_entries)
    assert expired == expected_expired > 0
    pd.testing.assert_frame_equal(with_batch(got), with_batch(expected))
    assert checkpoint_table(tmp_path / "key_group") == checkpoint_table(tmp_path / "key")
    assert checkpoint_table(tmp_path / "key_group", "ttl") == checkpoint_table(tmp_path / "key", "ttl") != {}


def test_a_batch_failing_after_it_deleted_expired_accumulators_is_retried_with_them_expired_once(tmp_path, monkeypatch):
    """The deletes of expired accumulators happen in the cache before the merge: a batch that fails after
    them and its merge is rolled back and retried, and the outputs and checkpoints equal an unfailed run's."""
    from buffering.aggregations.columnar import ColumnarLayout

    frames = _sparse_batches(9, 12)
    expected, _ = _run_expiring("key", tmp_path / "key", frames, (2,))
    op = cached_state(store="rocksdb", layout="key_group", ttl_ms=25)(aggregate(AGGS))
    clock = Clock(0)
    runner = LocalRunner(op, key="k", parallelism=2, clock=clock, checkpoint_location=tmp_path / "ck")
    delete_many, merge_into = KeyGroupCache.delete_many, ColumnarLayout.merge_into
    deleted: list[int] = []  # keys deleted in the batch so far (a merge comes before the batch's sweep)
    failed: list[int] = []

    def counted_delete(self, keys):
        keys = list(keys)
        deleted.append(len(keys))
        return delete_many(self, keys)

    def failing_merge(self, cache, keys, incoming):
        merged = merge_into(self, cache, keys, incoming)
        if deleted and not failed:  # the expired accumulators deleted and the merge done: then the failure
            failed.append(sum(deleted))
            raise OSError("disk full")
        return merged

    monkeypatch.setattr(KeyGroupCache, "delete_many", counted_delete)
    monkeypatch.setattr(ColumnarLayout, "merge_into", failing_merge)
    outputs = []
    for frame in frames:
        clock.now += 10
        deleted.clear()
        try:
            outputs.append(runner.process(frame))
        except OSError:
            outputs.append(runner.process(frame))  # the retry: nothing of the failed attempt applied
    runner.close()
    assert failed and failed[0] > 0  # a batch deleted expired accumulators, then failed
    pd.testing.assert_frame_equal(with_batch(outputs), with_batch(expected))
    assert checkpoint_table(tmp_path / "ck") == checkpoint_table(tmp_path / "key")
    assert checkpoint_table(tmp_path / "ck", "ttl") == checkpoint_table(tmp_path / "key", "ttl")


def test_an_expired_accumulator_merges_from_empty_in_the_batch_that_finds_it_expired():
    op = cached_state(store="rocksdb", layout="key_group", ttl_ms=100)(aggregate({"n": Count()}))
    clock = Clock(0)
    runner = LocalRunner(op, key="k", clock=clock)
    one = pd.DataFrame({"k": [1, 1]})
    assert runner.process(one).to_dict("list") == {"k": [1], "n": [2]}
    clock.now = 50
    assert runner.process(one).to_dict("list") == {"k": [1], "n": [4]}  # updated: expires at 150
    clock.now = 150
    assert runner.process(one).to_dict("list") == {"k": [1], "n": [2]}
    assert runner.instances[0].stats()["expired"] == 0  # merged again before the sweep could take it
    runner.close()


def _run_with(location, frames, layout: str, parallelism: int = 3, memory_budget=None, **state) -> tuple[list, list]:
    """Outputs of ``frames`` through aggregate(AGGS) with ``cached_state(**state)``, and each instance's cache stats."""
    op = cached_state(store="rocksdb", layout=layout, **state)(aggregate(AGGS))
    runner = LocalRunner(op, key="k", parallelism=parallelism, clock=Clock(), checkpoint_location=location,
                         memory_budget=memory_budget)
    outputs = [runner.process(f) for f in frames]
    stats = [instance.cache.stats() for instance in runner.instances]
    runner.close()
    return outputs, stats


def test_watermarks_sync_key_groups_and_change_nothing_of_the_outputs_or_checkpoints(tmp_path):
    frames = batches(12)
    bounds = {"max_entries": 40, "low_watermark": 0.2, "high_watermark": 0.5}
    expected, _ = _run_with(tmp_path / "key", frames, "key", **bounds)
    got, stats = _run_with(tmp_path / "key_group", frames, "key_group", **bounds)
    assert sum(s["syncs"] for s in stats) > 0
    pd.testing.assert_frame_equal(with_batch(got), with_batch(expected))
    assert checkpoint_table(tmp_path / "key_group") == checkpoint_table(tmp_path / "key")


def test_a_batch_failing_after_its_syncs_wrote_to_the_store_is_retried_counting_each_row_once(tmp_path, monkeypatch):
    from checkpoint.writer import CheckpointWriter

    frames = batches(14, 6)
    bounds = {"max_entries": 40, "low_watermark": 0.2, "high_watermark": 0.5}
    expected, _ = _run_with(tmp_path / "key", frames, "key", parallelism=2, **bounds)
    op = cached_state(store="rocksdb", layout="key_group", **bounds)(aggregate(AGGS))
    runner = LocalRunner(op, key="k", parallelism=2, clock=Clock(), checkpoint_location=tmp_path / "ck")
    outputs = [runner.process(f) for f in frames[:3]]
    write, sync = CheckpointWriter.write, KeyGroupCache._sync_dirty
    synced = []

    def counted(self):
        before = self.stats()["syncs"]
        sync(self)
        synced.append(self.stats()["syncs"] - before)

    monkeypatch.setattr(KeyGroupCache, "_sync_dirty", counted)
    monkeypatch.setattr(CheckpointWriter, "write", lambda self, *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        runner.process(frames[3])
    assert sum(synced) > 0  # the failed batch's merges reached RocksDB before it failed
    monkeypatch.setattr(CheckpointWriter, "write", write)
    outputs += [runner.process(f) for f in frames[3:]]
    runner.close()
    pd.testing.assert_frame_equal(with_batch(outputs), with_batch(expected))
    assert checkpoint_table(tmp_path / "ck") == checkpoint_table(tmp_path / "key")


def test_the_instances_share_a_runners_memory_budget(tmp_path):
    frames = batches(13)
    budget = 1 << 20
    expected, _ = _run_with(tmp_path / "key", frames, "key", memory_budget=budget)
    got, stats = _run_with(tmp_path / "key_group", frames, "key_group", memory_budget=budget)
    granted = [s["granted_bytes"] for s in stats]
    assert all(g is not None and g > 0 for g in granted) and sum(granted) <= budget
    pd.testing.assert_frame_equal(with_batch(got), with_batch(expected))
    assert checkpoint_table(tmp_path / "key_group") == checkpoint_table(tmp_path / "key")


def test_the_layout_needs_a_rocksdb_working_store():
    op = cached_state(max_entries=10, layout="key_group")(aggregate({"n": Count()}))
    with pytest.raises(ValueError, match="RocksDB working store"):  # store="memory" and no checkpoint
        OperatorInstance(op.__opbuffer__, key_columns=["k"], key_types=None, index=0, parallelism=1, max_parallelism=8)


def test_an_unknown_layout_is_refused_naming_it():
    with pytest.raises(ValueError, match="'blocks'"):
        cached_state(layout="blocks")


@pytest.mark.parametrize("window", [Tumbling("1 minute"), Hopping("1 minute", "20 seconds")], ids=["tumbling", "hopping"])
@pytest.mark.parametrize("emit", ["watermark", "update"])
def test_windowed_aggregates_equal_the_per_key_layouts_through_evictions_and_rescales(tmp_path, window, emit):
    frames = batches(5, 10, timed=True)
    schedule, bound = (1, 3, 2), 40  # a bound of 40 (key, window) entries: key groups are evicted every batch
    expected = run("key", tmp_path / "key", frames, schedule, bound, window, emit)
    got = run("key_group", tmp_path / "key_group", frames, schedule, bound, window, emit)
    assert sum(map(len, got)) > 0
    pd.testing.assert_frame_equal(with_batch(got), with_batch(expected))
    assert checkpoint_table(tmp_path / "key_group") == checkpoint_table(tmp_path / "key")


def test_windows_of_a_string_and_long_key_equal_the_per_key_layouts_through_evictions_and_rescales(tmp_path):
    # Raw keys of several widths: window starts read from their ends, the closed windows' keys decoded one by one.
    frames = [
        f.assign(name="user-" + (f["k"] % 7).astype(str) * (1 + f["k"] % 3), k=f["k"] // 7)
        for f in batches(6, 8, timed=True)
    ]

    def run_with(layout: str, location) -> list[pd.DataFrame]:
        outputs = []
        for i, parallelism in enumerate((1, 3)):
            op = cached_state(max_entries=40, store="rocksdb", layout=layout)(aggregate(AGGS, window=Tumbling("1 minute")))
            runner = LocalRunner(op, key=["name", "k"], parallelism=parallelism, clock=Clock(),
                                 checkpoint_location=location, event_time="ts", watermark_delay_ms=20_000)
            outputs += [runner.process(f) for f in frames[i * 4 : (i + 1) * 4]]
            runner.close()
        return outputs

    expected = run_with("key", tmp_path / "key")
    got = run_with("key_group", tmp_path / "key_group")
    assert sum(map(len, got)) > 0
    pd.testing.assert_frame_equal(with_batch(got), with_batch(expected))
    assert checkpoint_table(tmp_path / "key_group") == checkpoint_table(tmp_path / "key")


def test_a_batch_failing_after_it_closed_windows_is_retried_with_those_windows_back(tmp_path, monkeypatch):
    from checkpoint.writer import CheckpointWriter

    frames = batches(8, 6, timed=True)
    window = Tumbling("1 minute")
    expected = run("key", tmp_path / "key", frames, (1,), 40, window)
    runner = runner_of(operator("key_group", 40, window), tmp_path / "ck", parallelism=2)
    outputs = [runner.process(f) for f in frames[:3]]
    write = CheckpointWriter.write

    def disk_full(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(CheckpointWriter, "write", disk_full)
    with pytest.raises(OSError, match="disk full"):
        runner.process(frames[3])  # closes windows (pops their entries from the blocks), then fails
    monkeypatch.setattr(CheckpointWriter, "write", write)
    outputs += [runner.process(f) for f in frames[3:]]
    runner.close()
    assert len(outputs[3]) > 0  # the retried batch emits the windows the failed attempt had popped
    pd.testing.assert_frame_equal(with_batch(outputs), with_batch(expected))
    assert checkpoint_table(tmp_path / "ck") == checkpoint_table(tmp_path / "key")


def test_session_windows_keep_the_per_key_layout():
    with pytest.raises(ValueError, match="session window"):
        cached_state(layout="key_group")(aggregate({"n": Count()}, window=Session("1 minute")))


def test_functions_keep_the_per_key_layout():
    def count(key, frames, state):
        yield from frames

    with pytest.raises(ValueError, match="is for aggregate"):
        cached_state(store="rocksdb", layout="key_group")(count)


def test_behind_a_mini_batch_trigger_the_layout_gives_the_same_outputs(tmp_path):
    frames = batches(10)

    def op(layout):
        return mini_batch(max_rows=50, max_delay_ms=1_000)(operator(layout, max_entries=8))

    outputs = {}
    for layout in ("key", "key_group"):
        runner = LocalRunner(op(layout), key="k", clock=Clock(), checkpoint_location=tmp_path / layout, parallelism=2)
        outputs[layout] = [runner.process(f) for f in frames] + [runner.advance_time(1_000)]
        runner.close()
    pd.testing.assert_frame_equal(with_batch(outputs["key_group"]), with_batch(outputs["key"]))
    assert checkpoint_table(tmp_path / "key_group") == checkpoint_table(tmp_path / "key")


def test_a_failed_conversion_at_a_restart_fails_it_and_the_next_start_converts(tmp_path, monkeypatch):
    """Restoring a key_group checkpoint with the per-key layout splits its blocks: a step of the restore."""
    frames = batches(11)
    expected = run("key", tmp_path / "key", frames)
    location = tmp_path / "switched"
    outputs = run("key_group", location, frames[:4], (2,))
    split_blocks_failing_once(monkeypatch)
    with pytest.raises(OSError, match="disk full"):  # the restore runs as the runner starts
        LocalRunner(operator("key"), key="k", parallelism=3, clock=Clock(), checkpoint_location=location)
    outputs += run("key", location, frames[4:], (3,))
    pd.testing.assert_frame_equal(with_batch(outputs), with_batch(expected))
    assert checkpoint_table(location) == checkpoint_table(tmp_path / "key")


@pytest.mark.parametrize("layout", ["key", "key_group"])
@pytest.mark.parametrize("window", [Tumbling("1 minute"), Hopping("1 minute", "20 seconds")], ids=["tumbling", "hopping"])
def test_windows_of_a_batchs_raw_rows_folded_as_columns_equal_those_merged_a_few_rows_at_a_time(tmp_path, layout, window):
    """Without a trigger a batch's rows are folded per (key, window start) as columns at its end; behind a
    count trigger they are merged a few rows at a time as partial objects: the same windows closed, the same
    state."""
    frames = batches(7, 8, timed=True)
    outputs = {}
    for name, wrap in (("columns", lambda op: op), ("partials", mini_batch(max_rows=9))):
        runner = runner_of(wrap(operator(layout, 1_000, window)), tmp_path / name)
        outputs[name] = [runner.process(f) for f in frames]
        runner.close()
    assert sum(map(len, outputs["columns"])) > 0
    pd.testing.assert_frame_equal(with_batch(outputs["columns"]), with_batch(outputs["partials"]))
    assert checkpoint_table(tmp_path / "columns") == checkpoint_table(tmp_path / "partials")
