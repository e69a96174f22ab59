"""CacheManager: one byte budget for every cache of a process, resized under memory pressure."""

from __future__ import annotations

import gc

import pytest

from state import CacheManager, MemoryReading, MemoryStore, WriteBackCache

from .helpers import Probe, check_bounds

BLOCK = 1024


def _manager(blocks: int = 64, probe: Probe | None = None, **kwargs) -> CacheManager:
    kwargs.setdefault("min_interval_s", 0.0)
    return CacheManager(blocks * BLOCK, block_bytes=BLOCK, probe=probe or Probe(), **kwargs)


def _blocks(manager: CacheManager, *caches: WriteBackCache) -> list[int]:
    return [manager.blocks_of(c) for c in caches]


def _granted_total(manager: CacheManager) -> int:
    return sum(entry["granted_bytes"] for entry in manager.stats()["caches"].values())


_fresh_keys = iter(range(10**6, 10**9))


def _make_loads(cache: WriteBackCache, n: int) -> None:
    """n reads that each load a value from the backend (misses on keys the backend holds)."""
    keys = [("loaded", next(_fresh_keys)) for _ in range(n)]
    cache.backend.put_many((k, 1) for k in keys)
    loads = cache.stats()["loads"]
    for key in keys:
        cache.get(key)
    assert cache.stats()["loads"] == loads + n


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((0,), {}),
        ((-1,), {}),
        ((True,), {}),
        ((1.5,), {}),
        ((1 << 20,), dict(block_bytes=0)),
        ((1 << 20,), dict(block_bytes=(1 << 20) + 1)),
        ((1 << 20,), dict(low_pressure=0.9, high_pressure=0.8)),
        ((1 << 20,), dict(low_pressure=0.8, high_pressure=0.8)),
        ((1 << 20,), dict(low_pressure=0.0)),
        ((1 << 20,), dict(shrink_fraction=0.0)),
        ((1 << 20,), dict(shrink_fraction=1.5)),
        ((1 << 20,), dict(memory_limit=0)),
        ((1 << 20,), dict(check_every=0)),
        ((1 << 20,), dict(caches_per_step=0)),
    ],
    ids=lambda v: repr(v),
)
def test_impossible_manager_configuration_fails_at_construction(args, kwargs):
    with pytest.raises(ValueError):
        CacheManager(*args, probe=Probe(), **kwargs)


def test_a_cache_with_a_manager_may_use_watermarks_without_its_own_bound():
    manager = _manager()
    cache = WriteBackCache(MemoryStore(), manager=manager, low_watermark=0.25, high_watermark=0.5)
    for i in range(200):
        cache.put(i, "v" * 50)
        check_bounds(cache, (0.25, 0.5))
    assert cache.capacity is not None


# ------------------------------------------------------------------ the budget


def test_registered_caches_share_the_budget_equally():
    manager = _manager(64)
    a = WriteBackCache(MemoryStore(), manager=manager, name="a")
    assert _blocks(manager, a) == [64]
    b = WriteBackCache(MemoryStore(), manager=manager, name="b")
    assert _blocks(manager, a, b) == [32, 32]
    assert a.stats()["max_bytes"] == 32 * BLOCK
    assert b.stats()["max_bytes"] == 32 * BLOCK


def test_registering_a_cache_built_without_a_byte_bound_is_refused_before_any_share_changes():
    manager = _manager(64)
    a = WriteBackCache(MemoryStore(), manager=manager, name="a")
    unsized = WriteBackCache(MemoryStore(), max_entries=10, name="counts")
    with pytest.raises(ValueError, match=r"'counts' was built without a byte bound or a manager.*manager="):
        manager.register(unsized)
    assert _blocks(manager, a) == [64]
    assert a.stats()["max_bytes"] == 64 * BLOCK
    assert unsized.stats()["max_bytes"] is None
    assert not unsized.sized and a.sized


def test_granted_bytes_never_exceed_max_bytes_when_more_caches_than_blocks_register():
    manager = _manager(2)
    caches = []
    for i in range(4):
        try:
            caches.append(WriteBackCache(MemoryStore(), manager=manager, name=f"c{i}"))
        except ValueError:
            pass  # refusing a cache the budget cannot hold is acceptable; over-granting is not
        assert _granted_total(manager) <= manager.max_bytes
        assert manager.free_blocks >= 0


def test_granted_bytes_never_exceed_max_bytes_through_rebalances():
    probe = Probe()
    manager = _manager(32, probe)
    caches = [WriteBackCache(MemoryStore(), manager=manager, name=f"c{i}") for i in range(3)]
    for round_ in range(12):
        probe.level = ["high", "low", "normal", "high", "low"][round_ % 5]
        _make_loads(caches[round_ % 3], 5 + round_)
        manager.rebalance()
        assert _granted_total(manager) <= manager.max_bytes
        for cache in caches:
            assert cache.stats()["max_bytes"] == manager.blocks_of(cache) * BLOCK
            check_bounds(cache, None)


def test_closing_a_cache_returns_its_blocks():
    manager = _manager(64)
    a = WriteBackCache(MemoryStore(), manager=manager, name="a")
    b = WriteBackCache(MemoryStore(), manager=manager, name="b")
    assert manager.free_blocks == 0
    b.close()
    assert manager.free_blocks == 32
    assert list(manager.stats()["caches"]) == ["a"]
    assert _blocks(manager, a) == [32]


def test_a_cache_registered_directly_is_attached_and_detached_as_one_built_with_the_manager():
    manager = _manager(64)
    cache = WriteBackCache(MemoryStore(), max_bytes=1 << 20, name="direct")
    assert cache.stats()["granted_bytes"] is None
    manager.register(cache)
    assert cache.stats()["granted_bytes"] == 64 * BLOCK == cache.stats()["max_bytes"]
    cache.close()
    assert not manager.stats()["caches"] and manager.free_blocks == 64


# ------------------------------------------------------------------ pressure


def test_pressure_levels_follow_the_probe():
    probe = Probe()
    manager = _manager(8, probe)
    for level in ("high", "normal", "low"):
        probe.level = level
        assert manager.pressure() == level
    busy_gc = MemoryReading(rss_bytes=10, limit_bytes=100, gc_time_share=0.5)
    assert manager.pressure(busy_gc) == "high"


def test_high_pressure_shrinks_the_largest_cache():
    probe = Probe()
    manager = _manager(64, probe, caches_per_step=1)
    a = WriteBackCache(MemoryStore(), manager=manager, name="a")
    b = WriteBackCache(MemoryStore(), manager=manager, name="b")
    c = WriteBackCache(MemoryStore(), manager=manager, name="c")
    sizes = _blocks(manager, a, b, c)
    largest = max(range(3), key=lambda i: sizes[i])
    assert sizes.count(sizes[largest]) == 1, sizes  # the setup gives one cache more blocks than the others
    probe.level = "high"
    assert manager.rebalance()
    after = _blocks(manager, a, b, c)
    for i in range(3):
        if i == largest:
            assert after[i] < sizes[i]
        else:
            assert after[i] == sizes[i]


def test_high_pressure_shrinks_the_cache_with_the_fewest_loads():
    probe = Probe()
    manager = _manager(64, probe, caches_per_step=1)
    busy = WriteBackCache(MemoryStore(), manager=manager, name="busy")  # registered first: wins ties
    idle = WriteBackCache(MemoryStore(), manager=manager, name="idle")
    assert _blocks(manager, busy, idle) == [32, 32]
    _make_loads(busy, 50)
    probe.level = "high"
    assert manager.rebalance()
    assert _blocks(manager, busy, idle) == [32, 24]
    assert manager.stats()["shrinks"] == 1


def test_low_pressure_grows_the_cache_that_loads():
    probe = Probe()
    manager = _manager(64, probe, caches_per_step=1)
    idle = WriteBackCache(MemoryStore(), manager=manager, name="idle")
    busy = WriteBackCache(MemoryStore(), manager=manager, name="busy")
    probe.level = "high"
    manager.rebalance()
    manager.rebalance()
    before = _blocks(manager, idle, busy)
    assert manager.free_blocks > 0
    _make_loads(busy, 50)
    probe.level = "low"
    assert manager.rebalance()
    after = _blocks(manager, idle, busy)
    assert after[1] > before[1]
    assert after[0] == before[0]
    assert busy.stats()["max_bytes"] == after[1] * BLOCK
    assert manager.stats()["grows"] >= 1


def test_normal_pressure_changes_nothing():
    probe = Probe("normal")
    manager = _manager(64, probe)
    a = WriteBackCache(MemoryStore(), manager=manager, name="a")
    _make_loads(a, 10)
    assert not manager.rebalance()
    assert _blocks(manager, a) == [64]


def test_shrinking_evicts_the_cache_down_to_its_new_budget():
    probe = Probe()
    manager = _manager(16, probe, caches_per_step=1)
    cache = WriteBackCache(MemoryStore(), manager=manager, name="a")
    cache.put_many((i, "v" * 100) for i in range(500))
    check_bounds(cache, None)
    full = len(cache)
    probe.level = "high"
    for _ in range(4):
        manager.rebalance()
        check_bounds(cache, None)
    assert len(cache) < full
    assert cache.get_many(range(500)) == ["v" * 100] * 500


def test_caches_ask_for_a_rebalance_every_check_every_inserts():
    probe = Probe("normal")
    manager = _manager(8, probe, check_every=10)
    cache = WriteBackCache(MemoryStore(), manager=manager, name="a")
    calls = probe.calls
    for i in range(30):
        cache.put(i, i)
    assert probe.calls - calls == 3


def test_maybe_rebalance_waits_min_interval():
    probe = Probe("high")
    manager = _manager(8, probe, min_interval_s=3600.0)
    cache = WriteBackCache(MemoryStore(), manager=manager, name="a")
    assert manager.rebalance()
    assert not manager.maybe_rebalance()
    assert manager.stats()["rebalances"] == 1
    assert manager.blocks_of(cache) == 6


def test_manager_stats_report_every_cache():
    manager = _manager(64)
    a = WriteBackCache(MemoryStore(), manager=manager, name="a")
    b = WriteBackCache(MemoryStore(), manager=manager, name="b")
    a.put(1, 1)
    a.get(1)
    b.get(2)
    manager.rebalance()
    stats = manager.stats()
    assert set(stats["caches"]) == {"a", "b"}
    for name, cache in (("a", a), ("b", b)):
        entry = stats["caches"][name]
        for key in ("hits", "misses", "hit_ratio", "loads", "evictions", "dirty", "entries", "syncs"):
            assert entry[key] == cache.stats()[key]
        assert entry["blocks"] == manager.blocks_of(cache)
        assert entry["granted_bytes"] == entry["blocks"] * BLOCK
    assert stats["caches"]["a"]["hits"] == 1
    assert stats["caches"]["b"]["misses"] == 1
    assert stats["max_bytes"] == 64 * BLOCK
    assert stats["free_blocks"] == 0
    assert stats["rebalances"] == 1


# ------------------------------------------------------------------ the real probe


def test_real_probe_with_a_memory_limit_below_rss_reports_high_pressure_and_shrinks():
    manager = CacheManager(64 * BLOCK, block_bytes=BLOCK, memory_limit=1, min_interval_s=0.0)
    try:
        cache = WriteBackCache(MemoryStore(), manager=manager, name="a")
        assert manager.pressure() == "high"
        reading = manager.last_reading
        assert reading is not None and reading.rss_bytes > 1 and reading.limit_bytes == 1
        before = manager.blocks_of(cache)
        assert manager.rebalance()
        assert manager.blocks_of(cache) < before
        assert cache.stats()["max_bytes"] == manager.blocks_of(cache) * BLOCK
        assert manager.stats()["rss_bytes"] > 0
    finally:
        manager.close()


def test_closing_a_manager_removes_its_gc_callback():
    callbacks = len(gc.callbacks)
    manager = CacheManager(64 * BLOCK, block_bytes=BLOCK)
    assert len(gc.callbacks) == callbacks + 1
    manager.close()
    assert len(gc.callbacks) == callbacks
