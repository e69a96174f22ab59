"""The cache's memory bound is a bound on the process: no leaks, sizes of live objects, one policy per cache."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
import tracemalloc
import weakref

import pytest

from state import CachePolicy, ClockPolicy, LFUPolicy, LRUPolicy, MemoryStore, RocksDBStore, WriteBackCache
from state.cache.estimator import MemoryEstimator, deep_sizeof

from .conftest import POLICIES


class Payload:
    """A value that can be weakly referenced."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __reduce__(self):
        return (Payload, (self.n,))


# ---------------------------------------------------------------- no leaks
@pytest.mark.parametrize("policy", POLICIES)
def test_an_evicted_value_written_and_deleted_from_the_store_is_freed(policy, tmp_path):
    store = RocksDBStore(tmp_path / "db")
    cache = WriteBackCache(store, max_entries=2, policy=policy)
    value = Payload(7)
    ref = weakref.ref(value)
    cache.put("victim", value)
    del value
    for i in range(5):  # evicts "victim": it is written to the store
        cache.put(f"other-{i}", Payload(i))
    cache.flush()
    store.delete("victim")
    gc.collect()
    assert ref() is None
    cache.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_evicting_a_million_entries_leaves_no_python_objects_behind(policy):
    cache = WriteBackCache(MemoryStore(), max_entries=1_000, policy=policy)
    backend_writes = []
    for i in range(2_000):
        cache.put(i, i)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(2_000, 200_000):
            cache.put(i, i)
            if i % 1000 == 0:
                cache.backend.delete_many(range(i - 1000, i - 999))  # keep the backend small too
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del backend_writes
    # What the backend holds grows with the keys written; per evicted entry the cache itself keeps nothing.
    backend = len(cache.backend)
    assert grown < 1_000 * 1_000 + backend * 200, (grown, backend)


# ---------------------------------------------------------------- sizes of live objects
MAKERS = {
    "int": lambda i: 1_000_000 + i,
    "str": lambda i: f"user-{i:08d}",
    "tuple": lambda i: ("a", 1_000_000 + i, i + 0.5),
    "dict": lambda i: {"k": 1_000_000 + i, "l": [i, i + 1, i + 2]},
    "10 KB bytes": lambda i: i.to_bytes(4, "little") * 2_560,
    "nested list": lambda i: [[i, i + 1], [i + 2]],
}


@pytest.mark.parametrize("kind", MAKERS)
def test_deep_sizeof_is_close_to_what_tracemalloc_sees_and_errs_high(kind):
    """Never much below what the objects take (the bound would leak); above it where objects are shared."""
    make = MAKERS[kind]
    n = 2_000
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        values = [make(i) for i in range(n)]
        traced = (tracemalloc.get_traced_memory()[0] - before - sys.getsizeof(values)) / n
    finally:
        tracemalloc.stop()
    sized = sum(deep_sizeof(v) for v in values) / n
    assert 0.75 * traced <= sized <= 1.5 * traced, (sized, traced)


def test_a_large_container_is_sized_from_a_sample_scaled_to_its_length():
    big = [str(i) * 3 for i in range(100_000)]
    exact = sys.getsizeof(big) + sum(sys.getsizeof(s) for s in big)
    assert 0.9 * exact <= deep_sizeof(big) <= 1.1 * exact


def test_the_byte_bound_counts_small_values_by_their_memory_not_their_pickle():
    cache = WriteBackCache(MemoryStore(), max_bytes=1 << 20)
    for i in range(100_000):
        cache.put(i, i)
    # A pickled small int is ~5 bytes; in memory an entry costs its key, value and the cache's slots.
    assert cache.stats()["entry_bytes"] >= 150
    assert len(cache) <= (1 << 20) // 150


def _rss_growth_script(policy: str, keys: int, max_bytes: int) -> str:
    return textwrap.dedent(
        f"""
        import gc, json, tempfile
        from state import CacheManager, RocksDBStore, WriteBackCache
        from state.cache import current_rss_bytes
        store = RocksDBStore(tempfile.mkdtemp(), block_cache_bytes=4 << 20)
        if {policy!r} == "manager":
            manager = CacheManager({max_bytes}, memory_limit=64 << 30)
            caches = [WriteBackCache(store.table(f"t{{i}}"), manager=manager) for i in range(4)]
        elif {policy!r} in ("key_group", "key_group_manager"):
            from state.blocks import KeyGroupCache
            if {policy!r} == "key_group":
                caches = [KeyGroupCache(store, max_bytes={max_bytes})]
            else:  # a runner's memory_budget: the instances of a worker share one manager
                manager = CacheManager({max_bytes}, memory_limit=64 << 30)
                caches = [KeyGroupCache(store.table(f"t{{i}}"), manager=manager) for i in range(4)]
            gc.collect()
            base = peak = current_rss_bytes()
            for n, start in enumerate(range(0, {keys}, 4096)):  # as an aggregate's merges write: many keys at a time
                cache = caches[n % len(caches)]
                cache.put_many((i, (i, "v" * 20)) for i in range(start, min({keys}, start + 4096)))
                peak = max(peak, current_rss_bytes())
            print(json.dumps({{"growth": peak - base}}))
            raise SystemExit
        else:
            caches = [WriteBackCache(store, max_bytes={max_bytes}, policy={policy!r})]
        gc.collect()
        base = peak = current_rss_bytes()
        for i in range({keys}):
            caches[i % len(caches)].put(i, (i, "v" * 20))
            if i % 10_000 == 0:
                peak = max(peak, current_rss_bytes())
        peak = max(peak, current_rss_bytes())
        print(json.dumps({{"growth": peak - base}}))
        """
    )


@pytest.mark.slow
@pytest.mark.parametrize("policy", [*POLICIES, "manager"])
def test_rss_grows_at_most_twice_max_bytes_with_many_more_keys_than_fit(policy):
    max_bytes = 16 << 20
    done = subprocess.run(
        [sys.executable, "-c", _rss_growth_script(policy, 600_000, max_bytes)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    growth = json.loads(done.stdout.strip().splitlines()[-1])["growth"]
    assert growth <= 2 * max_bytes, f"RSS grew {growth / 2**20:.1f} MB for a {max_bytes / 2**20:.0f} MB bound"


@pytest.mark.slow
@pytest.mark.parametrize("bound", ["key_group", "key_group_manager"])
def test_rss_of_key_group_blocks_grows_at_most_twice_max_bytes_with_more_keys_than_fit(bound):
    """cached_state(layout="key_group"): every batch touches every key group of a state about three
    times the bound (the layout's worst case), loading and writing back whole key groups; with a
    manager, four caches share the bytes (a runner's memory_budget)."""
    max_bytes = 16 << 20
    done = subprocess.run(
        [sys.executable, "-c", _rss_growth_script(bound, 300_000, max_bytes)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    growth = json.loads(done.stdout.strip().splitlines()[-1])["growth"]
    assert growth <= 2 * max_bytes, f"RSS grew {growth / 2**20:.1f} MB for a {max_bytes / 2**20:.0f} MB bound"


# ---------------------------------------------------------------- one policy per cache
@pytest.mark.parametrize("cls", [LRUPolicy, ClockPolicy, LFUPolicy])
def test_a_policy_class_gives_each_cache_its_own_policy(cls):
    first = WriteBackCache(MemoryStore(), max_entries=2, policy=cls)
    second = WriteBackCache(MemoryStore(), max_entries=2, policy=cls)
    assert isinstance(first.policy, cls) and first.policy is not second.policy


def test_a_policy_factory_gives_each_cache_its_own_policy():
    first = WriteBackCache(MemoryStore(), max_entries=2, policy=lambda: LFUPolicy(max_count=8))
    second = WriteBackCache(MemoryStore(), max_entries=2, policy=lambda: LFUPolicy(max_count=8))
    assert first.policy is not second.policy


def test_a_policy_instance_owned_by_another_cache_is_refused():
    shared = ClockPolicy()
    owner = WriteBackCache(MemoryStore(), max_entries=2, policy=shared)
    with pytest.raises(ValueError, match="pass the policy class or a factory"):
        WriteBackCache(MemoryStore(), max_entries=2, policy=shared)
    assert owner.policy is shared


def test_a_factory_that_returns_no_policy_is_refused_naming_it():
    with pytest.raises(TypeError, match="not a CachePolicy"):
        WriteBackCache(MemoryStore(), max_entries=2, policy=lambda: "lru")


def test_two_caches_with_policies_of_one_class_keep_their_own_entries():
    first = WriteBackCache(MemoryStore(), max_entries=2, policy=ClockPolicy)
    second = WriteBackCache(MemoryStore(), max_entries=2, policy=ClockPolicy)
    for i in range(10):
        first.put(i, i)
        second.put(i + 100, i)
    assert dict(first.items()) == {(i,): i for i in range(10)}
    assert dict(second.items()) == {(i + 100,): i for i in range(10)}


# ---------------------------------------------------------------- one class, chosen at construction
@pytest.mark.parametrize("policy", POLICIES)
def test_the_cache_keeps_its_class_whatever_its_bounds_become(policy):
    cache = WriteBackCache(MemoryStore(), max_entries=10, max_bytes=1_000_000, policy=policy)
    cache.resize(max_bytes=10_000)
    cache.resize(max_entries=None)
    cache.put(1, 1)
    assert type(cache) is WriteBackCache


def test_a_custom_policy_owns_its_table():
    class FIFOPolicy(CachePolicy):
        name = "fifo"

        def __init__(self) -> None:
            super().__init__()
            self.table = {}
            self.insert = self.table.__setitem__

        def remove(self, key):
            return self.table.pop(key)

        def evict(self):
            key = next(iter(self.table))
            return key, self.table.pop(key)

        def items(self):
            return iter(self.table.items())

        def clear(self):
            self.table.clear()

        @property
        def hits(self):
            return 0

    cache = WriteBackCache(MemoryStore(), max_entries=2, policy=FIFOPolicy)
    cache.put(0, 0)
    cache.put(1, 1)
    cache.get(0)  # FIFO: an access does not save the oldest entry
    cache.put(2, 2)
    assert {k for k, _ in cache.policy.items()} == {1, 2}
    assert dict(cache.items()) == {(0,): 0, (1,): 1, (2,): 2}


def test_an_estimator_given_with_its_own_overhead_keeps_it():
    estimator = MemoryEstimator(entry_overhead=10)
    WriteBackCache(MemoryStore(), max_bytes=1000, estimator=estimator)
    assert estimator.entry_overhead == 10
