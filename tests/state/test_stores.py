"""The one Store interface, on every backend (DESIGN.md, "Stores (state)").

``store`` is a MemoryStore and a RocksDBStore; ``any_store`` adds a small
WriteBackCache over each, which must look exactly like a store.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from state import StoreClosedError, key_group

from .helpers import KEY_POOL, REPRESENTATIVE, UTC, expected_items, typed_items

# ------------------------------------------------------------------ the dict-like interface


def test_get_of_an_absent_key_returns_the_default(any_store):
    assert any_store.get("nope") is None
    assert any_store.get("nope", 7) == 7


def test_put_then_get_returns_the_value(any_store):
    any_store.put(("user", 1), {"n": 1})
    assert any_store.get(("user", 1)) == {"n": 1}


def test_put_overwrites(any_store):
    any_store.put(1, "a")
    any_store.put(1, "b")
    assert any_store.get(1) == "b"


def test_none_is_a_value_not_an_absence(any_store):
    any_store.put("k", None)
    assert "k" in any_store
    assert any_store.get("k", "default") is None
    assert typed_items(any_store.items()) == typed_items([(("k",), None)])


def test_delete_removes_the_key(any_store):
    any_store.put(1, "a")
    any_store.delete(1)
    assert 1 not in any_store
    assert any_store.get(1, "gone") == "gone"
    assert list(any_store.items()) == []


def test_delete_of_an_absent_key_is_a_no_op(any_store):
    any_store.delete("never")
    assert "never" not in any_store


def test_pop_many_returns_the_values_and_deletes_the_keys(any_store):
    any_store.put_many([(1, "a"), (2, None), (3, "c")])
    assert any_store.pop_many([3, 2, 99], default="-") == ["c", None, "-"]
    assert typed_items(any_store.items()) == typed_items([((1,), "a")])


def test_pop_many_refuses_repeated_keys_before_deleting_anything(any_store):
    any_store.put_many([(1, "a"), (2, "b")])
    with pytest.raises(ValueError, match="distinct"):
        any_store.pop_many([2, 1, 2])
    assert any_store.get_many([1, 2]) == ["a", "b"]


def test_delete_uncached_removes_the_keys(any_store):
    any_store.put_many([(1, "a"), (2, "b")])
    any_store.delete_uncached([2, 42])
    assert 2 not in any_store
    assert typed_items(any_store.items()) == typed_items([((1,), "a")])


def test_contains_tells_present_from_absent(any_store):
    any_store.put("a", 0)
    assert "a" in any_store
    assert "b" not in any_store


def test_get_many_returns_values_in_order_with_defaults(any_store):
    any_store.put(1, "one")
    any_store.put(3, "three")
    assert any_store.get_many([3, 2, 1, 3]) == ["three", None, "one", "three"]
    assert any_store.get_many([2], default=0) == [0]
    assert any_store.get_many([]) == []


def test_put_many_writes_every_pair(any_store):
    any_store.put_many([(1, "a"), (("t", 2), "b"), ("s", "c")])
    assert any_store.get_many([1, ("t", 2), "s"]) == ["a", "b", "c"]


def test_put_many_writes_the_last_value_of_a_repeated_key(any_store):
    any_store.put_many([(1, "a"), (np.int64(1), "b")])
    assert any_store.get(1) == "b"


def test_put_many_validates_every_key_before_writing_anything(any_store):
    with pytest.raises(TypeError):
        any_store.put_many([(1, "a"), ([2], "b")])
    assert 1 not in any_store
    assert list(any_store.items()) == []


def test_items_lists_keys_as_tuples_of_python_scalars(any_store):
    any_store.put(np.int64(5), "i")
    any_store.put(("a", np.float64(1.5)), "t")
    any_store.put(dt.datetime(2020, 1, 1, tzinfo=UTC), "d")
    assert typed_items(any_store.items()) == typed_items(
        [((5,), "i"), (("a", 1.5), "t"), ((dt.datetime(2020, 1, 1, tzinfo=UTC),), "d")]
    )


def test_keys_lists_the_keys(any_store):
    any_store.put(1, "a")
    any_store.put("b", "c")
    assert sorted(map(repr, any_store.keys())) == sorted([repr((1,)), repr(("b",))])


def test_values_are_live_objects_until_put_again(store):
    store.put("k", [1])
    value = store.get("k")
    value.append(2)
    store.put("k", value)
    assert store.get("k") == [1, 2]


# ------------------------------------------------------------------ keys in every store


def test_np_int64_and_int_are_one_key_in_every_store(any_store):
    any_store.put(np.int64(5), "numpy")
    assert any_store.get(5) == "numpy"
    assert 5 in any_store
    any_store.put(5, "python")
    assert any_store.get(np.int64(5)) == "python"
    assert any_store.get((5,)) == "python"
    assert len(list(any_store.items())) == 1


def test_one_float_one_and_true_are_three_keys_in_every_store(any_store):
    any_store.put(1, "int")
    any_store.put(1.0, "float")
    any_store.put(True, "bool")
    assert any_store.get_many([1, 1.0, True]) == ["int", "float", "bool"]
    assert typed_items(any_store.items()) == typed_items([((1,), "int"), ((1.0,), "float"), ((True,), "bool")])


def test_str_and_bytes_are_different_keys_in_every_store(any_store):
    any_store.put("a", "str")
    any_store.put(b"a", "bytes")
    assert any_store.get("a") == "str"
    assert any_store.get(b"a") == "bytes"
    any_store.delete("a")
    assert any_store.get(b"a") == "bytes"


def test_tuple_keys_work_in_every_store(any_store):
    any_store.put(("user", 1), "a")
    any_store.put(("user", 2), "b")
    any_store.put(("user", np.int64(1), "x"), "c")
    assert any_store.get(("user", np.int64(1))) == "a"
    assert any_store.get(("user", 2)) == "b"
    assert any_store.get(("user", 1, "x")) == "c"
    assert ("user", 3) not in any_store


def test_every_spelling_of_a_key_in_the_pool_reaches_one_entry(any_store):
    model: dict[str, object] = {}
    for i, (key, identity) in enumerate(KEY_POOL):
        any_store.put(key, i)
        model[identity] = i
    for key, identity in KEY_POOL:
        assert any_store.get(key) == model[identity], key
    assert typed_items(any_store.items()) == expected_items(model)
    assert len(model) == len(REPRESENTATIVE)


@pytest.mark.parametrize("bad_key", [[1], 1 << 64, ((1, 2),)], ids=repr)
def test_every_operation_rejects_an_unsupported_key(any_store, bad_key):
    for call in (
        lambda: any_store.get(bad_key),
        lambda: any_store.put(bad_key, 1),
        lambda: any_store.delete(bad_key),
        lambda: bad_key in any_store,
        lambda: any_store.get_many([1, bad_key]),
        lambda: any_store.pop_many([1, bad_key]),
        lambda: any_store.delete_uncached([1, bad_key]),
    ):
        with pytest.raises((TypeError, ValueError)):
            call()
    assert list(any_store.items()) == []


def test_store_key_group_is_the_key_group_function(store):
    for key, _ in KEY_POOL:
        assert store.key_group(key) == key_group(key)


# ------------------------------------------------------------------ tables and lifecycle


def test_named_tables_are_independent(store):
    other = store.table("timers")
    store.put("k", "user state")
    other.put("k", "timer")
    assert store.get("k") == "user state"
    assert other.get("k") == "timer"
    other.delete("k")
    assert store.get("k") == "user state"
    assert "k" not in other
    assert set(store.tables()) >= {store.name, "timers"}


def test_table_of_the_same_name_is_the_same_table(store):
    store.table("t").put(1, "x")
    assert store.table("t").get(1) == "x"


def test_operations_after_close_raise_store_closed_error(store):
    """Store.close(): "later calls raise StoreClosedError" (state/base.py), for every backend."""
    store.put(1, "a")
    store.close()
    for call in (
        lambda: store.get(1),
        lambda: store.put(2, "b"),
        lambda: store.delete(1),
        lambda: 1 in store,
        lambda: store.get_many([1]),
        lambda: store.put_many([(2, "b")]),
        lambda: list(store.items()),
        lambda: store.table("other"),
    ):
        with pytest.raises(StoreClosedError):
            call()


def test_closing_a_store_closes_the_tables_it_opened(store):
    timers = store.table("timers")
    timers.put(1, "t")
    store.close()
    with pytest.raises(StoreClosedError):
        timers.get(1)
    with pytest.raises(StoreClosedError):
        timers.put(2, "t")


def test_repr_of_a_closed_store_does_not_raise(store):
    store.put(1, "a")
    store.close()
    assert store.name in repr(store)


def test_close_twice_is_harmless(store):
    store.close()
    store.close()


def test_context_manager_closes_the_store(store):
    with store as s:
        s.put(1, "a")
    with pytest.raises(StoreClosedError):
        store.table("other")
