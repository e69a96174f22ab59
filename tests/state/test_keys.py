"""Keys: normalization, canonical bytes and key groups (DESIGN.md, "Keys")."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from state import decode_key, encode_key, key_group, normalize_key
from state.keys import SPARK_HASH_SEED, denormalize_key, key_groups_of_longs, long_columns, normalize_keys, split_pairs, spark_hash, spark_hash_ints, spark_hash_longs

from .helpers import INT64_MAX, INT64_MIN, KEY_POOL, PLUS_ONE, UTC, hsettings, key_tuples, scalar_values

# ------------------------------------------------------------------ one key, many spellings


def test_np_int64_and_int_are_one_key():
    assert normalize_key(np.int64(5)) == normalize_key(5)
    assert encode_key(normalize_key(np.int64(5))) == encode_key(normalize_key(5))
    assert key_group(np.int64(5)) == key_group(5)


def test_bare_scalar_and_one_tuple_are_one_key():
    assert normalize_key(5) == normalize_key((5,))
    assert normalize_key("a") == normalize_key(("a",))


@pytest.mark.parametrize(
    "numpy_value, python_value",
    [
        (np.int8(-3), -3),
        (np.int32(7), 7),
        (np.uint16(9), 9),
        (np.int64(INT64_MAX), INT64_MAX),
        (np.float32(0.5), 0.5),
        (np.float64(2.5), 2.5),
        (np.bool_(True), True),
        (np.str_("x"), "x"),
        (np.bytes_(b"x"), b"x"),
        (pd.Timestamp("2021-03-04 05:06:07.000008"), dt.datetime(2021, 3, 4, 5, 6, 7, 8)),
        (np.datetime64("2021-03-04T05:06:07.000008"), dt.datetime(2021, 3, 4, 5, 6, 7, 8)),
    ],
    ids=repr,
)
def test_numpy_and_pandas_scalars_are_the_python_scalar_key(numpy_value, python_value):
    assert normalize_key(numpy_value) == normalize_key(python_value)
    assert normalize_key(("k", numpy_value)) == normalize_key(("k", python_value))
    assert encode_key(normalize_key(numpy_value)) == encode_key(normalize_key(python_value))


def test_tuple_keys_with_numpy_elements_are_the_python_tuple_key():
    assert normalize_key(("a", np.int64(1), np.float64(2.0))) == normalize_key(("a", 1, 2.0))


def test_str_and_bytes_are_different_keys():
    assert normalize_key("a") != normalize_key(b"a")
    assert encode_key(normalize_key("a")) != encode_key(normalize_key(b"a"))


def test_one_float_one_and_true_are_three_different_keys():
    keys = [normalize_key(1), normalize_key(1.0), normalize_key(True)]
    assert len(set(keys)) == 3
    assert len({encode_key(k) for k in keys}) == 3


def test_zero_false_and_float_zero_are_three_different_keys():
    keys = [normalize_key(0), normalize_key(0.0), normalize_key(False)]
    assert len(set(keys)) == 3


def test_negative_zero_and_zero_are_one_key():
    assert normalize_key(-0.0) == normalize_key(0.0)
    assert encode_key(normalize_key(-0.0)) == encode_key(normalize_key(0.0))


def test_date_and_midnight_datetime_are_different_keys():
    assert normalize_key(dt.date(2020, 1, 1)) != normalize_key(dt.datetime(2020, 1, 1))


def test_naive_and_aware_datetimes_are_different_keys():
    naive = normalize_key(dt.datetime(2020, 1, 1))
    aware = normalize_key(dt.datetime(2020, 1, 1, tzinfo=UTC))
    assert naive != aware
    assert encode_key(naive) != encode_key(aware)


def test_aware_datetimes_of_one_instant_are_one_key():
    utc = normalize_key(dt.datetime(2020, 1, 1, tzinfo=UTC))
    plus_one = normalize_key(dt.datetime(2020, 1, 1, 1, tzinfo=PLUS_ONE))
    assert utc == plus_one
    assert encode_key(utc) == encode_key(plus_one)


def test_key_pool_identities_are_exactly_the_normalized_keys():
    """The hand-written identities of the shared key pool agree with normalize_key (both ways)."""
    by_identity: dict[str, set] = {}
    for key, identity in KEY_POOL:
        by_identity.setdefault(identity, set()).add(normalize_key(key))
    assert all(len(nkeys) == 1 for nkeys in by_identity.values()), by_identity
    distinct = [next(iter(nkeys)) for nkeys in by_identity.values()]
    assert len(set(distinct)) == len(distinct)
    assert len({encode_key(k) for k in distinct}) == len(distinct)


# ------------------------------------------------------------------ unsupported keys


class _Opaque:
    def __repr__(self) -> str:
        return "<opaque key 42>"


@pytest.mark.parametrize(
    "key, offending",
    [
        ([1, 2], [1, 2]),
        ({"a": 1}, {"a": 1}),
        ({1}, {1}),
        (1 << 63, 1 << 63),
        (INT64_MIN - 1, INT64_MIN - 1),
        (np.uint64(1 << 63), np.uint64(1 << 63)),
        (("a", 1 << 64), 1 << 64),
        (((1, 2),), (1, 2)),
        (("a", ("b", "c")), ("b", "c")),
        (("a", [1]), [1]),
        ((([1], 2),), ([1], 2)),
        (1 + 2j, 1 + 2j),
        (_Opaque(), _Opaque()),
        ((), ()),
    ],
    ids=repr,
)
def test_unsupported_key_raises_naming_the_offending_value(key, offending):
    with pytest.raises((TypeError, ValueError)) as info:
        normalize_key(key)
    assert repr(offending) in str(info.value)


def test_every_accepted_str_key_has_canonical_bytes():
    """A str that is not valid UTF-8 (a lone surrogate) cannot be a Spark string or canonical bytes.

    normalize_key must reject it with a ValueError that names it, rather than accept it and let
    encode_key (RocksDB, a cache eviction) fail later with a bare UnicodeEncodeError.
    """
    key = "bad\ud800"
    try:
        nkey = normalize_key(key)
    except ValueError as exc:
        assert repr(key) in str(exc)
    else:
        assert decode_key(encode_key(nkey)) == nkey


@pytest.mark.parametrize(
    "key",
    [
        dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5))),
        dt.datetime(9999, 12, 31, 23, 59, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
        ("k", dt.datetime(1, 1, 1, 2, tzinfo=dt.timezone(dt.timedelta(hours=3)))),
    ],
    ids=repr,
)
def test_an_aware_datetime_at_the_end_of_the_calendar_round_trips_or_is_rejected(key):
    """Its UTC instant lies outside datetime's range: accept it only if its canonical bytes decode."""
    try:
        nkey = normalize_key(key)
    except (TypeError, ValueError) as exc:
        offending = key[-1] if isinstance(key, tuple) else key
        assert repr(offending) in str(exc)
    else:
        assert decode_key(encode_key(nkey)) == nkey


# normalize_key accepts its own output (tagged ("f", 1.0) elements) to be idempotent; a user's
# nested tuple of that shape must not get around the checks every other value goes through.
@pytest.mark.parametrize(
    "key, offending",
    [
        ((("t", dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5)))),), "datetime.datetime(1, 1, 1"),
    ],
    ids=["datetime-outside-utc-range"],
)
def test_a_tag_shaped_nested_tuple_cannot_smuggle_in_an_invalid_value(key, offending):
    with pytest.raises(ValueError) as info:
        normalize_key(key)
    assert offending in str(info.value)


def test_a_tag_shaped_negative_zero_is_rejected_or_is_the_zero_key_with_its_bytes():
    """Canonical bytes are equal exactly when normalized keys are equal, and -0.0 == 0.0."""
    try:
        smuggled = normalize_key((("f", -0.0),))
    except (TypeError, ValueError):
        return
    zero = normalize_key(0.0)
    assert (smuggled == zero) == (encode_key(smuggled) == encode_key(zero))


# ------------------------------------------------------------------ idempotence and canonical bytes

pool_keys = st.sampled_from([key for key, _ in KEY_POOL])
any_key = st.one_of(pool_keys, key_tuples, scalar_values)


@hsettings(max_examples=150)
@given(any_key)
def test_normalize_key_is_idempotent(key):
    once = normalize_key(key)
    assert normalize_key(once) == once
    assert encode_key(normalize_key(once)) == encode_key(once)


def _each_normalized(keys):
    try:
        return [normalize_key(k) for k in keys]
    except (TypeError, ValueError) as exc:
        return type(exc)


def _all_normalized(keys):
    try:
        return normalize_keys(keys)
    except (TypeError, ValueError) as exc:
        return type(exc)


alike_keys = st.one_of(
    st.lists(st.integers(INT64_MIN - 1, INT64_MAX + 1), min_size=30, max_size=60),
    st.lists(st.tuples(st.integers(INT64_MIN - 1, INT64_MAX + 1), st.integers(-5, 5)), min_size=30, max_size=60),
    st.lists(st.tuples(st.text(max_size=3), st.integers()), min_size=30, max_size=60),
    st.lists(st.one_of(st.integers(-3, 3), st.booleans(), st.floats(), st.tuples(st.integers(), st.booleans())), min_size=30, max_size=60),
    st.lists(st.tuples(st.integers(0, 3)), min_size=30, max_size=60),
    st.lists(any_key, min_size=30, max_size=60),
)


@hsettings(max_examples=200)
@given(alike_keys)
def test_normalizing_many_keys_at_once_gives_what_each_key_normalizes_to(keys):
    assert _all_normalized(keys) == _each_normalized(keys)


def test_many_keys_normalized_at_once_keep_their_types():
    keys = [(True, 1)] + [(1, 1)] * 40  # True == 1, but a bool is tagged
    assert normalize_keys(keys)[0] == normalize_key((True, 1)) != (1, 1)
    assert normalize_keys([1.0] + list(range(40)))[0] == normalize_key(1.0)


def test_pairs_that_are_not_pairs_are_refused_naming_one():
    assert split_pairs(iter([(1, "a"), (2, "b")])) == ([1, 2], ["a", "b"])
    with pytest.raises(ValueError, match=r"\(3, 'c', 'extra'\)"):
        split_pairs([(1, "a"), (3, "c", "extra")])
    with pytest.raises(ValueError, match="got 7"):
        split_pairs([(1, "a"), 7])


@hsettings(max_examples=150)
@given(any_key)
def test_denormalized_key_normalizes_back(key):
    nkey = normalize_key(key)
    assert normalize_key(denormalize_key(nkey)) == nkey


@hsettings(max_examples=150)
@given(key_tuples)
def test_encode_decode_round_trip(key):
    nkey = normalize_key(key)
    assert decode_key(encode_key(nkey)) == nkey


@hsettings(max_examples=150)
@given(key_tuples, key_tuples)
def test_equal_normalized_keys_give_equal_bytes_and_distinct_give_distinct(a, b):
    na, nb = normalize_key(a), normalize_key(b)
    assert (encode_key(na) == encode_key(nb)) == (na == nb)


@hsettings(max_examples=100)
@given(key_tuples, st.binary(max_size=4))
def test_decode_key_reads_from_an_offset(key, prefix):
    nkey = normalize_key(key)
    assert decode_key(prefix + encode_key(nkey), len(prefix)) == nkey


@hsettings(max_examples=150)
@given(any_key, st.integers(min_value=1, max_value=1 << 15))
def test_key_group_is_in_range(key, max_parallelism):
    assert 0 <= key_group(key, max_parallelism) < max_parallelism


def test_decode_key_rejects_corrupt_bytes_naming_them():
    with pytest.raises(ValueError) as info:
        decode_key(b"\x7f\x00")
    assert repr(b"\x7f\x00") in str(info.value)


_SUBPROCESS_KEYS = [
    5,
    -1,
    "user",
    b"\x00bytes",
    1.5,
    True,
    ("a", 1, 2.0, False),
    dt.date(2020, 2, 29),
    dt.datetime(2020, 2, 29, 12, 0, 0, 7),
    dt.datetime(2020, 2, 29, 12, 0, 0, 7, tzinfo=UTC),
]

_SCRIPT = """
import datetime, json
from state import encode_key, key_group, normalize_key
keys = {keys}
print(json.dumps([[encode_key(normalize_key(k)).hex(), key_group(k), key_group(k, 7)] for k in keys]))
"""


def test_key_bytes_and_key_groups_are_the_same_in_another_process():
    """Canonical bytes and key groups never depend on the process (hash() is salted per process)."""
    script = _SCRIPT.format(keys=repr(_SUBPROCESS_KEYS))
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    here = [[encode_key(normalize_key(k)).hex(), key_group(k), key_group(k, 7)] for k in _SUBPROCESS_KEYS]
    assert json.loads(out.stdout) == here


# ------------------------------------------------------------------ vectorized hashing == scalar hashing

longs = st.lists(st.integers(min_value=INT64_MIN, max_value=INT64_MAX), max_size=40)
ints32 = st.lists(st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1), max_size=40)


@hsettings(max_examples=60)
@given(longs, st.integers(min_value=1, max_value=1 << 15))
def test_vectorized_long_hashes_and_key_groups_match_the_scalar_ones(values, max_parallelism):
    array = np.array(values, dtype=np.int64)
    assert spark_hash_longs(array).tolist() == [spark_hash(normalize_key(v)) for v in values]
    assert key_groups_of_longs(array, max_parallelism).tolist() == [key_group(v, max_parallelism) for v in values]


@hsettings(max_examples=60)
@given(ints32)
def test_vectorized_int_hashes_match_the_scalar_ones(values):
    array = np.array(values, dtype=np.int32)
    assert spark_hash_ints(array).tolist() == [spark_hash(normalize_key(v), ["int"]) for v in values]


@hsettings(max_examples=60)
@given(st.data())
def test_vectorized_hashes_chain_columns_through_a_per_row_seed(data):
    n = data.draw(st.integers(min_value=0, max_value=30))
    first = data.draw(st.lists(st.integers(INT64_MIN, INT64_MAX), min_size=n, max_size=n))
    second = data.draw(st.lists(st.integers(-(1 << 31), (1 << 31) - 1), min_size=n, max_size=n))
    seeds = spark_hash_longs(np.array(first, dtype=np.int64))
    two_longs = spark_hash_longs(np.array(second, dtype=np.int64), seed=seeds)
    long_int = spark_hash_ints(np.array(second, dtype=np.int32), seed=seeds)
    assert two_longs.tolist() == [spark_hash(normalize_key((a, b))) for a, b in zip(first, second)]
    assert long_int.tolist() == [spark_hash(normalize_key((a, b)), ["long", "int"]) for a, b in zip(first, second)]


def test_key_groups_of_longs_rejects_a_bad_max_parallelism():
    with pytest.raises(ValueError):
        key_groups_of_longs(np.arange(3), 0)


# ------------------------------------------------------------------ null and NaN key elements


@pytest.mark.parametrize("null", [None, pd.NA, pd.NaT, np.datetime64("NaT")], ids=repr)
def test_a_null_key_element_normalizes_to_none(null):
    assert normalize_key(null) == (None,)
    assert normalize_key(("a", null)) == ("a", None)


def test_null_keys_round_trip_through_canonical_bytes_apart_from_other_keys():
    keys = [(None,), ("a", None), (None, "a"), (None, None), ("a",), (0,), ("",)]
    encoded = [encode_key(normalize_key(k)) for k in keys]
    assert len(set(encoded)) == len(keys)
    assert [denormalize_key(decode_key(b)) for b in encoded] == [k for k in keys]


def test_every_nan_is_one_key_apart_from_null():
    first, second = normalize_key(float("nan")), normalize_key(np.float64("-nan"))
    assert first == second and hash(first) == hash(second)
    assert len({first: 1, second: 2}) == 1
    assert normalize_key(None) != first
    assert decode_key(encode_key(first)) == first
    assert encode_key(first) == encode_key(second)


def test_a_null_column_leaves_the_spark_hash_unchanged():
    """Spark's xxhash64 skips a null argument: the seed (or the hash so far) passes through."""
    assert spark_hash(normalize_key(None)) == SPARK_HASH_SEED
    assert spark_hash(normalize_key(("a", None))) == spark_hash(normalize_key("a"))
    assert spark_hash(normalize_key((None, "a")), ["long", "string"]) == spark_hash(normalize_key("a"), ["string"])


def test_key_column_values_of_one_plain_column_are_the_keys_themselves():
    from state.keys import key_column_values

    assert key_column_values([1, "a"], ["k"]) == {"k": [1, "a"]}


def test_key_column_values_of_several_columns_split_each_key():
    from state.keys import key_column_values

    columns = key_column_values([(1, "a"), (2, "b")], ["n", "s"])
    assert columns["n"].tolist() == [1, 2] and columns["s"] == ["a", "b"]


@pytest.mark.parametrize(
    "keys, to_columns",
    [
        ([5, -(2**63), 2**63 - 1], None),
        ([(1, "a"), (-2, "b")], None),
        ([True, 3], None),
        ([], None),
        ([(2**64, "x")], tuple),  # a custom to_columns may give ints past a long
    ],
    ids=["one-long-column", "a-long-and-a-string", "bools-mixed-in", "no-keys", "past-a-long"],
)
def test_key_column_values_frame_as_the_lists_of_values_would(keys, to_columns):
    """A column of longs comes as an int64 array (no pass of pandas over Python ints); the frame is the
    one the plain lists of values give, dtypes included."""
    from state.keys import key_column_values

    names = ["n"] if keys and type(keys[0]) is not tuple else ["n", "s"]
    args = () if to_columns is None else (to_columns,)
    columns = key_column_values([normalize_key(k) for k in keys] if to_columns is None else keys, names, *args)
    as_lists = {name: values.tolist() if isinstance(values, np.ndarray) else values for name, values in columns.items()}
    pd.testing.assert_frame_equal(pd.DataFrame(columns, columns=names), pd.DataFrame(as_lists, columns=names))
    for name, values in as_lists.items():
        longs = len(values) > 0 and all(type(v) is int and -(2**63) <= v < 2**63 for v in values)
        assert isinstance(columns[name], np.ndarray) == longs


def test_key_column_values_names_a_key_of_another_width():
    from state.keys import key_column_values

    with pytest.raises(ValueError, match=r"key \(1, 'a'\) has 2 columns"):
        key_column_values([(1, "a")], ["n"])


def test_long_columns_of_keys_of_longs_are_their_columns():
    keys = [(k, -k * 60_000) for k in range(-50, 50)] + [(2**63 - 1, -(2**63))]
    raws = [b"\x00\x07" + encode_key(normalize_key(k)) for k in keys]
    columns = long_columns(raws, 2)
    assert [c.dtype for c in columns] == [np.int64, np.int64]
    assert list(zip(*(c.tolist() for c in columns))) == keys


@pytest.mark.parametrize(
    "keys",
    [
        [(1, 2), (1.5, 2)],  # a float is 8 bytes too: the same width, another tag
        [(1, 2), (dt.datetime(2024, 1, 1), 2)],
        [("a", 2), ("b", 2)],
        [(1, 2), (1, 2, 3)],
        [(1, None), (None, 1)],
    ],
    ids=["float", "datetime", "strings", "widths", "nulls"],
)
def test_long_columns_of_keys_not_all_longs_is_none(keys):
    assert long_columns([encode_key(normalize_key(k)) for k in keys]) is None
