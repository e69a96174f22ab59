"""Tables of composite keys (grouping key + more columns): key groups and prefix scans by grouping key."""

from __future__ import annotations

import pytest

from state import RocksDBStore
from state.keys import spark_hash
from state.keygroups import key_group_from_hash


@pytest.fixture
def root(tmp_path):
    store = RocksDBStore(tmp_path / "db", max_parallelism=16, key_types=("string",))
    yield store
    store.close()


def test_an_entry_takes_its_key_group_from_the_grouping_columns_only(root):
    table = root.table("map", group_columns=1)
    table.put(("user-1", "a"), 1)
    table.put(("user-1", "zzz"), 2)
    groups = {table.key_group_of_raw(raw) for raw, _ in table.iter_raw()}
    assert groups == {key_group_from_hash(spark_hash(("user-1",), ("string",)), 16)}


def test_iter_prefix_yields_exactly_the_entries_of_one_grouping_key(root):
    table = root.table("map", group_columns=1)
    for user in ("u1", "u10", "u2"):
        for item in ("x", "y"):
            table.put((user, item), f"{user}/{item}")
    assert [v for _, v in table.iter_prefix("u1")] == ["u1/x", "u1/y"]
    assert [k for k, _ in table.iter_prefix(("u10",))] == [("u10", "x"), ("u10", "y")]
    assert list(table.iter_prefix("nobody")) == []


def test_iter_prefix_stops_at_the_limit(root):
    table = root.table("map", group_columns=1)
    for i in range(5):
        table.put(("u", i), i)
    assert len(list(table.iter_prefix("u", limit=1))) == 1


def test_a_key_with_no_column_beyond_the_grouping_ones_is_refused_naming_it(root):
    table = root.table("map", group_columns=1)
    with pytest.raises(ValueError, match=r"\('u',\).*more than its 1 grouping column"):
        table.put(("u",), 1)


def test_reopening_a_table_with_other_grouping_columns_is_refused(root):
    root.table("map", group_columns=1)
    with pytest.raises(ValueError, match="group_columns=1, not 2"):
        root.table("map", group_columns=2)
