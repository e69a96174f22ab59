"""cached_state(layout="auto"), the default: key-group blocks while the state fits the cache, then per key.

Which layout an instance uses never changes what the state is: outputs and
every checkpoint's content equal the per-key layout's, across the switch,
restarts, rescales and batches that fail.
"""

from __future__ import annotations

import pandas as pd
import pytest

from buffering import Count, aggregate, cached_state
from buffering.operator import OperatorInstance
from buffering.windows import Session, Tumbling
from state.blocks import KeyGroupCache, is_block_key
from state.cache import WriteBackCache

from .helpers import checkpoint_table, split_blocks_failing_once, with_batch
from .test_key_group_layout import batches, operator, run, runner_of


def layouts_after_each_batch(location, frames, max_entries: int, parallelism: int = 1) -> list[set[str]]:
    runner = runner_of(operator("auto", max_entries), location, parallelism)
    seen = []
    for frame in frames:
        runner.process(frame)
        seen.append({instance.layout for instance in runner.instances})
    runner.close()
    return seen


def test_it_is_the_default():
    op = cached_state(max_entries=10)(aggregate({"n": Count()}))
    assert op.__opbuffer__.state.layout == "auto"


def test_an_aggregate_whose_state_fits_the_cache_keeps_key_group_blocks(tmp_path):
    frames = batches()
    assert layouts_after_each_batch(tmp_path / "ck", frames, max_entries=1_000) == [{"key_group"}] * len(frames)


def test_the_first_batch_that_evicts_a_key_group_switches_the_instance_to_per_key_records(tmp_path):
    runner = runner_of(operator("auto", max_entries=5), tmp_path / "ck")  # far fewer than the 60 keys
    runner.process(batches(4)[1])
    instance = runner.instances[0]
    assert instance.layout == "key" and isinstance(instance.cache, WriteBackCache)
    raw_keys = [raw_key for raw_key, _ in instance.tables["state"].iter_raw()]
    assert raw_keys and not any(is_block_key(k) for k in raw_keys)  # every block turned into per-key records
    runner.close()


@pytest.mark.parametrize("parallelism", [1, 3])
def test_outputs_and_checkpoints_across_the_switch_equal_the_per_key_layouts(tmp_path, parallelism):
    frames = batches(4)
    expected = run("key", tmp_path / "key", frames, (parallelism,), max_entries=5)
    got = run("auto", tmp_path / "auto", frames, (parallelism,), max_entries=5)
    pd.testing.assert_frame_equal(with_batch(got), with_batch(expected))
    assert checkpoint_table(tmp_path / "auto") == checkpoint_table(tmp_path / "key")


def test_a_restart_after_the_switch_keeps_per_key_records_even_with_room_for_blocks(tmp_path):
    frames = batches(5)
    expected = run("key", tmp_path / "key", frames)
    location = tmp_path / "auto"
    outputs = run("auto", location, frames[:4], (2,), max_entries=5)
    runner = runner_of(operator("auto", max_entries=1_000), location, 3)
    assert {instance.layout for instance in runner.instances} == {"key"}
    outputs += [runner.process(f) for f in frames[4:]]
    runner.close()
    pd.testing.assert_frame_equal(with_batch(outputs), with_batch(expected))
    assert checkpoint_table(location) == checkpoint_table(tmp_path / "key")


def test_a_restart_from_key_group_blocks_keeps_blocks(tmp_path):
    frames = batches(6)
    location = tmp_path / "blocks"
    run("key_group", location, frames[:4], (2,))
    runner = runner_of(operator("auto"), location, 3)
    assert {instance.layout for instance in runner.instances} == {"key_group"}
    assert all(isinstance(instance.cache, KeyGroupCache) for instance in runner.instances)
    runner.close()


def test_a_batch_that_fails_in_the_switch_is_retried_counting_each_row_once(tmp_path, monkeypatch):
    frames = batches(7)
    expected = run("key", tmp_path / "key", frames, max_entries=5)
    runner = runner_of(operator("auto", max_entries=1_000), tmp_path / "ck")
    outputs = [runner.process(f) for f in frames[:2]]
    for instance in runner.instances:  # the state outgrows the cache from the next batch on
        assert isinstance(instance.cache, KeyGroupCache)
        instance.cache.resize(max_entries=5)
    split_blocks_failing_once(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        runner.process(frames[2])
    outputs += [runner.process(f) for f in frames[2:]]  # rebuilt from the checkpoint: blocks with room again
    runner.close()
    pd.testing.assert_frame_equal(with_batch(outputs), with_batch(expected))
    assert checkpoint_table(tmp_path / "ck") == checkpoint_table(tmp_path / "key")


def test_the_cache_counters_only_grow_across_the_switch(tmp_path):
    runner = runner_of(operator("auto", max_entries=5), tmp_path / "ck")
    frames = batches(8)
    runner.process(frames[0])
    instance = runner.instances[0]
    before = instance.stats()["cache"]
    assert isinstance(instance.cache, WriteBackCache) and before["evictions"] > 0
    runner.process(frames[1])
    after = instance.stats()["cache"]
    for name in ("hits", "misses", "evictions", "syncs", "writes"):
        assert after[name] >= before[name], name
    assert instance.cache_stats()[0] == after
    runner.close()


def test_windowed_aggregates_across_the_switch_equal_the_per_key_layouts(tmp_path):
    frames = batches(9, timed=True)
    window = Tumbling("1 minute")
    expected = run("key", tmp_path / "key", frames, (1, 3), max_entries=5, window=window)
    got = run("auto", tmp_path / "auto", frames, (1, 3), max_entries=5, window=window)
    pd.testing.assert_frame_equal(with_batch(got), with_batch(expected))
    assert checkpoint_table(tmp_path / "auto") == checkpoint_table(tmp_path / "key")


def _layout_of(op, **runner) -> str:
    instance = OperatorInstance(op.__opbuffer__, key_columns=["k"], key_types=None, index=0, parallelism=1,
                                max_parallelism=8, **runner)
    try:
        return instance.layout
    finally:
        instance.close()


def test_blocks_apply_to_an_aggregate_cached_in_front_of_rocksdb():
    assert _layout_of(cached_state(max_entries=10, store="rocksdb")(aggregate({"n": Count()}))) == "key_group"


@pytest.mark.parametrize(
    "settings, why",
    [
        (dict(max_entries=10), "state in memory, no RocksDB working store"),
        (dict(store="rocksdb"), "no cache asked for: the state goes straight to RocksDB"),
        (dict(max_entries=10, store="rocksdb", policy="lfu"), "key groups are evicted least recently used"),
    ],
    ids=["memory", "uncached", "lfu"],
)
def test_an_aggregate_where_blocks_do_not_apply_keeps_per_key_records(settings, why):
    assert _layout_of(cached_state(**settings)(aggregate({"n": Count()}))) == "key", why


def test_session_windows_and_functions_keep_per_key_records():
    def count(key, frames, state):
        yield from frames

    session = cached_state(max_entries=10, store="rocksdb")(aggregate({"n": Count()}, window=Session("1 minute")))
    assert _layout_of(session, event_time="ts") == "key"
    assert _layout_of(cached_state(max_entries=10, store="rocksdb")(count)) == "key"
