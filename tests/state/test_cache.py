"""WriteBackCache: read-through, write-back, bounds, policies, watermarks (DESIGN.md, "Write-back cache")."""

from __future__ import annotations

import gc
import math
import pickle
import random
import threading

import numpy as np
import pytest

from state import (
    ClockPolicy,
    LFUPolicy,
    LRUPolicy,
    MemoryEstimator,
    MemoryStore,
    RocksDBStore,
    StateSerializationError,
    StoreClosedError,
    WriteBackCache,
)

from state.cache.estimator import deep_sizeof

from .conftest import POLICIES
from .helpers import CountingMemoryStore, check_bounds, high_watermark_count

# ------------------------------------------------------------------ impossible configurations


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(max_entries=0),
        dict(max_entries=-1),
        dict(max_entries=2.5),
        dict(max_entries=True),
        dict(max_bytes=0),
        dict(max_bytes=-100),
        dict(max_entries=10, max_bytes=0),
        dict(max_entries=10, low_watermark=0.5, high_watermark=0.5),
        dict(max_entries=10, low_watermark=0.75, high_watermark=0.5),
        dict(max_entries=10, low_watermark=0.25),
        dict(max_entries=10, high_watermark=0.5),
        dict(max_entries=10, low_watermark=0, high_watermark=0.5),
        dict(max_entries=10, low_watermark=-0.25, high_watermark=0.5),
        dict(max_entries=10, low_watermark=0.5, high_watermark=1.5),
        dict(max_entries=10, low_watermark=1.0, high_watermark=1.0),
        dict(max_entries=10, low_watermark=float("nan"), high_watermark=0.5),
        dict(max_entries=10, low_watermark=0.25, high_watermark=float("nan")),
        dict(low_watermark=0.25, high_watermark=0.5),
        dict(max_entries=10, policy="fifo"),
        dict(max_entries=10, policy=None),
        dict(max_entries=10, sync_step=0),
        dict(max_entries=10, write_batch_entries=0),
    ],
    ids=lambda kwargs: ",".join(f"{k}={v!r}" for k, v in kwargs.items()),
)
def test_impossible_configuration_fails_at_construction(kwargs):
    with pytest.raises(ValueError):
        WriteBackCache(MemoryStore(), **kwargs)


def test_backend_must_be_a_store():
    with pytest.raises(TypeError):
        WriteBackCache({}, max_entries=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs", [dict(max_entries=0), dict(max_bytes=-1), dict(max_entries=1.5)], ids=repr)
def test_impossible_resize_fails_and_keeps_the_old_bound(kwargs):
    cache = WriteBackCache(MemoryStore(), max_entries=4)
    with pytest.raises(ValueError):
        cache.resize(**kwargs)
    assert cache.stats()["max_entries"] == 4
    assert cache.capacity == 4


@pytest.mark.parametrize("name, cls", [("lru", LRUPolicy), ("clock", ClockPolicy), ("lfu", LFUPolicy)])
def test_policy_by_name_or_instance(name, cls):
    assert isinstance(WriteBackCache(MemoryStore(), policy=name).policy, cls)
    assert isinstance(WriteBackCache(MemoryStore(), policy=name.upper()).policy, cls)
    instance = cls()
    assert WriteBackCache(MemoryStore(), policy=instance).policy is instance


def test_without_bounds_the_cache_is_unbounded():
    cache = WriteBackCache(MemoryStore())
    cache.put_many((i, i) for i in range(1000))
    assert cache.capacity is None
    assert len(cache) == 1000


# ------------------------------------------------------------------ read-through, write-back


def test_a_miss_loads_from_the_backend(backend_kind, make_backend):
    backend = make_backend(backend_kind)
    backend.put("k", "stored")
    cache = WriteBackCache(backend, max_entries=4)
    assert cache.get("k") == "stored"
    assert cache.stats()["loads"] == 1
    assert cache.stats()["misses"] == 1


def test_a_put_reaches_the_backend_only_at_eviction_or_flush(backend_kind, make_backend):
    backend = make_backend(backend_kind)
    cache = WriteBackCache(backend, max_entries=4)
    cache.put("k", 1)
    assert "k" not in backend
    assert cache.dirty_count() == 1
    cache.flush()
    assert backend.get("k") == 1
    assert cache.dirty_count() == 0


def test_an_evicted_dirty_entry_is_written_to_the_backend(backend_kind, make_backend):
    backend = make_backend(backend_kind)
    cache = WriteBackCache(backend, max_entries=1, write_batch_entries=1)
    cache.put("a", 1)
    cache.put("b", 2)  # evicts "a"
    assert len(cache) == 1
    assert backend.get("a") == 1
    assert cache.get("a") == 1


def test_an_evicted_clean_entry_is_not_written():
    backend = CountingMemoryStore()
    backend.put_many((i, i) for i in range(10))
    written = backend.entries_written
    cache = WriteBackCache(backend, max_entries=2)
    for i in range(10):
        assert cache.get(i) == i
    assert cache.stats()["evictions"] == 8
    assert backend.entries_written == written


def test_a_delete_is_a_tombstone_written_at_flush(backend_kind, make_backend):
    backend = make_backend(backend_kind)
    backend.put("k", "old")
    cache = WriteBackCache(backend, max_entries=4)
    cache.delete("k")
    assert "k" not in cache
    assert backend.get("k") == "old"
    cache.flush()
    assert "k" not in backend


def test_an_evicted_tombstone_deletes_from_the_backend(backend_kind, make_backend):
    backend = make_backend(backend_kind)
    backend.put("k", "old")
    cache = WriteBackCache(backend, max_entries=1, write_batch_entries=1)
    cache.delete("k")
    cache.put("other", 1)  # evicts the tombstone
    assert "k" not in backend
    assert "k" not in cache


def test_a_read_of_a_new_key_is_cached_as_absent():
    backend = CountingMemoryStore()
    cache = WriteBackCache(backend, max_entries=4)
    assert cache.get("new") is None
    assert cache.get("new") is None
    assert "new" not in cache
    assert backend.single_loads + backend.load_many_calls == 1
    assert cache.stats()["hits"] == 2
    assert cache.stats()["loads"] == 0  # loads count values found in the store


def test_get_many_loads_every_miss_in_one_batched_read():
    backend = CountingMemoryStore()
    backend.put_many((i, f"v{i}") for i in range(20))
    cache = WriteBackCache(backend, max_entries=100)
    cache.get(0)
    loads_before = backend.single_loads
    keys = [3, 0, 5, 3, 99, 7, np.int64(5)]
    assert cache.get_many(keys) == ["v3", "v0", "v5", "v3", None, "v7", "v5"]
    assert backend.load_many_calls == 1
    assert backend.single_loads == loads_before


def test_get_many_over_a_cache_smaller_than_the_batch_returns_every_value(backend_kind, make_backend, policy):
    backend = make_backend(backend_kind)
    backend.put_many((i, i * 10) for i in range(50))
    cache = WriteBackCache(backend, max_entries=3, policy=policy)
    cache.put(1, "dirty")
    keys = list(range(50)) + [1, 2, 1]
    expected = [i * 10 for i in range(50)] + ["dirty", 20, "dirty"]
    expected[1] = "dirty"
    assert cache.get_many(keys) == expected
    check_bounds(cache, None)


def test_flush_writes_every_dirty_entry_in_one_batch():
    backend = CountingMemoryStore()
    cache = WriteBackCache(backend, max_entries=100)
    cache.put_many((i, i) for i in range(30))
    cache.delete(31)
    calls = backend.write_calls
    cache.flush()
    assert backend.write_calls == calls + 1
    assert backend.entries_written == 31
    assert dict(backend.items()) == {(i,): i for i in range(30)}


def test_flush_to_rocksdb_is_one_write_batch(make_cache):
    cache = make_cache("rocksdb", max_entries=100)
    cache.put_many((i, i) for i in range(30))
    batches = cache.stats()["write_batches"]
    cache.flush()
    assert cache.stats()["write_batches"] == batches + 1
    assert cache.stats()["writes"] == 30
    assert dict(cache.backend.items()) == {(i,): i for i in range(30)}


def test_reads_see_evicted_entries_still_in_the_write_buffer(make_cache):
    cache = make_cache("rocksdb", max_entries=2, write_batch_entries=1000)
    for i in range(20):
        cache.put(i, i)
    assert cache.stats()["pending"] > 0
    assert list(cache.backend.items()) == []  # nothing written yet: the evictions wait in the buffer
    assert cache.get_many(range(20)) == list(range(20))
    assert [cache.get(i) for i in range(20)] == list(range(20))
    assert sorted(v for _, v in cache.items()) == list(range(20))


def test_items_merges_cache_and_backend(backend_kind, make_backend):
    backend = make_backend(backend_kind)
    backend.put_many([(1, "old"), (2, "old"), (3, "old")])
    cache = WriteBackCache(backend, max_entries=10)
    cache.put(1, "new")
    cache.delete(2)
    cache.put(4, "new")
    cache.get(5)
    assert dict(cache.items()) == {(1,): "new", (3,): "old", (4,): "new"}


def test_resize_evicts_down_to_the_new_bound_at_once(backend_kind, make_backend, policy):
    backend = make_backend(backend_kind)
    cache = WriteBackCache(backend, max_entries=50, policy=policy)
    cache.put_many((i, i) for i in range(50))
    cache.resize(max_entries=5)
    assert len(cache) == 5
    assert cache.capacity == 5
    assert cache.get_many(range(50)) == list(range(50))
    cache.resize(max_entries=None)
    assert cache.capacity is None


def test_close_flushes_and_closes_a_memory_backend():
    backend = CountingMemoryStore()
    cache = WriteBackCache(backend, max_entries=10)
    cache.put("k", "v")
    cache.close()
    assert backend.entries_written == 1
    with pytest.raises(StoreClosedError):
        backend.table("x")


def test_close_flushes_and_closes_a_rocksdb_backend(tmp_path):
    backend = RocksDBStore(tmp_path / "db")
    cache = WriteBackCache(backend, max_entries=10)
    cache.put("k", "v")
    cache.close()
    assert backend.closed
    with pytest.raises(StoreClosedError):
        backend.get("k")
    del cache, backend  # reopening must not hinge on close() releasing the LOCK while objects live
    gc.collect()  # (test_rocksdb.py::test_a_closed_store_releases_its_lock)
    reopened = RocksDBStore(tmp_path / "db")
    try:
        assert dict(reopened.items()) == {("k",): "v"}
    finally:
        reopened.close()


def test_operations_on_a_closed_cache_raise_store_closed_error(backend_kind, make_backend):
    cache = WriteBackCache(make_backend(backend_kind), max_entries=10)
    cache.put(1, "a")
    cache.close()
    for call in (
        lambda: cache.get(1),
        lambda: cache.put(2, "b"),
        lambda: cache.delete(1),
        lambda: 1 in cache,
        lambda: cache.get_many([1, 2]),
    ):
        with pytest.raises(StoreClosedError):
            call()


# ------------------------------------------------------------------ policies


def test_lru_evicts_the_least_recently_used():
    cache = WriteBackCache(MemoryStore(), max_entries=3, policy="lru")
    cache.put_many([(1, 1), (2, 2), (3, 3)])
    cache.get(1)
    cache.put(4, 4)  # evicts 2
    assert cache.stats()["evictions"] == 1
    hits = cache.stats()["hits"]
    cache.get_many([1, 3, 4])
    assert cache.stats()["hits"] == hits + 3
    cache.get(2)
    assert cache.stats()["misses"] == 1


def test_lfu_evicts_the_least_frequently_used():
    cache = WriteBackCache(MemoryStore(), max_entries=3, policy="lfu")
    cache.put_many([(1, 1), (2, 2), (3, 3)])
    for _ in range(3):
        cache.get(1)
        cache.get(3)
    cache.put(4, 4)  # 2 and 4 were used once; of those 2 is the least recently used
    misses = cache.stats()["misses"]
    cache.get_many([1, 3, 4])
    assert cache.stats()["misses"] == misses
    cache.get(2)
    assert cache.stats()["misses"] == misses + 1


def test_clock_gives_a_referenced_entry_a_second_chance():
    cache = WriteBackCache(MemoryStore(), max_entries=3, policy="clock")
    cache.put_many([(1, 1), (2, 2), (3, 3)])
    cache.get(1)
    cache.put(4, 4)  # 1 is referenced: 2 goes
    misses = cache.stats()["misses"]
    cache.get(1)
    assert cache.stats()["misses"] == misses
    cache.get(2)
    assert cache.stats()["misses"] == misses + 1


def test_lfu_ages_counts_so_old_hot_keys_can_leave():
    policy = LFUPolicy(max_count=8)
    cache = WriteBackCache(MemoryStore(), max_entries=2, policy=policy)
    cache.put(1, 1)
    for _ in range(100):
        cache.get(1)
    cache.put(2, 2)
    for _ in range(5):
        cache.get(2)
    assert len(policy) == 2
    cache.put(3, 3)
    assert len(cache) == 2


# ------------------------------------------------------------------ stats and hit ratio


def test_stats_report_the_documented_counters(backend_kind, make_backend):
    cache = WriteBackCache(make_backend(backend_kind), max_entries=2)
    cache.put(1, 1)
    cache.get(1)
    cache.get(2)
    cache.put(3, 3)
    stats = cache.stats()
    for key in ("hits", "misses", "hit_ratio", "loads", "evictions", "dirty", "entries", "syncs"):
        assert key in stats, key
    assert stats["hits"] == 1
    assert stats["misses"] == 1
    assert stats["hit_ratio"] == 0.5
    assert stats["entries"] == 2
    assert stats["evictions"] == 1
    assert stats["dirty"] == cache.dirty_count() == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_hits_count_reads_only_not_deletes_or_flushes(policy):
    cache = WriteBackCache(MemoryStore(), max_entries=4, policy=policy)
    cache.put_many([(1, 1), (2, 2)])
    cache.delete(1)
    cache.flush()
    assert cache.stats()["hits"] == 0
    cache.get(2)
    cache.get_many([1, 2])
    assert (1 in cache) is False
    assert cache.stats()["hits"] == 4
    assert cache.stats()["misses"] == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_a_put_after_the_get_of_a_since_evicted_key_enters_as_a_new_entry(policy):
    backend = MemoryStore()
    cache = WriteBackCache(backend, max_entries=2, policy=policy)
    assert cache.get(1) is None
    cache.put_many([(2, 2), (3, 3)])  # 1 is evicted
    cache.put(1, 10)
    assert len(cache) == 2
    check_bounds(cache, None)
    cache.flush()
    assert backend.get(1) == 10 and backend.get(2) == 2 and backend.get(3) == 3


def test_a_put_right_after_a_get_of_the_same_key_keeps_it_most_recent():
    cache = WriteBackCache(MemoryStore(), max_entries=2)
    cache.put_many([(1, 1), (2, 2)])
    cache.put(1, cache.get(1) + 1)  # read-modify-write of 1: 2 becomes the least recent
    cache.put(3, 3)  # evicts 2
    misses = cache.stats()["misses"]
    assert cache.get(1) == 2
    assert cache.stats()["misses"] == misses
    assert cache.get(2) == 2
    assert cache.stats()["misses"] == misses + 1


def test_flush_does_not_change_the_lru_order():
    cache = WriteBackCache(MemoryStore(), max_entries=2)
    cache.put(1, 1)
    cache.put(2, 2)
    cache.get(2)
    cache.put(1, 11)  # 1 most recent, both dirty
    cache.get(2)  # now 2 most recent
    cache.flush()
    cache.put(3, 3)  # evicts 1, the least recently used, whatever flush read
    misses = cache.stats()["misses"]
    cache.get(2)
    assert cache.stats()["misses"] == misses
    assert cache.get(1) == 11
    assert cache.stats()["misses"] == misses + 1


def _seed_key(x: int) -> int:
    return x % 500 + 500 * ((x // 1000) % 2)


@pytest.mark.parametrize("max_entries, low, high", [(250, 0.0, 0.01), (500, 0.49, 0.51), (1000, 0.95, 1.0)])
def test_hit_ratio_of_the_seed_pattern_under_lru(backend_kind, make_backend, max_entries, low, high):
    """Two working sets of 500 keys, each read-modify-written twice in turn (the seed benchmark)."""
    cache = WriteBackCache(make_backend(backend_kind), max_entries=max_entries, policy="lru")
    n = 20_000
    for x in range(n):
        key = _seed_key(x)
        cache.put(key, cache.get(key, 0) + 1)
    assert low <= cache.stats()["hit_ratio"] <= high
    cache.flush()
    counts: dict[int, int] = {}
    for x in range(n):
        counts[_seed_key(x)] = counts.get(_seed_key(x), 0) + 1
    assert dict(cache.backend.items()) == {(k,): c for k, c in counts.items()}


# ------------------------------------------------------------------ unserializable values


def test_an_unserializable_value_fails_at_eviction_naming_the_key_and_stays_readable(make_cache):
    cache = make_cache("rocksdb", max_entries=2, write_batch_entries=1)
    lock = threading.Lock()
    cache.put(("locked", 7), lock)
    cache.put(1, "a")
    with pytest.raises(StateSerializationError) as info:
        cache.put(2, "b")  # evicts the lock
    assert repr(("locked", 7)) in str(info.value)
    assert isinstance(info.value, TypeError)
    assert cache.get(("locked", 7)) is lock
    assert cache.get(1) == "a"
    assert cache.get(2) == "b"
    cache.put(("locked", 7), "fixed")
    cache.flush()
    assert dict(cache.backend.items()) == {("locked", 7): "fixed", (1,): "a", (2,): "b"}


def test_an_unserializable_value_at_flush_is_a_type_error_caused_by_the_serializers_error(make_cache):
    cache = make_cache("rocksdb", max_entries=10)
    cache.put("ok", 1)
    cache.put("bad", threading.Lock())
    with pytest.raises(TypeError) as info:
        cache.flush()
    assert isinstance(info.value, StateSerializationError)
    assert "key ('bad',)" in str(info.value) and "table=" in str(info.value)
    assert isinstance(info.value.__cause__, TypeError) and "_thread.lock" in str(info.value.__cause__)


def test_an_unserializable_value_fails_at_flush_naming_the_key_and_stays_readable(make_cache):
    cache = make_cache("rocksdb", max_entries=10)
    lock = threading.Lock()
    cache.put("ok", 1)
    cache.put("bad", lock)
    with pytest.raises(StateSerializationError) as info:
        cache.flush()
    assert repr("bad") in str(info.value)
    assert cache.get("bad") is lock
    assert cache.get("ok") == 1
    assert cache.dirty_count() == 2
    cache.delete("bad")
    cache.flush()
    assert dict(cache.backend.items()) == {("ok",): 1}


def test_an_unserializable_value_is_fine_over_a_memory_store():
    cache = WriteBackCache(MemoryStore(), max_entries=1)
    lock = threading.Lock()
    cache.put("lock", lock)
    cache.put("other", 1)
    cache.flush()
    assert cache.get("lock") is lock


# ------------------------------------------------------------------ watermarks

WATERMARKS = [(0.25, 0.5), (0.5, 1.0), (0.1, 0.2)]


@pytest.mark.parametrize("low, high", WATERMARKS)
def test_dirty_entries_never_exceed_the_high_watermark(backend_kind, make_backend, policy, low, high):
    cache = WriteBackCache(
        make_backend(backend_kind), max_entries=20, policy=policy, low_watermark=low, high_watermark=high
    )
    rnd = random.Random(1)
    for i in range(600):
        key = rnd.randrange(60)
        op = rnd.random()
        if op < 0.6:
            cache.put(key, i)
        elif op < 0.8:
            cache.delete(key)
        else:
            cache.get(key)
        assert cache.dirty_count() <= high_watermark_count(cache, high)


@pytest.mark.parametrize("low, high", WATERMARKS)
def test_with_watermarks_flush_writes_at_most_the_high_watermark(low, high):
    backend = CountingMemoryStore()
    cache = WriteBackCache(backend, max_entries=40, low_watermark=low, high_watermark=high)
    rnd = random.Random(2)
    flushes = 0
    for i in range(3000):
        cache.put(rnd.randrange(120), i)
        if i % 37 == 0:
            before = backend.entries_written
            cache.flush()
            flushes += 1
            assert backend.entries_written - before <= math.floor(high * 40)
    assert flushes > 50


@pytest.mark.parametrize("low, high", WATERMARKS)
def test_with_watermarks_flush_to_rocksdb_writes_the_dirty_entries_and_the_write_buffer(make_cache, low, high):
    cache = make_cache("rocksdb", max_entries=40, low_watermark=low, high_watermark=high, write_batch_entries=8)
    rnd = random.Random(3)
    for i in range(1500):
        cache.put(rnd.randrange(120), i)
        if i % 37 == 0:
            stats = cache.stats()
            assert stats["dirty"] <= math.floor(high * 40)
            before = stats["writes"]
            cache.flush()
            assert cache.stats()["writes"] - before <= stats["dirty"] + stats["pending"]
            assert stats["pending"] < 8


def test_reads_keep_dirty_entries_under_the_high_watermark_when_the_capacity_shrinks():
    """A read that loads a large value lowers a byte-bounded capacity; dirty must follow it down."""
    backend = MemoryStore()
    backend.put("big", "x" * 800)
    cache = WriteBackCache(backend, max_bytes=1500, low_watermark=0.25, high_watermark=0.5)
    cache.put(0, 1)
    cache.put(1, 1)
    assert cache.dirty_count() <= high_watermark_count(cache, 0.5)
    cache.get("big")  # the sampled entry size grows: capacity drops to a few entries
    check_bounds(cache, (0.25, 0.5))


def test_watermarks_sync_the_least_recently_modified_first():
    backend = MemoryStore()
    cache = WriteBackCache(backend, max_entries=10, low_watermark=0.2, high_watermark=0.5, sync_step=1)
    for i in range(6):
        cache.put(i, i)  # the 6th put goes above the high watermark (5)
    assert cache.dirty_count() <= 5
    assert 0 in backend
    assert 5 not in backend


def test_above_the_low_watermark_an_eviction_by_a_read_also_syncs(policy):
    cache = WriteBackCache(MemoryStore(), max_entries=10, policy=policy, low_watermark=0.2, high_watermark=0.5, sync_step=1)
    for key in range(4):
        cache.put(key, key)  # 4 dirty: between the low (2) and the high (5) watermark
    for key in range(100, 107):
        cache.get(key)  # the 7th read evicts a dirty entry; 3 dirty > 2: one more is synced
    assert cache.stats()["syncs"] == 1
    assert cache.dirty_count() == 2


def test_a_cache_with_watermarks_is_built_as_the_variant_whose_reads_advance_the_drain():
    from state.cache import WatermarkedWriteBackCache

    sized = WriteBackCache(MemoryStore(), max_entries=20, max_bytes=10_000)
    marked = WriteBackCache(MemoryStore(), max_entries=20, low_watermark=0.25, high_watermark=0.5)
    assert type(sized) is WriteBackCache
    assert type(marked) is WatermarkedWriteBackCache
    assert isinstance(marked, WriteBackCache)


def test_a_cache_without_byte_bound_manager_or_watermarks_is_built_as_the_variant_whose_puts_size_nothing():
    from state.cache import CacheManager, UnsizedWriteBackCache

    assert type(WriteBackCache(MemoryStore(), max_entries=20)) is UnsizedWriteBackCache
    assert type(WriteBackCache(MemoryStore())) is UnsizedWriteBackCache
    assert type(WriteBackCache(MemoryStore(), manager=CacheManager(1 << 20))) is WriteBackCache


def test_a_cache_built_without_a_byte_bound_refuses_one_later_and_says_how_to_get_it():
    cache = WriteBackCache(MemoryStore(), max_entries=20, name="counts")
    cache.put(1, "x")
    with pytest.raises(ValueError, match=r"'counts' was built without a byte bound.*max_bytes=.*max_bytes=2000"):
        cache.resize(max_bytes=2_000)
    assert cache.stats()["max_bytes"] is None
    assert cache.get(1) == "x"
    cache.resize(max_entries=5, max_bytes=None)  # entry bounds still change
    assert cache.capacity == 5


def test_an_unsized_caches_put_after_a_get_updates_the_value_and_marks_it_dirty(tmp_path):
    backend = RocksDBStore(tmp_path / "db")
    backend.put(1, 10)
    cache = WriteBackCache(backend, max_entries=20)
    cache.put(1, cache.get(1) + 1)
    assert cache.dirty_count() == 1
    cache.flush()
    assert backend.get(1) == 11
    cache.close()


def test_after_going_above_the_high_watermark_reads_keep_syncing_down_to_the_low_one(policy):
    cache = WriteBackCache(MemoryStore(), max_entries=20, policy=policy, low_watermark=0.25, high_watermark=0.5, sync_step=1)
    for key in range(11):
        cache.put(key, key)  # the 11th put is above the high watermark (10): 2 synced, 9 dirty, draining
    assert cache.dirty_count() == 9
    for key in range(4):
        cache.get(key)  # hits: each syncs one more
    assert cache.dirty_count() == 5
    cache.get(4)
    assert cache.dirty_count() == 5  # at the low watermark: draining stopped


# ------------------------------------------------------------------ byte bound


def test_byte_bound_holds_with_growing_values(make_backend, backend_kind):
    cache = WriteBackCache(make_backend(backend_kind), max_bytes=20_000)
    rnd = random.Random(4)
    for i in range(1500):
        key = rnd.randrange(300)
        size = rnd.choice([1, 10, 100, 1000, 3000])
        cache.put(key, "v" * size)
        check_bounds(cache, None)
    assert cache.stats()["evictions"] > 0


class CountingSerializer:
    def __init__(self) -> None:
        self.dumps_calls = 0

    def dumps(self, value):
        self.dumps_calls += 1
        return pickle.dumps(value, 5)

    def loads(self, data):
        return pickle.loads(data)


def test_bytes_are_estimated_by_sampling_not_by_sizing_everything():
    sized = []

    def sizer(obj):
        sized.append(obj)
        return deep_sizeof(obj)

    cache = WriteBackCache(MemoryStore(), max_bytes=1 << 20, estimator=MemoryEstimator(sizer=sizer))
    for i in range(10_000):
        cache.put(i, "v" * 50)
    # two sizings (key and value) per sampled entry
    assert 0 < len(sized) <= 2 * 10_000 // 16


@pytest.mark.parametrize(
    "kwargs", [dict(sample_every=0), dict(window=0), dict(entry_overhead=-1), dict(sample_every=1.5)], ids=repr
)
def test_impossible_estimator_configuration_fails_at_construction(kwargs):
    with pytest.raises(ValueError):
        MemoryEstimator(**kwargs)


# ------------------------------------------------------------------ bounds after every operation, deterministic

BOUNDS = {
    "entries1": dict(max_entries=1),
    "entries3": dict(max_entries=3),
    "entries16": dict(max_entries=16),
    "bytes": dict(max_bytes=3000),
    "entries_and_bytes": dict(max_entries=8, max_bytes=3000),
}
WATERMARK_OPTIONS = {"none": None, "quarter-half": (0.25, 0.5), "half-full": (0.5, 1.0)}
VALUES = [0, 1, None, "s", [1, 2], "x" * 400, b"y" * 1500]


@pytest.mark.parametrize("watermarks", list(WATERMARK_OPTIONS), ids=str)
@pytest.mark.parametrize("bound", list(BOUNDS), ids=str)
@pytest.mark.parametrize("policy_", POLICIES)
def test_bounds_hold_after_every_operation(make_backend, backend_kind, bound, policy_, watermarks):
    marks = WATERMARK_OPTIONS[watermarks]
    kwargs = dict(BOUNDS[bound], policy=policy_, write_batch_entries=4)
    if marks:
        kwargs.update(low_watermark=marks[0], high_watermark=marks[1])
    cache = WriteBackCache(make_backend(backend_kind), **kwargs)
    model: dict[int, object] = {}
    rnd = random.Random(f"{bound}-{policy_}-{watermarks}")
    for step in range(250):
        op = rnd.random()
        key = rnd.randrange(24)
        if op < 0.35:
            value = rnd.choice(VALUES)
            cache.put(key, value)
            model[key] = value
        elif op < 0.5:
            cache.delete(key)
            model.pop(key, None)
        elif op < 0.75:
            assert cache.get(key, "absent") == model.get(key, "absent")
        elif op < 0.85:
            keys = [rnd.randrange(24) for _ in range(5)]
            assert cache.get_many(keys, "absent") == [model.get(k, "absent") for k in keys]
        elif op < 0.93:
            pairs = [(rnd.randrange(24), rnd.choice(VALUES)) for _ in range(4)]
            cache.put_many(pairs)
            model.update(pairs)
        elif op < 0.97:
            cache.flush()
        else:
            cache.resize(max_entries=rnd.choice([1, 2, 5, 16]))
        check_bounds(cache, marks)
    assert dict(cache.items()) == {(k,): v for k, v in model.items()}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("bound", [dict(max_entries=4), dict(max_bytes=10_000)], ids=["entries", "bytes"])
def test_a_dropped_cache_is_freed_without_the_cycle_collector(policy, bound):
    import weakref

    cache = WriteBackCache(MemoryStore(), policy=policy, **bound)
    cache.put(1, [1])
    cache.get(1)
    ref = weakref.ref(cache)
    gc.disable()
    try:
        del cache
        assert ref() is None
    finally:
        gc.enable()


def test_a_byte_bound_set_by_resize_is_checked_after_every_put():
    cache = WriteBackCache(MemoryStore(), max_entries=1_000, max_bytes=1_000_000)
    cache.resize(max_bytes=2_000)
    for i in range(200):
        cache.put(i, "x" * 100)
        assert cache.estimated_bytes() <= 2_000 + cache.stats()["entry_bytes"]


# ------------------------------------------------------------------ deletes of keys never read again
@pytest.mark.parametrize("backend_kind", ["memory", "rocksdb"])
def test_delete_uncached_removes_the_keys_from_cache_and_backend_and_keeps_no_entry(tmp_path, backend_kind):
    backend = MemoryStore() if backend_kind == "memory" else RocksDBStore(tmp_path / "db")
    cache = WriteBackCache(backend, max_entries=100)
    try:
        cache.put_many((k, k) for k in range(10))
        cache.flush()
        cache.put(3, "dirty")  # a dirty entry deleted before it was written
        cache.put(20, "new")  # and one the backend never had
        cache.delete_uncached([1, 3, 20, 99])  # 99: in neither
        assert len(cache) == 8  # 0, 2, 4..9 remain cached; none of the deleted keys is
        assert cache.get_many([1, 3, 20, 99]) == [None] * 4  # read back before a flush: gone
        cache.flush()
        assert [backend.get(k) for k in (1, 3, 20)] == [None, None, None]
        assert backend.get(2) == 2
    finally:
        cache.close()


@pytest.mark.parametrize("backend_kind", ["memory", "rocksdb"])
def test_pop_many_returns_the_values_deletes_them_and_caches_none_of_them(tmp_path, backend_kind):
    backend = MemoryStore() if backend_kind == "memory" else RocksDBStore(tmp_path / "db")
    cache = WriteBackCache(backend, max_entries=4)
    try:
        cache.put_many((k, f"v{k}") for k in range(10))  # 0..5 evicted towards the backend, 6..9 cached
        cache.put(8, "dirty")
        assert cache.pop_many([1, 7, 8, 99], default="-") == ["v1", "v7", "dirty", "-"]
        assert len(cache) == 2  # 6 and 9: nothing read was inserted, nothing live pushed out
        assert cache.get_many([1, 7, 8]) == [None] * 3
        cache.flush()
        assert [backend.get(k) for k in (1, 7, 8)] == [None, None, None]
        assert backend.get(2) == "v2"
    finally:
        cache.close()


def test_pop_many_refuses_repeated_keys_before_deleting_anything():
    cache = WriteBackCache(MemoryStore(), max_entries=10)
    cache.put(1, "a")
    with pytest.raises(ValueError, match="distinct"):
        cache.pop_many([1, 1])
    assert cache.get(1) == "a"
