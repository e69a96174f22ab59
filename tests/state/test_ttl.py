"""The ExpiryIndex contract (state/ttl.py): Spark's TTL rule, the table as the record, sweeps that visit only what expires."""

from __future__ import annotations

import math

import pytest

from state import MemoryStore, normalize_key
from state.ttl import ExpiryIndex, check_ttl_ms, expiry_for, is_expired

from .helpers import CountingMemoryStore


class ScanCountingStore(CountingMemoryStore):
    """A CountingMemoryStore that also counts the entries its full scans yield."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.entries_scanned = 0

    def _iter_items(self):  # type: ignore[override]
        for item in super()._iter_items():
            self.entries_scanned += 1
            yield item


def test_an_update_expires_ttl_ms_after_the_batch_processing_time():
    assert expiry_for(1_000, 250) == 1_250


def test_state_is_expired_once_processing_time_reaches_its_expiry_as_in_spark():
    # Spark's StateTTL.isExpired: batchTimestampMs >= expirationMs
    assert not is_expired(1_250, 1_249)
    assert is_expired(1_250, 1_250)
    assert is_expired(1_250, 1_251)


def test_a_key_is_expired_from_its_expiry_on_and_a_key_without_expiry_never(store):
    index = ExpiryIndex(store)
    index.set("a", 100)
    assert (index.expired("a", 99), index.expired("a", 100)) == (False, True)
    assert not index.expired("b", 10**12)
    assert index.expires_at("a") == 100 and index.expires_at("b") is None


def test_setting_a_key_again_moves_its_expiry(store):
    index = ExpiryIndex(store)
    index.set("a", 100)
    index.set("a", 300)
    assert index.expires_at("a") == 300
    assert index.due(299) == []
    assert index.due(300) == ["a"]
    assert dict(store.items()) == {("a",): 300}


def test_due_lists_the_expired_keys_earliest_expiry_first_and_keeps_them(store):
    index = ExpiryIndex(store)
    index.set_many([("late", 30), ("early", 10), ("middle", 20), ("never", 1_000)])
    assert index.due(25) == ["early", "middle"]
    assert index.due(30) == ["early", "middle", "late"]
    assert len(index) == 4


def test_pop_due_removes_exactly_the_expired_keys_from_index_and_table(store):
    index = ExpiryIndex(store)
    index.set_many([(k, 10 * k) for k in range(10)])
    assert index.pop_due(35) == [0, 1, 2, 3]
    assert sorted(k for k, _ in index.items()) == [4, 5, 6, 7, 8, 9]
    assert dict(store.items()) == {(k,): 10 * k for k in range(4, 10)}
    assert index.pop_due(35) == []


def test_remove_forgets_the_expiry_in_index_and_table(store):
    index = ExpiryIndex(store)
    index.set_many([("a", 10), ("b", 10)])
    index.remove("a")
    index.remove_many(["b", "never-set"])
    assert len(index) == 0 and index.due(10**12) == []
    assert list(store.items()) == []


def test_the_table_records_every_expiry_so_reload_rebuilds_the_index(store):
    index = ExpiryIndex(store)
    index.set_many([(k, 100 + k % 3) for k in range(30)])
    index.remove(4)
    index.set(5, 500)
    index.pop_due(100)
    rebuilt = ExpiryIndex(store)  # a restore writes the table, then the index is rebuilt from it
    assert dict(rebuilt.items()) == dict(index.items())
    assert rebuilt.due(10**12) == sorted(rebuilt.due(10**12), key=rebuilt.expires_at)
    store.put(99, 7)  # what a restore would write under the same index
    index.reload()
    assert index.pop_due(7) == [99]


def test_a_sweep_touches_only_the_expired_keys_however_large_the_state():
    table = ScanCountingStore()
    index = ExpiryIndex(table)
    index.set_many((k, 5_000 + k) for k in range(20_000))  # 20,000 keys that do not expire yet
    index.set_many((("soon", i), 100 + i) for i in range(7))
    writes_before, scanned_before = table.entries_written, table.entries_scanned
    calls_before = table.write_calls
    assert index.pop_due(1_000) == [("soon", i) for i in range(7)]
    assert table.entries_scanned - scanned_before == 0  # the table is not scanned
    assert table.entries_written - writes_before == 7  # one delete per expired key ...
    assert table.write_calls - calls_before == 1  # ... in one batch
    assert len(index) == 20_000


class PutCountingStore(CountingMemoryStore):
    """Counts single puts too (MemoryStore.put skips _write)."""

    def put(self, key, value):  # type: ignore[override]
        self.entries_written += 1
        super().put(key, value)


def test_setting_an_unchanged_expiry_writes_nothing():
    table = PutCountingStore()
    index = ExpiryIndex(table)
    index.set("a", 10)
    index.set_many([("a", 10), ("b", 10)])
    index.set("a", 10)
    assert table.entries_written == 2  # "a" once, "b" once


def test_composite_and_tagged_keys_are_indexed_like_any_key(store):
    """Processors key map entries by grouping key + user key; floats, nulls and NaN are tagged in normalized keys."""
    keys = [normalize_key(k) for k in [("user", 1), ("user", 1.5), (None, "x"), (math.nan, 2), (True,), 3.0]]
    index = ExpiryIndex(store)
    index.set_many((k, 50) for k in keys)
    assert all(index.expired(k, 50) for k in keys)
    assert set(ExpiryIndex(store).due(50)) == set(keys)
    assert index.pop_due(50) == keys
    assert list(store.items()) == []


def test_a_memory_store_table_works_as_the_record():
    table = MemoryStore().table("ttl")
    ExpiryIndex(table).set("a", 10)
    assert ExpiryIndex(table).expires_at("a") == 10


@pytest.mark.parametrize("bad", [0, -1, 1.5, "100", True, math.nan])
def test_a_ttl_that_is_not_a_positive_int_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match=f"ttl_ms must be a positive int.*got {bad!r}"):
        check_ttl_ms("ttl_ms", bad)


def test_no_ttl_is_accepted():
    check_ttl_ms("ttl_ms", None)
    check_ttl_ms("ttl_ms", 1)
