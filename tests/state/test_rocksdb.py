"""RocksDBStore specifics: tables, key-group ranges, lifecycle, the process lock."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rocksdict import Options, Rdict, SstFileWriter

from state import RocksDBStore, StateSerializationError, StoreClosedError, StoreError, StoreLockedError, WriteBackCache
from state.keys import normalize_key

from .helpers import INT64_MAX, INT64_MIN, KEY_POOL, expected_items, hsettings, typed_items

MAX_P = 16


def _fill(store: RocksDBStore, n: int = 300) -> dict:
    """Keys of several types spread over every key group; returns key -> value."""
    content = {}
    for i in range(n):
        for key in (i, ("s", i), f"k{i}"):
            content[key] = i
    store.put_many(content.items())
    return content


# ------------------------------------------------------------------ tables


def test_same_key_in_two_tables_is_two_entries(tmp_path):
    store = RocksDBStore(tmp_path / "db")
    try:
        timers = store.table("timers")
        store.put(("k", 1), "state")
        timers.put(("k", 1), "timer")
        assert store.get(("k", 1)) == "state"
        assert timers.get(("k", 1)) == "timer"
        assert list(store.items()) == [(("k", 1), "state")]
        assert list(timers.items()) == [(("k", 1), "timer")]
    finally:
        store.close()


def _column_families(path) -> set[str]:
    return set(Rdict.list_cf(str(path)))


def test_a_table_never_written_has_no_column_family_and_reads_as_empty(tmp_path):
    # Every column family costs every open and close of the store: a table is created when first written.
    store = RocksDBStore(tmp_path / "db", max_parallelism=MAX_P)
    try:
        pending = store.table("pending")
        assert pending.get(1, "none") == "none"
        assert pending.get_many([1, 2], "none") == ["none", "none"]
        assert 1 not in pending
        assert list(pending.items()) == [] and list(pending.items(key_groups=range(0, MAX_P))) == []
        assert pending.key_list() == []
        assert list(pending.iter_raw_keys(b"\x00", b"\xff")) == []
        assert pending.get_raw_many(pending.raw_keys([normalize_key(1)])) == [None]
        pending.delete(1)
        pending.delete_many([1, 2])
        pending.delete_key_groups(range(0, MAX_P))
        pending.compact_key_groups(range(0, MAX_P))
        pending.flush()
        assert "pending" not in _column_families(tmp_path / "db")
        assert "pending" in store.tables()  # open in this process, so listed
    finally:
        store.close()
    reopened = RocksDBStore(tmp_path / "db", max_parallelism=MAX_P)
    try:
        assert "pending" not in reopened.tables()
        assert list(reopened.table("pending").items()) == []
    finally:
        reopened.close()


@pytest.mark.parametrize(
    "write",
    [
        lambda table: table.put(1, "a"),
        lambda table: table.put_many([(1, "a")]),
        lambda table: table.write_raw([(table.raw_keys([normalize_key(1)])[0], b"x")]),
        lambda table: table.write_raw_columns(table.raw_keys([normalize_key(1)]), [b"x"]),
    ],
    ids=["put", "put_many", "write_raw", "write_raw_columns"],
)
def test_the_first_write_creates_the_table_and_survives_reopen(tmp_path, write):
    store = RocksDBStore(tmp_path / "db", max_parallelism=MAX_P)
    try:
        pending = store.table("pending")
        write(pending)
        assert "pending" in _column_families(tmp_path / "db")
        assert len(list(pending.iter_raw())) == 1
    finally:
        store.close()
    reopened = RocksDBStore(tmp_path / "db", max_parallelism=MAX_P)
    try:
        assert len(list(reopened.table("pending").iter_raw())) == 1
    finally:
        reopened.close()


def test_deletes_alone_leave_a_table_unwritten_and_are_tracked(tmp_path):
    store = RocksDBStore(tmp_path / "db", max_parallelism=MAX_P)
    try:
        pending = store.table("pending")
        pending.track_changes()
        raw_keys = pending.raw_keys([normalize_key(1), normalize_key(2), normalize_key(3)])
        pending.delete_many([1])
        pending.write_raw_columns(raw_keys[1:2], [None])
        pending.write_raw([(raw_keys[2], None)], track=True)
        pending.write_raw([])
        assert "pending" not in _column_families(tmp_path / "db")
        assert pending.drain_changes() == {raw_keys[0], raw_keys[2]}  # write_raw_columns is not tracked
    finally:
        store.close()


def test_sst_files_ingested_into_a_table_never_written_create_it(tmp_path):
    source = RocksDBStore(tmp_path / "source", max_parallelism=MAX_P)
    source.put_many([(i, i) for i in range(10)])
    pairs = list(source.iter_raw())
    source.close()
    sst = str(tmp_path / "part.sst")
    writer = SstFileWriter(Options(raw_mode=True))
    writer.open(sst)
    for raw_key, raw_value in pairs:
        writer[raw_key] = raw_value
    writer.finish()
    store = RocksDBStore(tmp_path / "db", max_parallelism=MAX_P)
    try:
        pending = store.table("pending")
        pending.ingest_sst_files([sst])
        assert "pending" in _column_families(tmp_path / "db")
        assert dict(pending.items()) == {(i,): i for i in range(10)}
    finally:
        store.close()


def test_a_table_in_the_default_column_family_is_the_only_column_family_and_survives_reopen(tmp_path):
    path = tmp_path / "db"
    store = RocksDBStore(path, table="state", default_column_family=True)
    store.put_many([(1, "a"), (2, "b")])
    store.table("timers").put(1, "t")
    assert store.tables() == ["state", "timers"]
    store.close()
    assert _column_families(path) == {"default", "timers"}
    reopened = RocksDBStore(path, table="state", default_column_family=True)
    try:
        assert dict(reopened.items()) == {(1,): "a", (2,): "b"}
        assert reopened.table("timers").get(1) == "t"
        with pytest.raises(ValueError, match="keeps table 'state' in its default column family"):
            reopened.table("default")
    finally:
        reopened.close()


def test_a_store_with_a_column_family_by_the_tables_name_keeps_the_table_there(tmp_path):
    # A working store written before its table was kept in the default column family must read the same.
    path = tmp_path / "db"
    store = RocksDBStore(path, table="state")
    store.put(1, "a")
    store.close()
    reopened = RocksDBStore(path, table="state", default_column_family=True)
    try:
        assert reopened.get(1) == "a"
        reopened.put(2, "b")
    finally:
        reopened.close()
    assert _column_families(path) == {"default", "state"}
    plain = RocksDBStore(path, table="state")
    try:
        assert dict(plain.items()) == {(1,): "a", (2,): "b"}
    finally:
        plain.close()


def test_a_closed_store_releases_its_lock(tmp_path):
    """close() must release the RocksDB LOCK at once, even while the closed object is still referenced."""
    path = tmp_path / "db"
    store = RocksDBStore(path)
    store.put(1, "a")
    store.close()
    reopened = RocksDBStore(path)  # `store` is still alive here, as in any caller that keeps its reference
    try:
        assert reopened.get(1) == "a"
    finally:
        reopened.close()


def test_tables_survive_close_and_reopen(tmp_path):
    path = tmp_path / "db"
    store = RocksDBStore(path)
    store.put("k", "default")
    store.table("timers").put("k", "timer")
    store.table("pending").put(("p", 1), [1, 2])
    store.close()
    del store  # reopening must not hinge on close() releasing the LOCK while the object lives:
    gc.collect()  # that is test_a_closed_store_releases_its_lock's job
    reopened = RocksDBStore(path)
    try:
        assert set(reopened.tables()) >= {"default", "timers", "pending"}
        assert reopened.get("k") == "default"
        assert reopened.table("timers").get("k") == "timer"
        assert reopened.table("pending").get(("p", 1)) == [1, 2]
    finally:
        reopened.close()


def test_every_key_spelling_survives_close_and_reopen(tmp_path):
    path = tmp_path / "db"
    store = RocksDBStore(path)
    model = {}
    for i, (key, identity) in enumerate(KEY_POOL):
        store.put(key, i)
        model[identity] = i
    store.close()
    del store  # reopening must not hinge on close() releasing the LOCK while the object lives:
    gc.collect()  # that is test_a_closed_store_releases_its_lock's job
    reopened = RocksDBStore(path)
    try:
        assert typed_items(reopened.items()) == expected_items(model)
        for key, identity in KEY_POOL:
            assert reopened.get(key) == model[identity]
    finally:
        reopened.close()


def test_flush_makes_writes_durable_without_a_wal(tmp_path):
    """With the WAL off (the default), close() flushes every table so nothing is lost."""
    path = tmp_path / "db"
    store = RocksDBStore(path, wal=False)
    store.put_many((i, i * i) for i in range(100))
    store.table("t").put("x", 1)
    store.close()
    del store  # reopening must not hinge on close() releasing the LOCK while the object lives:
    gc.collect()  # that is test_a_closed_store_releases_its_lock's job
    reopened = RocksDBStore(path)
    try:
        assert dict(reopened.items()) == {(i,): i * i for i in range(100)}
        assert reopened.table("t").get("x") == 1
    finally:
        reopened.close()


# ------------------------------------------------------------------ key groups


@pytest.mark.parametrize("key_types", [None, ["long"], ["int"]], ids=["inferred", "long", "int"])
def test_raw_keys_start_with_the_key_group_and_scan_in_key_group_order(tmp_path, key_types):
    store = RocksDBStore(tmp_path / "db", max_parallelism=MAX_P, key_types=key_types)
    try:
        store.put_many((i, i) for i in range(200))
        raw_groups = [store.key_group_of_raw(raw) for raw, _ in store.iter_raw()]
        assert sorted(raw_groups) == sorted(store.key_group(k) for k in range(200))
        assert raw_groups == sorted(raw_groups)
        assert [store.key_group(k) for k, _ in store.items()] == raw_groups
    finally:
        store.close()


@hsettings(max_examples=20)
@given(ints=st.lists(st.integers(INT64_MIN, INT64_MAX), min_size=32, max_size=90, unique=True))
def test_batched_and_single_key_paths_agree_on_int_keys(tmp_path_factory, ints):
    """put_many/get_many of many int keys (a vectorized path) and put/get of one key address the same rows."""
    store = RocksDBStore(tmp_path_factory.mktemp("db"), max_parallelism=MAX_P)
    try:
        half = len(ints) // 2
        store.put_many((k, i) for i, k in enumerate(ints[:half]))
        for i, k in enumerate(ints[half:], start=half):
            store.put(k, i)
        assert [store.get(k) for k in ints] == list(range(len(ints)))
        assert store.get_many(ints) == list(range(len(ints)))
        present = set(ints)
        absent = [k ^ 1 for k in ints if k ^ 1 not in present]
        assert store.get_many(absent) == [None] * len(absent)
        raw_groups = sorted(store.key_group_of_raw(raw) for raw, _ in store.iter_raw())
        assert raw_groups == sorted(store.key_group(k) for k in ints)
        store.delete_many(ints[::2])
        assert store.get_many(ints) == [None if i % 2 == 0 else i for i in range(len(ints))]
    finally:
        store.close()


@hsettings(max_examples=20)
@given(pairs=st.lists(st.tuples(st.integers(INT64_MIN, INT64_MAX), st.integers(INT64_MIN, INT64_MAX)),
                      min_size=32, max_size=90, unique=True))
def test_batched_and_single_key_paths_agree_on_long_pairs_grouped_by_the_first(tmp_path_factory, pairs):
    """(long, long) keys of a table grouped by the first column: the vectorized batch path writes the bytes
    of the per-key path, in the key group of the first column."""
    store = RocksDBStore(tmp_path_factory.mktemp("db"), max_parallelism=MAX_P, key_types=["long"], group_columns=1)
    try:
        half = len(pairs) // 2
        store.put_many((k, i) for i, k in enumerate(pairs[:half]))
        for i, k in enumerate(pairs[half:], start=half):
            store.put(k, i)
        assert [store.get(k) for k in pairs] == list(range(len(pairs)))
        assert store.get_many(pairs) == list(range(len(pairs)))
        assert store._encode_many(pairs) == [store._encode(k) for k in pairs]
        from state.keys import key_group

        raw_groups = sorted(store.key_group_of_raw(raw) for raw, _ in store.iter_raw())
        assert raw_groups == sorted(key_group((a,), MAX_P, ["long"]) for a, _ in pairs)
        store.delete_many(pairs[::2])
        assert store.get_many(pairs) == [None if i % 2 == 0 else i for i in range(len(pairs))]
    finally:
        store.close()


def test_key_types_int_and_long_give_different_key_groups(tmp_path):
    as_long = RocksDBStore(tmp_path / "a", key_types=["long"])
    as_int = RocksDBStore(tmp_path / "b", key_types=["int"])
    try:
        assert [as_long.key_group(k) for k in range(50)] != [as_int.key_group(k) for k in range(50)]
    finally:
        as_long.close()
        as_int.close()


@hsettings(max_examples=15)
@given(bounds=st.tuples(st.integers(0, MAX_P), st.integers(0, MAX_P)).map(sorted))
def test_items_of_a_key_group_range_are_exactly_its_keys(tmp_path_factory, bounds):
    start, stop = bounds
    store = RocksDBStore(tmp_path_factory.mktemp("db"), max_parallelism=MAX_P)
    try:
        content = _fill(store, 100)
        wanted = range(start, stop)
        expected = {repr(store.key_group(k)) + repr(k): v for k, v in content.items() if store.key_group(k) in wanted}
        got = list(store.items(key_groups=wanted))
        got_by_key = {}
        for key, value in got:
            user_key = key[0] if len(key) == 1 else key
            got_by_key[repr(store.key_group(key)) + repr(user_key)] = value
        assert len(got) == len(got_by_key)
        assert got_by_key == expected
    finally:
        store.close()


@hsettings(max_examples=15)
@given(bounds=st.tuples(st.integers(0, MAX_P), st.integers(0, MAX_P)).map(sorted))
def test_delete_key_groups_deletes_exactly_those_key_groups(tmp_path_factory, bounds):
    start, stop = bounds
    store = RocksDBStore(tmp_path_factory.mktemp("db"), max_parallelism=MAX_P)
    try:
        content = _fill(store, 100)
        other = store.table("other")
        other.put_many(content.items())
        doomed = range(start, stop)
        store.delete_key_groups(doomed)
        for key, value in content.items():
            if store.key_group(key) in doomed:
                assert key not in store, key
            else:
                assert store.get(key) == value, key
        survivors = sum(1 for k in content if store.key_group(k) not in doomed)
        assert len(list(store.items())) == survivors
        assert len(list(other.items())) == len(content)  # another table is untouched
    finally:
        store.close()


def test_key_group_range_must_be_a_step_one_range_inside_max_parallelism(tmp_path):
    store = RocksDBStore(tmp_path / "db", max_parallelism=MAX_P)
    try:
        with pytest.raises(TypeError):
            list(store.items(key_groups=range(0, MAX_P, 2)))
        with pytest.raises(TypeError):
            store.delete_key_groups([0, 1])  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            list(store.items(key_groups=range(0, MAX_P + 1)))
        with pytest.raises(ValueError):
            store.delete_key_groups(range(-1, 2))
    finally:
        store.close()


def test_raw_pairs_restore_into_another_store(tmp_path):
    source = RocksDBStore(tmp_path / "a", max_parallelism=MAX_P)
    target = RocksDBStore(tmp_path / "b", max_parallelism=MAX_P)
    try:
        content = _fill(source, 50)
        target.write_raw(source.iter_raw(range(0, MAX_P // 2)))
        target.write_raw(source.iter_raw(range(MAX_P // 2, MAX_P)))
        for key, value in content.items():
            assert target.get(key) == value
    finally:
        source.close()
        target.close()


# ------------------------------------------------------------------ change tracking


def _raw_keys(tmp_path, keys) -> set[bytes]:
    """The raw RocksDB keys of ``keys``, computed by a scratch store of the same layout."""
    scratch = RocksDBStore(tmp_path / "scratch", max_parallelism=MAX_P)
    try:
        scratch.put_many((k, 0) for k in keys)
        return {raw for raw, _ in scratch.iter_raw()}
    finally:
        scratch.close()


def test_change_tracking_records_every_write_and_delete_since_the_last_drain(tmp_path):
    store = RocksDBStore(tmp_path / "db", max_parallelism=MAX_P)
    try:
        store.put_many((i, i) for i in range(50))  # before tracking: not recorded
        store.track_changes()
        store.put(1, "x")
        store.delete(2)
        store.put_many((i, i) for i in range(100, 140))
        store.delete_many([3, 4, 999])
        cache = WriteBackCache(store, max_entries=2)
        cache.put(("c", 1), 1)
        cache.delete(5)
        cache.flush()
        expected = _raw_keys(tmp_path, [1, 2, *range(100, 140), 3, 4, 999, ("c", 1), 5])
        assert store.drain_changes() == expected
        assert store.drain_changes() == set()
        store.put(7, 7)
        assert store.drain_changes() == _raw_keys(tmp_path / "again", [7])
    finally:
        store.close()


def test_draining_changes_without_tracking_raises_store_error(tmp_path):
    store = RocksDBStore(tmp_path / "db")
    try:
        with pytest.raises(StoreError):
            store.drain_changes()
    finally:
        store.close()


# ------------------------------------------------------------------ lifecycle and lock


def test_operations_after_close_raise_store_closed_error(tmp_path):
    store = RocksDBStore(tmp_path / "db")
    timers = store.table("timers")
    store.put(1, "a")
    store.close()
    for target in (store, timers):
        for call in (
            lambda: target.get(1),
            lambda: target.put(1, "b"),
            lambda: target.delete(1),
            lambda: 1 in target,
            lambda: target.get_many([1, 2]),
            lambda: target.put_many([(1, "b")]),
            lambda: list(target.items()),
            lambda: list(target.items(key_groups=range(0, 4))),
            lambda: target.delete_key_groups(range(0, 4)),
            lambda: target.flush(),
            lambda: target.table("x"),
            lambda: target.tables(),
        ):
            with pytest.raises(StoreClosedError):
                call()
    assert store.closed


def test_a_second_open_in_the_same_process_raises_store_locked_error(tmp_path):
    path = tmp_path / "db"
    store = RocksDBStore(path)
    try:
        with pytest.raises(StoreLockedError) as info:
            RocksDBStore(path)
        assert str(path) in str(info.value)
        store.put(1, "still works")
        assert store.get(1) == "still works"
    finally:
        store.close()


_SECOND_PROCESS = textwrap.dedent(
    """
    import sys
    from state import RocksDBStore, StoreLockedError
    try:
        RocksDBStore(sys.argv[1])
    except StoreLockedError as exc:
        print("LOCKED:" + str(exc))
        sys.exit(0)
    print("OPENED")
    sys.exit(1)
    """
)


def test_a_second_process_gets_store_locked_error_naming_the_path(tmp_path):
    path = tmp_path / "db"
    store = RocksDBStore(path)
    try:
        store.put("before", 1)
        out = subprocess.run(
            [sys.executable, "-c", _SECOND_PROCESS, str(path)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.startswith("LOCKED:")
        assert str(path) in out.stdout
        # The first store keeps working after the other process failed.
        store.put("after", 2)
        assert store.get("before") == 1
        assert store.get("after") == 2
        assert dict(store.items()) == {("before",): 1, ("after",): 2}
    finally:
        store.close()


def test_numpy_values_round_trip(tmp_path):
    store = RocksDBStore(tmp_path / "db")
    try:
        store.put(1, np.arange(5))
        assert np.array_equal(store.get(1), np.arange(5))
    finally:
        store.close()


# ------------------------------------------------------------------ values that cannot be pickled


def test_a_put_that_cannot_be_pickled_is_a_type_error_naming_the_key_and_the_table_caused_by_picklings(tmp_path):
    store = RocksDBStore(tmp_path / "db", table="state")
    with pytest.raises(StateSerializationError) as info:
        store.put(("locked", 7), threading.Lock())
    assert isinstance(info.value, TypeError)
    assert "key ('locked', 7)" in str(info.value) and "table='state'" in str(info.value)
    assert isinstance(info.value.__cause__, TypeError) and "_thread.lock" in str(info.value.__cause__)
    store.close()


def test_a_batch_that_cannot_be_pickled_names_the_key_whose_value_fails(tmp_path):
    store = RocksDBStore(tmp_path / "db", table="state")
    with pytest.raises(StateSerializationError, match=r"key \('locked', 7\) .*table='state'"):
        store.put_many([(1, "a"), (("locked", 7), threading.Lock()), (2, "b")])
    store.close()


def test_a_batch_that_cannot_be_pickled_writes_nothing_and_leaves_the_other_keys_readable(tmp_path):
    store = RocksDBStore(tmp_path / "db", table="state")
    store.put_many([(1, "one"), (2, "two")])
    with pytest.raises(TypeError):
        store.put_many([(1, "changed"), (3, threading.Lock()), (4, "four")])
    with pytest.raises(TypeError):
        store.put(2, threading.Lock())
    assert dict(store.items()) == {(1,): "one", (2,): "two"}
    store.close()


def test_invalid_options_raise_value_error(tmp_path):
    with pytest.raises(ValueError):
        RocksDBStore(tmp_path / "a", block_cache_bytes=0)
    with pytest.raises(ValueError):
        RocksDBStore(tmp_path / "b", bloom_bits_per_key=-1)
    with pytest.raises(ValueError):
        RocksDBStore(tmp_path / "c", max_parallelism=0)


def test_key_list_gives_every_key_normalized_as_the_items_do(tmp_path):
    store = RocksDBStore(str(tmp_path / "db"), group_columns=1)
    pairs = [((k, s), k + s) for k in range(-20, 40) for s in (0, 60_000)]
    store.put_many(pairs)
    assert sorted(store.key_list()) == sorted(k for k, _ in store.items())
    assert sorted(store.key_list()) == sorted(k for k, _ in pairs)
    store.close()


def test_key_group_of_a_grouped_tables_key_is_the_key_group_it_is_stored_under(tmp_path):
    grouped = RocksDBStore(str(tmp_path / "grouped"), group_columns=1)
    plain = RocksDBStore(str(tmp_path / "plain"))
    keys = [(k, s) for k in range(30) for s in (0, 60_000)]
    assert [grouped.key_group(key) for key in keys] == [grouped.key_group_of_raw(raw) for raw in grouped.raw_keys(keys)]
    assert [grouped.key_group(key) for key in keys] == [plain.key_group(key[:1]) for key in keys]  # the key's own
    assert [grouped.key_group(key[:1]) for key in keys] == [grouped.key_group(key) for key in keys]
    assert [plain.key_group(key) for key in keys] == [plain.key_group_of_raw(raw) for raw in plain.raw_keys(keys)]
    grouped.close()
    plain.close()


def test_key_group_of_a_key_shorter_than_the_grouping_columns_is_an_error_naming_it(tmp_path):
    store = RocksDBStore(str(tmp_path / "db"), group_columns=2)
    with pytest.raises(ValueError, match=r"key \(7,\) .* fewer than its 2 grouping"):
        store.key_group((7,))
    store.close()


def test_key_list_of_other_keys_decodes_them_one_by_one(tmp_path):
    store = RocksDBStore(str(tmp_path / "db"))
    store.put_many([("a", 1), ((1, "b"), 2), (3, 3)])
    assert sorted(map(repr, store.key_list())) == sorted(repr(normalize_key(k)) for k, _ in store.items())
    store.close()


def test_a_store_reopened_at_every_batch_keeps_only_the_last_two_info_logs(tmp_path):
    # A working store is closed and reopened at every micro-batch; each open starts a new info LOG.
    for batch in range(6):
        store = RocksDBStore(tmp_path / "db")
        store.table("pending").put(batch, batch)
        store.put(batch, batch)
        store.close()
    logs = [p.name for p in (tmp_path / "db").iterdir() if p.name.startswith("LOG")]
    assert len(logs) <= 2, logs
    store = RocksDBStore(tmp_path / "db")
    assert dict(store.items()) == {(b,): b for b in range(6)}
    store.close()
