"""KeyGroupCache and the key-group block records (state.blocks), on real RocksDB in tmp_path.

The Store contract itself runs on a KeyGroupCache in test_stores.py (``any_store``).
"""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

from state import RocksDBStore, StateSerializationError
from state.blocks import (
    KeyGroupCache,
    concatenated_ranges,
    decode_block,
    encode_block,
    gather_ranges,
    is_block_key,
    iter_entries,
    split_blocks,
)

from .helpers import Probe


@pytest.fixture
def table(tmp_path):
    store = RocksDBStore(tmp_path / "db", max_parallelism=8, table="state")
    store.track_changes()
    yield store
    if not store.closed:
        store.close()


def _records(table):
    return list(table.iter_raw())


def _churn(cache, seed: int, keyspace: int, steps: int, most: int, flush_every: int):
    """Random writes to ``cache``, yielding after each step: deletes every 5th step, a flush every
    ``flush_every``-th, else puts of 1-299 byte values; a few reads after each."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        keys = rng.integers(0, keyspace, int(rng.integers(1, most))).tolist()
        if step % 5 == 4:
            cache.delete_many(set(keys))
        elif step % flush_every == flush_every - 1:
            cache.flush()
        else:
            cache.put_many((k, b"v" * int(rng.integers(1, 300))) for k in keys)
        cache.get_many(rng.integers(0, keyspace, 10).tolist())
        yield


@pytest.mark.parametrize(
    "starts, lengths",
    [
        ([8, 0, 24, 16], [8, 8, 8, 8]),  # one width, at multiples of it: gathered as rows
        ([3, 11], [8, 8]),  # one width, not at multiples of it
        ([0, 8, 20], [8, 12, 4]),  # several widths
        ([0, 8], [0, 0]),
        ([], []),
        ([60, 0, 130, 10], [70, 50, 60, 0]),  # long values of several widths: copied range by range
        ([200, 0], [50, 41]),
    ],
)
def test_gather_ranges_concatenates_the_byte_ranges(starts, lengths):
    source = np.arange(256, dtype=np.uint8)
    starts, lengths = np.array(starts, dtype=np.int64), np.array(lengths, dtype=np.int64)
    expected = b"".join(source[s : s + n].tobytes() for s, n in zip(starts.tolist(), lengths.tolist()))
    assert gather_ranges(source, starts, lengths).tobytes() == expected
    assert source[concatenated_ranges(starts, lengths)].tobytes() == expected


@pytest.mark.parametrize("lengths", [[8, 8], [3, 5], [90, 70]])
def test_gather_ranges_returns_a_new_writable_array(lengths):
    source = np.arange(256, dtype=np.uint8)
    out = gather_ranges(source, np.array([100, 0], dtype=np.int64), np.array(lengths, dtype=np.int64))
    out[:] = 0
    assert out.flags.writeable and (source == np.arange(256, dtype=np.uint8)).all()  # a copy, not a view


def test_gather_ranges_reads_a_strided_source():
    source = np.arange(512, dtype=np.uint8)[::2]
    starts, lengths = np.array([100, 3], dtype=np.int64), np.array([60, 45], dtype=np.int64)
    assert gather_ranges(source, starts, lengths).tobytes() == source[100:160].tobytes() + source[3:48].tobytes()


def test_a_write_back_stores_block_records_per_key_group_holding_the_per_key_records(table, tmp_path):
    reference = RocksDBStore(tmp_path / "reference", max_parallelism=8, table="state")
    pairs = [(k, {"v": k}) for k in range(50)]
    reference.put_many(pairs)
    cache = KeyGroupCache(table)
    cache.put_many(pairs)
    assert _records(table) == []  # nothing written before the write-back
    cache.flush()
    records = _records(table)
    assert all(is_block_key(k) for k, _ in records)
    assert len(records) == len({table.key_group(k) for k, _ in pairs})  # small blocks: one record each
    assert list(iter_entries(records)) == list(reference.iter_raw())
    assert table.drain_changes() == {k for k, _ in records}  # the checkpoint sees the blocks as changes
    reference.close()


def test_per_key_records_are_read_over_the_block_and_folded_at_the_write_back(table):
    cache = KeyGroupCache(table)
    cache.put_many([(1, "block"), (2, "block")])
    cache.flush()
    table.put(1, "per-key")  # a per-key record of key 1's key group, newer than the block
    table.put(3, "per-key")
    fresh = KeyGroupCache(table)
    assert fresh.get_many([1, 2, 3]) == ["per-key", "block", "per-key"]
    fresh.put(2, "changed")
    fresh.flush()
    assert all(is_block_key(k) for k, _ in _records(table))
    assert KeyGroupCache(table).get_many([1, 2, 3]) == ["per-key", "changed", "per-key"]


def test_a_value_that_cannot_be_pickled_is_a_type_error_naming_the_key_and_the_table(table):
    cache = KeyGroupCache(table)
    with pytest.raises(StateSerializationError) as info:
        cache.put_many([(1, "a"), (("locked", 7), threading.Lock())])
    assert isinstance(info.value, TypeError) and isinstance(info.value.__cause__, TypeError)
    assert "key ('locked', 7)" in str(info.value) and "table='state'" in str(info.value)


def test_a_batch_that_cannot_be_pickled_leaves_the_other_keys_as_they_were(table):
    cache = KeyGroupCache(table)
    cache.put_many([(1, "one"), (2, "two")])
    with pytest.raises(TypeError):
        cache.put_many([(1, "changed"), (3, threading.Lock())])
    assert dict(cache.items()) == {(1,): "one", (2,): "two"}
    cache.flush()
    assert dict(KeyGroupCache(table).items()) == {(1,): "one", (2,): "two"}


def test_split_blocks_turns_blocks_back_into_per_key_records(table):
    cache = KeyGroupCache(table)
    cache.put_many([(k, k * 10) for k in range(20)])
    cache.flush()
    table.put(4, "newer")
    table.drain_changes()
    groups = {table.key_group(k) for k in range(20)}
    assert split_blocks(table, range(8)) == len(groups)
    assert not any(is_block_key(k) for k, _ in _records(table))
    assert table.get_many(range(20)) == [("newer" if k == 4 else k * 10) for k in range(20)]
    assert len(table.drain_changes()) == 20 - 1 + len(groups)  # entries written (4 kept) and blocks deleted


def test_iter_entries_expands_blocks_in_key_order(table):
    keys = [b"\x00\x01\x01b", b"\x00\x01\x01a"]
    block = encode_block(keys, [b"B", b"A"])
    records = [(b"\x00\x01\x01a", b"per-key"), (b"\x00\x01\xff\x00\x00", block), (b"\x00\x02\x01z", b"Z")]
    assert list(iter_entries(records)) == [(b"\x00\x01\x01a", b"per-key"), (b"\x00\x01\x01b", b"B"), (b"\x00\x02\x01z", b"Z")]


@pytest.mark.parametrize(
    "keys",
    [
        [b"\x00\x01\x01" + (0).to_bytes(8, "big"), b"\x00\x01\x01" + (256).to_bytes(8, "big")],  # one width, ending in zeros
        [b"\x00\x01\x01a", b"\x00\x01\x01bb\x00", b"\x00\x01\x01"],  # several widths
    ],
)
def test_a_block_gives_back_its_keys_byte_for_byte(keys):
    values = [bytes([i]) * i for i in range(len(keys))]
    assert decode_block(encode_block(keys, values)) == (keys, values)


@pytest.mark.parametrize("damaged", [b"", b"OPBK\x01", b"junk" * 10, encode_block([b"\x00\x01\x01a"], [b"v"])[:-1]])
def test_a_damaged_block_is_refused(damaged):
    with pytest.raises(ValueError, match="block"):
        decode_block(damaged)


def test_max_entries_holds_and_evicted_key_groups_are_written_back(table):
    cache = KeyGroupCache(table, max_entries=10)
    for start in range(0, 200, 20):
        cache.put_many([(k, k) for k in range(start, start + 20)])
        assert cache.held_entries() <= 10
    cache.get_many(range(3))
    assert cache.held_entries() <= 10
    stats = cache.stats()
    assert stats["evictions"] > 0 and stats["writes"] > 0
    assert cache.get_many(range(200)) == list(range(200))


def test_max_bytes_bounds_the_held_blocks(table):
    cache = KeyGroupCache(table, max_bytes=64 << 10)
    value = b"x" * 1000
    for start in range(0, 2000, 100):
        cache.put_many([(k, value) for k in range(start, start + 100)])
        assert cache.estimated_bytes() <= 64 << 10
    assert cache.get_many([0, 1999]) == [value, value]


def test_update_values_hands_the_values_over_and_writes_what_comes_back(table):
    cache = KeyGroupCache(table)
    cache.put_many([(1, "a"), (2, "b")])
    seen = {}

    def update(buffer, starts, lengths):
        seen["lengths"] = lengths.tolist()
        values = [pickle.loads(buffer[s : s + n].tobytes()) if n >= 0 else None for s, n in zip(starts, lengths)]
        seen["values"] = values
        changed = pickle.dumps(values[0] + "!")  # key 1 changed, key 2 deleted, key 3 gets key 1's value
        return np.frombuffer(changed, dtype=np.uint8), np.array([0, 0, 0]), np.array([len(changed), -1, len(changed)])

    cache.update_values([1, 2, 3], update)
    assert seen["values"] == ["a", "b", None] and seen["lengths"][2] == -1
    assert cache.get_many([1, 2, 3]) == ["a!", None, "a!"]  # 2 deleted, 3 new
    assert 2 not in cache


def test_update_values_returns_each_keys_key_group(table):
    cache = KeyGroupCache(table)
    keys = list(range(40))
    got = cache.update_values(keys, lambda b, s, n: (b, s, n))
    assert got.tolist() == [table.key_group(k) for k in keys]


def test_pop_selected_deletes_and_returns_the_entries_the_predicate_picks_in_the_key_groups_named(tmp_path):
    store = RocksDBStore(tmp_path / "db", max_parallelism=8, group_columns=1)
    cache = KeyGroupCache(store, max_entries=10)  # 40 entries in 8 key groups: most are evicted meanwhile
    pairs = [((k, start), f"{k}@{start}") for k in range(20) for start in (0, 60_000)]
    cache.put_many(pairs)
    cache.delete_many([(3, 0)])  # a dead row in its block: never popped
    groups = sorted({store.key_group(key) for key, _ in pairs})
    named = groups[:-1]  # the last key group's entries stay, whatever the predicate says
    starting_at_zero = b"\x01" + (0).to_bytes(8, "big")

    raws, buffer, starts, lengths = cache.pop_selected(
        named, lambda raw_keys: np.array([raw.endswith(starting_at_zero) for raw in raw_keys], dtype=bool)
    )

    values = [pickle.loads(buffer[s : s + n].tobytes()) for s, n in zip(starts.tolist(), lengths.tolist())]
    expected = {key: value for key, value in pairs if key[1] == 0 and key != (3, 0) and store.key_group(key) in named}
    assert dict(zip(store.decode_raw_keys(raws), values)) == expected and len(raws) == len(expected)
    assert dict(cache.items()) == {key: value for key, value in pairs if key not in expected and key != (3, 0)}
    cache.close()


def test_iter_group_keys_gives_the_raw_keys_of_each_key_group_holding_entries(table):
    cache = KeyGroupCache(table, max_entries=10)  # 60 entries: key groups loaded and evicted on the way
    cache.put_many([(k, k) for k in range(60)])
    cache.flush()
    cache.delete_many(range(0, 60, 3))  # dead rows in the held blocks are not keys
    got = dict(cache.iter_group_keys(range(8)))
    expected: dict[int, set] = {}
    for k in range(60):
        if k % 3:
            expected.setdefault(table.key_group(k), set()).add(table.raw_keys([k])[0])
    assert {g: set(raws) for g, raws in got.items()} == expected
    assert all(len(raws) == len(set(raws)) for raws in got.values())


def test_iter_group_keys_loads_no_key_group_without_entries(tmp_path):
    store = RocksDBStore(tmp_path / "db", max_parallelism=4096, table="state")
    cache = KeyGroupCache(store)
    cache.put_many([(k, k) for k in range(3)])
    cache.flush()
    cold = KeyGroupCache(store)  # as an adopted instance's: nothing held
    assert sorted(g for g, _ in cold.iter_group_keys(range(4096))) == sorted({store.key_group(k) for k in range(3)})
    assert cold.stats()["key_groups"] == 3
    store.close()


def test_pop_selected_refuses_a_mask_of_another_length(table):
    cache = KeyGroupCache(table)
    cache.put_many([(1, "a")])
    with pytest.raises(ValueError, match="mask of shape"):
        cache.pop_selected([table.key_group(1)], lambda raws: np.ones(len(raws) + 1, dtype=bool))
    assert cache.get(1) == "a"


def test_update_values_refuses_repeated_keys_and_a_short_answer(table):
    cache = KeyGroupCache(table)
    with pytest.raises(ValueError, match="distinct"):
        cache.update_values([1, 1], lambda b, s, n: (b, s, n))
    with pytest.raises(ValueError, match="1 values for 2 keys"):
        cache.update_values([1, 2], lambda b, s, n: (b, s[:1], n[:1]))


def test_a_flushed_cache_follows_its_reopened_table(tmp_path):
    path = tmp_path / "db"
    cache = KeyGroupCache(RocksDBStore(path, max_parallelism=8, table="state"))
    cache.put_many([(k, k) for k in range(10)])
    with pytest.raises(RuntimeError, match="flush"):
        cache.rebind(RocksDBStore(tmp_path / "other", max_parallelism=8, table="state"))
    cache.flush()
    cache.table_store.close()
    cache.rebind(RocksDBStore(path, max_parallelism=8, table="state"))
    cache.put(10, 10)
    cache.close()
    reopened = RocksDBStore(path, max_parallelism=8, table="state")
    assert list(KeyGroupCache(reopened).get_many(range(11))) == list(range(11))
    reopened.close()


def test_a_table_grouping_its_keys_by_a_column_keeps_each_group_in_its_block(tmp_path):
    store = RocksDBStore(tmp_path / "db", max_parallelism=8, group_columns=1)
    cache = KeyGroupCache(store)
    pairs = [((k, start), k * 1000 + start) for k in range(40) for start in (0, 60_000)]
    cache.put_many(pairs)
    cache.flush()
    records = list(store.iter_raw())
    assert records and all(is_block_key(raw_key) for raw_key, _ in records)
    # a (key, window start) pair is in the block of the key's own key group
    assert {raw_key[:2] for raw_key, _ in records} == {store.raw_keys([(k, 0)])[0][:2] for k in range(40)}
    assert sorted(cache.key_list()) == sorted(k for k, _ in pairs)
    assert KeyGroupCache(store).get_many([k for k, _ in pairs]) == [v for _, v in pairs]
    store.close()


@pytest.mark.parametrize("bound", [0, -1, 1.5, True])
def test_bounds_must_be_positive_ints(table, bound):
    with pytest.raises(ValueError, match="max_entries"):
        KeyGroupCache(table, max_entries=bound)


def test_a_large_key_group_is_cut_into_records_of_about_block_record_bytes(table):
    from state.blocks import BLOCK_RECORD_BYTES

    cache = KeyGroupCache(table)
    value = b"v" * 1000
    keys = [k for k in range(5000) if table.key_group(k) == 3][:300]  # about 300 KB in one key group
    cache.put_many((k, value) for k in keys)
    cache.flush()
    records = _records(table)
    assert len(records) >= 300_000 // BLOCK_RECORD_BYTES
    assert all(len(v) <= BLOCK_RECORD_BYTES + 2048 for _, v in records)
    cache.delete_many(keys[10:])  # the key group shrinks: its records beyond the new count are deleted
    cache.flush()
    assert len(_records(table)) == 1
    assert KeyGroupCache(table).get_many(keys[:12]) == [value] * 10 + [None, None]


def test_the_held_entries_and_bytes_it_reports_are_those_of_the_key_groups_it_holds(table):
    """The totals the bounds check are kept as groups change, not summed each time: they must not drift."""
    cache = KeyGroupCache(table, max_entries=120, max_bytes=40_000)
    for _ in _churn(cache, seed=5, keyspace=400, steps=60, most=80, flush_every=7):
        held = list(cache._groups.values())
        assert cache.held_entries() == sum(len(g) for g in held)
        assert cache.estimated_bytes() == sum(g.memory_bytes() for g in held)
        assert cache.held_entries() <= 120 or len(held) == 1


# ------------------------------------------------------------------ watermarks


def _dirty_totals(cache):
    dirty = [cache._groups[p] for p in cache._dirty]
    return sum(len(g) for g in dirty), sum(g.memory_bytes() for g in dirty)


def test_above_the_high_watermark_the_oldest_dirty_key_groups_are_written_back_down_to_the_low_one(table):
    cache = KeyGroupCache(table, max_entries=1_000, low_watermark=0.2, high_watermark=0.5)
    for start in range(0, 800, 40):  # 40 new keys a call, over all 8 key groups
        cache.put_many([(k, k) for k in range(start, start + 40)])
        assert _dirty_totals(cache)[0] <= 500
    stats = cache.stats()
    assert stats["syncs"] > 0 and stats["evictions"] == 0
    assert _dirty_totals(cache)[0] <= 500
    assert cache.held_entries() == 800  # synced key groups stay held, clean
    written = {key for raw_key, value in _records(table) if is_block_key(raw_key) for key in decode_block(value)[0]}
    assert len(written) >= 800 - 500  # what was synced is in the table before any flush
    cache.flush()
    assert cache.get_many(range(800)) == list(range(800))


def test_a_sync_writes_the_least_recently_modified_key_groups(table):
    cache = KeyGroupCache(table, max_entries=100, low_watermark=0.3, high_watermark=0.6)
    groups = {}
    for k in range(400):
        groups.setdefault(cache.key_group(k), []).append(k)
    first, second, third = (groups[g][:25] for g in sorted(groups)[:3])
    cache.put_many((k, 1) for k in first)
    cache.put_many((k, 1) for k in second)
    assert cache.stats()["syncs"] == 0  # 50 dirty entries: under the high watermark (60)
    cache.put_many((k, 1) for k in third)  # 75 > 60: the oldest (first) goes, then 50 > 30: the second too
    assert cache.stats()["syncs"] == 2
    assert list(cache._dirty) == [cache._table.raw_keys([(third[0],)])[0][:2]]


def test_watermarks_on_bytes_keep_the_dirty_bytes_under_the_high_one(table):
    cache = KeyGroupCache(table, max_bytes=200_000, low_watermark=0.25, high_watermark=0.5)
    for start in range(0, 600, 30):
        cache.put_many([(k, b"x" * 300) for k in range(start, start + 30)])
        assert _dirty_totals(cache)[1] <= 100_000
        assert cache.estimated_bytes() <= 200_000
    assert cache.stats()["syncs"] > 0
    assert cache.get_many([0, 599]) == [b"x" * 300] * 2


def test_a_key_group_larger_than_the_high_watermark_is_written_back_after_each_call(table):
    cache = KeyGroupCache(table, max_entries=100, low_watermark=0.1, high_watermark=0.2)
    same_group = [k for k in range(2_000) if cache.key_group(k) == 3][:30]
    for round_ in range(3):
        cache.put_many((k, round_) for k in same_group)
        assert cache.dirty_groups == 0
    assert cache.stats()["syncs"] == 3
    assert cache.get_many(same_group) == [2] * len(same_group)


def test_the_dirty_totals_watermarks_check_do_not_drift(table):
    cache = KeyGroupCache(table, max_entries=150, max_bytes=60_000, low_watermark=0.3, high_watermark=0.6)
    for _ in _churn(cache, seed=11, keyspace=500, steps=80, most=60, flush_every=9):
        entries, size = _dirty_totals(cache)
        assert (cache._dirty_entries, cache._dirty_bytes) == (entries, size)
        assert entries <= 0.6 * 150 or cache.dirty_groups == 1
        assert all(cache._groups[p].dirty for p in cache._dirty)
        assert not any(g.dirty for p, g in cache._groups.items() if p not in cache._dirty)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_entries": 10, "low_watermark": 0.2}, "both low_watermark and high_watermark"),
        ({"max_entries": 10, "low_watermark": 0.6, "high_watermark": 0.5}, "below high_watermark 0.5"),
        ({"max_entries": 10, "low_watermark": 0.2, "high_watermark": 1.5}, "high_watermark must be a fraction in \\(0, 1\\], got 1.5"),
        ({"low_watermark": 0.2, "high_watermark": 0.5}, "fractions of capacity"),
    ],
)
def test_watermark_settings_are_checked_naming_the_value(table, kwargs, message):
    with pytest.raises(ValueError, match=message):
        KeyGroupCache(table, **kwargs)


# ------------------------------------------------------------------ a manager's budget


def _probe_manager(blocks: int, block_bytes: int = 16 << 10):
    from state import CacheManager

    return CacheManager(blocks * block_bytes, block_bytes=block_bytes, min_interval_s=0.0, probe=Probe("normal"))


def test_a_manager_grants_the_byte_bound_and_the_blocks_stay_under_it(tmp_path):
    manager = _probe_manager(16)
    store = RocksDBStore(tmp_path / "db", max_parallelism=8, table="a")
    first = KeyGroupCache(store, manager=manager, name="a")
    assert first.max_bytes == 16 * (16 << 10) and first.stats()["granted_bytes"] == first.max_bytes
    for start in range(0, 3_000, 100):
        first.put_many((k, b"x" * 200) for k in range(start, start + 100))
        assert first.estimated_bytes() <= first.max_bytes
    second = KeyGroupCache(store.table("b"), manager=manager, name="b")  # the budget is shared: the first shrinks
    assert first.max_bytes + second.max_bytes <= manager.max_bytes
    assert first.estimated_bytes() <= first.max_bytes
    assert first.get_many([0, 2_999]) == [b"x" * 200] * 2
    second.close()
    assert manager.stats()["caches"].keys() == {"a"}
    first.close()
    assert not manager.stats()["caches"]


def test_watermarks_follow_the_bytes_a_manager_grants(tmp_path):
    manager = _probe_manager(8)
    cache = KeyGroupCache(RocksDBStore(tmp_path / "db", max_parallelism=8, table="a"), manager=manager,
                          low_watermark=0.2, high_watermark=0.4)
    for start in range(0, 1_000, 50):
        cache.put_many((k, b"x" * 100) for k in range(start, start + 50))
        assert _dirty_totals(cache)[1] <= 0.4 * cache.max_bytes
    cache.resize(max_bytes=cache.max_bytes // 2)  # the manager shrinking it: evicted and synced at once
    assert cache.estimated_bytes() <= cache.max_bytes and _dirty_totals(cache)[1] <= 0.4 * cache.max_bytes
    assert cache.stats()["syncs"] > 0
    cache.close()


def test_a_cache_with_watermarks_keeps_a_bound_when_resized(table):
    cache = KeyGroupCache(table, max_entries=10, low_watermark=0.2, high_watermark=0.5)
    with pytest.raises(ValueError, match="watermarks, which are fractions of a bound"):
        cache.resize(max_entries=None)
    with pytest.raises(ValueError, match="max_bytes must be a positive int or None, got 0"):
        cache.resize(max_bytes=0)
    assert (cache.max_entries, cache.max_bytes) == (10, None)  # refused: nothing changed
