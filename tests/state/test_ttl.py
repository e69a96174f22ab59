"""The ExpiryIndex contract (state/ttl.py): Spark's TTL rule, the table as the record, sweeps that visit only what expires."""

from __future__ import annotations

import math

import pytest

from state import MemoryStore, normalize_key
from state.ttl import ExpiryIndex, OrderedExpiryIndex, check_ttl_ms, expiry_for, is_expired

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


@pytest.fixture(params=["memory-order-over-memory", "memory-order-over-rocksdb", "rocksdb-order"])
def tables(request, make_backend):
    """``(table, new_index)``: the expiry table, and a function that builds an index over the same tables
    (the in-memory ExpiryIndex, over a memory or a RocksDB table, or the OrderedExpiryIndex over RocksDB)."""
    if request.param == "rocksdb-order":
        root = make_backend("rocksdb")
        table, order = root.table("ttl"), root.table("ttl.order")
        return table, lambda: OrderedExpiryIndex(table, order)
    table = make_backend("memory" if request.param.endswith("memory") else "rocksdb")
    return table, lambda: ExpiryIndex(table)


def test_an_update_expires_ttl_ms_after_the_batch_processing_time():
    assert expiry_for(1_000, 250) == 1_250


def test_state_is_expired_once_processing_time_reaches_its_expiry_as_in_spark():
    # Spark's StateTTL.isExpired: batchTimestampMs >= expirationMs
    assert not is_expired(1_250, 1_249)
    assert is_expired(1_250, 1_250)
    assert is_expired(1_250, 1_251)


def test_a_key_is_expired_from_its_expiry_on_and_a_key_without_expiry_never(tables):
    store, new_index = tables
    index = new_index()
    index.set("a", 100)
    assert (index.expired("a", 99), index.expired("a", 100)) == (False, True)
    assert not index.expired("b", 10**12)
    assert index.expires_at("a") == 100 and index.expires_at("b") is None
    assert index.expired_many(["b", "a", "a"], 100) == [False, True, True]


def test_setting_a_key_again_moves_its_expiry(tables):
    store, new_index = tables
    index = new_index()
    index.set("a", 100)
    index.set("a", 300)
    assert index.expires_at("a") == 300
    assert index.due(299) == []
    assert index.due(300) == ["a"]
    assert dict(store.items()) == {("a",): 300}


def test_due_lists_the_expired_keys_earliest_expiry_first_and_keeps_them(tables):
    store, new_index = tables
    index = new_index()
    index.set_many([("late", 30), ("early", 10), ("middle", 20), ("never", 1_000)])
    assert index.due(25) == ["early", "middle"]
    assert index.due(30) == ["early", "middle", "late"]
    assert len(dict(index.items())) == 4


def test_pop_due_removes_exactly_the_expired_keys_from_index_and_table(tables):
    store, new_index = tables
    index = new_index()
    index.set_many([(k, 10 * k) for k in range(10)])
    assert index.pop_due(35) == [0, 1, 2, 3]
    assert sorted(k for k, _ in index.items()) == [4, 5, 6, 7, 8, 9]
    assert dict(store.items()) == {(k,): 10 * k for k in range(4, 10)}
    assert index.pop_due(35) == []


def test_remove_forgets_the_expiry_in_index_and_table(tables):
    store, new_index = tables
    index = new_index()
    index.set_many([("a", 10), ("b", 10)])
    index.remove("a")
    index.remove_many(["b", "never-set"])
    assert dict(index.items()) == {} and index.due(10**12) == []
    assert list(store.items()) == []


def test_the_table_records_every_expiry_so_reload_rebuilds_the_index(tables):
    store, new_index = tables
    index = new_index()
    index.set_many([(k, 100 + k % 3) for k in range(30)])
    index.remove(4)
    index.set(5, 500)
    index.pop_due(100)
    rebuilt = new_index()  # a restore writes the table, then the index is rebuilt from it
    assert dict(rebuilt.items()) == dict(index.items())
    assert rebuilt.due(10**12) == sorted(rebuilt.due(10**12), key=rebuilt.expires_at)
    assert sorted(rebuilt.pop_due(102)) == [k for k in range(30) if k % 3 and k not in (4, 5)]
    assert rebuilt.due(10**12) == [5]


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


def test_composite_and_tagged_keys_are_indexed_like_any_key(tables):
    store, new_index = tables
    """Processors key map entries by grouping key + user key; floats, nulls and NaN are tagged in normalized keys."""
    keys = [normalize_key(k) for k in [("user", 1), ("user", 1.5), (None, "x"), (math.nan, 2), (True,), 3.0]]
    index = new_index()
    index.set_many((k, 50) for k in keys)
    assert all(index.expired(k, 50) for k in keys)
    assert set(new_index().due(50)) == set(keys)
    assert set(index.pop_due(50)) == set(keys)
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


class Counted:
    """Counts what a RocksDB table's raw methods hand out, by patching them on the table object."""

    def __init__(self, monkeypatch, table) -> None:
        self.keys_iterated = self.entries_scanned = self.point_reads = self.written = 0
        iter_raw_keys, iter_raw, iter_items = table.iter_raw_keys, table.iter_raw, table._iter_items
        get_raw_many, write_raw = table.get_raw_many, table.write_raw

        def counting_keys(lower, upper):
            for raw in iter_raw_keys(lower, upper):
                self.keys_iterated += 1
                yield raw

        def counting_scan(*args, _scan=None, **kwargs):
            for item in (_scan or iter_raw)(*args, **kwargs):
                self.entries_scanned += 1
                yield item

        def counting_reads(raw_keys):
            self.point_reads += len(raw_keys)
            return get_raw_many(raw_keys)

        def counting_writes(pairs, **kwargs):
            pairs = list(pairs)
            self.written += len(pairs)
            return write_raw(pairs, **kwargs)

        monkeypatch.setattr(table, "iter_raw_keys", counting_keys)
        monkeypatch.setattr(table, "iter_raw", counting_scan)
        monkeypatch.setattr(table, "_iter_items", lambda: counting_scan(_scan=iter_items))
        monkeypatch.setattr(table, "get_raw_many", counting_reads)
        monkeypatch.setattr(table, "write_raw", counting_writes)


@pytest.fixture
def large_ordered(make_backend):
    """An OrderedExpiryIndex over RocksDB with 20,000 keys expiring at 5,000+ and 7 keys ("soon", i) at 100+i."""
    root = make_backend("rocksdb")
    table, order = root.table("ttl"), root.table("ttl.order")
    index = OrderedExpiryIndex(table, order)
    index.set_many((k, 5_000 + k) for k in range(20_000))
    index.set_many((("soon", i), 100 + i) for i in range(7))
    return index, table, order


def test_the_rocksdb_order_sweep_reads_and_deletes_only_the_expired_entries(large_ordered, monkeypatch):
    index, table, order = large_ordered
    counted_table, counted_order = Counted(monkeypatch, table), Counted(monkeypatch, order)
    assert index.pop_due(1_000) == [("soon", i) for i in range(7)]
    # the 7 due entries, and at most one entry past them in each of their key groups (its new earliest)
    assert 7 <= counted_order.keys_iterated <= 14
    assert counted_order.written == counted_table.written == 7
    assert counted_table.entries_scanned == counted_order.entries_scanned == counted_table.point_reads == 0
    assert index.pop_due(1_000) == []


def test_the_rocksdb_order_reload_reads_one_entry_per_key_group_not_every_key(large_ordered, monkeypatch):
    index, table, order = large_ordered
    counted_table, counted_order = Counted(monkeypatch, table), Counted(monkeypatch, order)
    index.reload()
    assert counted_order.keys_iterated <= table.max_parallelism  # 128 key groups, 20,007 keys
    assert counted_table.entries_scanned == counted_order.entries_scanned == 0
    assert index.due(106) == [("soon", i) for i in range(7)]


def test_the_rocksdb_order_reads_no_expiry_while_nothing_is_due(large_ordered, monkeypatch):
    index, table, order = large_ordered
    index.pop_due(1_000)
    counted = Counted(monkeypatch, table)
    assert index.expired_many(list(range(100)), 4_999) == [False] * 100
    assert counted.point_reads == 0
    assert index.expired_many([0, 1, 2], 5_001) == [True, True, False]


def test_the_rocksdb_order_refuses_a_negative_expiry(make_backend):
    root = make_backend("rocksdb")
    index = OrderedExpiryIndex(root.table("ttl"), root.table("ttl.order"))
    with pytest.raises(ValueError, match="got -1"):
        index.set("a", -1)
