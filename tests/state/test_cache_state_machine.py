"""The cache over a store behaves exactly like a dict, whatever the bounds, policy and watermarks.

A hypothesis RuleBasedStateMachine drives a WriteBackCache over a MemoryStore
and over a RocksDBStore with random get, put, delete, get_many, put_many,
delete_many, ``in``, items(), flush() and resizes (by hand, and by a
CacheManager whose probe alternates high and low memory pressure), and
compares every answer with a plain dict. Keys come from a small pool of
spellings (ints, np.int64, floats, bools, str, bytes, tuples, dates) so that
collisions and near-collisions (1, 1.0, True; "a", b"a") happen all the time.
After every step the bounds must hold; at the end the store itself must hold
exactly the dict (for RocksDB, after close and reopen).

Each configuration is its own TestCase, made by ``_make_test_case``.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
from typing import Any

from hypothesis import HealthCheck
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from state import CacheManager, MemoryReading, MemoryStore, RocksDBStore, StoreLockedError, WriteBackCache

from .helpers import KEY_POOL, check_bounds, expected_items, hsettings, state_values, typed_items

# examples x steps per configuration (each RocksDB example opens, closes and reopens a database).
BUDGET = {"memory": (20, 50), "rocksdb": (8, 40)}

BOUNDS: dict[str, dict[str, Any]] = {
    "entries1": dict(max_entries=1),
    "entries3": dict(max_entries=3),
    "entries16": dict(max_entries=16),
    "bytes": dict(max_bytes=2500),
    "manager": {},  # a CacheManager grants max_bytes and resizes it
}
POLICIES = ["lru", "clock", "lfu"]
WATERMARKS: dict[str, tuple[float, float] | None] = {
    "nowm": None,
    "wm25_50": (0.25, 0.5),
    "wm50_100": (0.5, 1.0),
}

keys = st.sampled_from(KEY_POOL)
_ABSENT = object()


class AlternatingProbe:
    """Memory readings that alternate high and low pressure (and sometimes normal)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> MemoryReading:
        self.calls += 1
        rss = (95, 10, 95, 70, 10)[self.calls % 5]
        return MemoryReading(rss_bytes=rss, limit_bytes=100, gc_time_share=0.0)


class CacheIsADict(RuleBasedStateMachine):
    backend_kind = "memory"
    bound = "entries3"
    policy = "lru"
    watermarks: tuple[float, float] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[str, Any] = {}
        self.cache: WriteBackCache | None = None
        self.manager: CacheManager | None = None
        self.path: str | None = None
        # Under a CacheManager, a second cache competes for the same budget.
        self.neighbour: WriteBackCache | None = None
        self.neighbour_model: dict[str, Any] = {}

    # ------------------------------------------------------------ setup
    @initialize(write_batch_entries=st.sampled_from([1, 3, 256]), sync_step=st.sampled_from([1, 3]))
    def open_cache(self, write_batch_entries: int, sync_step: int) -> None:
        if self.backend_kind == "rocksdb":
            self.path = tempfile.mkdtemp(prefix="opbuffer-state-machine-")
            backend: Any = RocksDBStore(self.path, max_parallelism=16)
        else:
            backend = MemoryStore()
        kwargs: dict[str, Any] = dict(
            BOUNDS[self.bound], policy=self.policy, write_batch_entries=write_batch_entries, sync_step=sync_step
        )
        if self.watermarks is not None:
            kwargs.update(low_watermark=self.watermarks[0], high_watermark=self.watermarks[1])
        if self.bound == "manager":
            self.manager = CacheManager(
                8 * 1024,
                block_bytes=1024,
                probe=AlternatingProbe(),
                min_interval_s=0.0,
                check_every=7,
                caches_per_step=1,
            )
            kwargs["manager"] = self.manager
        self.cache = WriteBackCache(backend, **kwargs)
        if self.manager is not None:
            self.neighbour = WriteBackCache(MemoryStore(), manager=self.manager, name="neighbour", policy=self.policy)

    # ------------------------------------------------------------ reads
    @rule(entry=keys)
    def get(self, entry):
        key, identity = entry
        assert self.cache.get(key, _ABSENT) == self.model.get(identity, _ABSENT)

    @rule(entry=keys)
    def get_with_none_default(self, entry):
        key, identity = entry
        assert self.cache.get(key) == self.model.get(identity)

    @rule(entry=keys)
    def contains(self, entry):
        key, identity = entry
        assert (key in self.cache) == (identity in self.model)

    @rule(entries=st.lists(keys, max_size=6))
    def get_many(self, entries):
        got = self.cache.get_many([key for key, _ in entries], default=_ABSENT)
        assert got == [self.model.get(identity, _ABSENT) for _, identity in entries]

    @rule()
    def items(self):
        assert typed_items(self.cache.items()) == expected_items(self.model)

    # ------------------------------------------------------------ writes
    @rule(entry=keys, value=state_values)
    def put(self, entry, value):
        key, identity = entry
        self.cache.put(key, value)
        self.model[identity] = value

    @rule(entry=keys)
    def delete(self, entry):
        key, identity = entry
        self.cache.delete(key)
        self.model.pop(identity, None)

    @rule(pairs=st.lists(st.tuples(keys, state_values), max_size=6))
    def put_many(self, pairs):
        self.cache.put_many([(key, value) for (key, _), value in pairs])
        for (_, identity), value in pairs:
            self.model[identity] = value

    @rule(entries=st.lists(keys, max_size=4))
    def delete_many(self, entries):
        self.cache.delete_many([key for key, _ in entries])
        for _, identity in entries:
            self.model.pop(identity, None)

    @rule()
    def flush(self):
        self.cache.flush()
        assert self.cache.dirty_count() == 0
        assert self.cache.stats()["pending"] == 0

    # ------------------------------------------------------------ resizing
    @rule(max_entries=st.sampled_from([1, 2, 3, 8, 16]))
    def resize_entries(self, max_entries):
        self.cache.resize(max_entries=max_entries)
        assert self.cache.stats()["max_entries"] == max_entries

    @precondition(lambda self: self.bound in ("bytes", "manager"))
    @rule()
    def drop_entry_bound(self):
        self.cache.resize(max_entries=None)

    @precondition(lambda self: self.bound == "bytes")
    @rule(max_bytes=st.sampled_from([300, 1000, 2500, 8000]))
    def resize_bytes(self, max_bytes):
        self.cache.resize(max_bytes=max_bytes)

    @precondition(lambda self: self.manager is not None)
    @rule()
    def rebalance(self):
        self.manager.rebalance()
        granted = sum(e["granted_bytes"] for e in self.manager.stats()["caches"].values())
        assert granted <= self.manager.max_bytes
        assert self.cache.stats()["max_bytes"] == self.manager.blocks_of(self.cache) * 1024

    @precondition(lambda self: self.neighbour is not None)
    @rule(entry=keys, value=state_values, read=keys)
    def neighbour_works_too(self, entry, value, read):
        key, identity = entry
        self.neighbour.put(key, value)
        self.neighbour_model[identity] = value
        key, identity = read
        assert self.neighbour.get(key, _ABSENT) == self.neighbour_model.get(identity, _ABSENT)

    # ------------------------------------------------------------ after every step
    @invariant()
    def bounds_hold(self):
        if self.cache is not None:
            check_bounds(self.cache, self.watermarks)
        if self.neighbour is not None:
            check_bounds(self.neighbour, None)
            granted = sum(e["granted_bytes"] for e in self.manager.stats()["caches"].values())
            assert granted <= self.manager.max_bytes

    # ------------------------------------------------------------ the store holds exactly the dict
    def teardown(self):
        try:
            if self.cache is None:
                return
            if self.neighbour is not None:
                assert typed_items(self.neighbour.items()) == expected_items(self.neighbour_model)
            self.cache.flush()
            expected = expected_items(self.model)
            if self.backend_kind == "memory":
                assert typed_items(self.cache.backend.items()) == expected
                self.cache.close()
                return
            self.cache.close()
            self.cache = None
            try:
                reopened = RocksDBStore(self.path, max_parallelism=16)
            except StoreLockedError:
                # close() not releasing the LOCK while the closed objects live is a bug of its own
                # (test_rocksdb.py::test_a_closed_store_releases_its_lock); here only the data is checked.
                gc.collect()
                reopened = RocksDBStore(self.path, max_parallelism=16)
            try:
                assert typed_items(reopened.items()) == expected
            finally:
                reopened.close()
        finally:
            if self.manager is not None:
                self.manager.close()
            if self.path is not None:
                del self.cache
                shutil.rmtree(self.path, ignore_errors=True)


def _configurations() -> list[tuple[str, str, str, str]]:
    """Every bound with every policy on both backends; watermarks in a Latin square, so each
    (bound, watermarks) and each (policy, watermarks) pair runs on each backend."""
    configs = []
    marks = list(WATERMARKS)
    for backend_kind in ("memory", "rocksdb"):
        for b, bound in enumerate(BOUNDS):
            for p, policy in enumerate(POLICIES):
                configs.append((backend_kind, bound, policy, marks[(b + p) % len(marks)]))
    return configs


def _make_test_case(backend_kind: str, bound: str, policy: str, marks: str):
    name = f"{backend_kind}_{bound}_{policy}_{marks}"
    machine = type(
        f"CacheIsADict_{name}",
        (CacheIsADict,),
        dict(backend_kind=backend_kind, bound=bound, policy=policy, watermarks=WATERMARKS[marks]),
    )
    test_case = machine.TestCase
    max_examples, steps = BUDGET[backend_kind]
    test_case.settings = hsettings(
        max_examples=max_examples,
        stateful_step_count=steps,
        suppress_health_check=list(HealthCheck),
    )
    test_case.__name__ = test_case.__qualname__ = f"TestCacheIsADict_{name}"
    return test_case


for _config in _configurations():
    _case = _make_test_case(*_config)
    globals()[_case.__name__] = _case
del _config, _case
