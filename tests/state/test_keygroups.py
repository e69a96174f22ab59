"""Key groups and operator ranges (DESIGN.md, "Keys": Flink's key-group assignment)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from .helpers import hsettings

from state import DEFAULT_MAX_PARALLELISM, key_group_from_hash, key_group_range, operator_index

MAX_P = st.integers(min_value=1, max_value=1 << 15)


def _partition_of(max_parallelism: int, parallelism: int) -> list[range]:
    return [key_group_range(i, parallelism, max_parallelism) for i in range(parallelism)]


def _assert_contiguous_partition(ranges: list[range], max_parallelism: int) -> None:
    assert ranges[0].start == 0
    assert ranges[-1].stop == max_parallelism
    for before, after in zip(ranges, ranges[1:]):
        assert before.stop == after.start
    assert all(r.step == 1 and len(r) >= 1 for r in ranges)


def test_default_max_parallelism_is_128():
    assert DEFAULT_MAX_PARALLELISM == 128


def test_ranges_of_every_parallelism_partition_the_default_key_groups():
    for parallelism in range(1, DEFAULT_MAX_PARALLELISM + 1):
        _assert_contiguous_partition(_partition_of(DEFAULT_MAX_PARALLELISM, parallelism), DEFAULT_MAX_PARALLELISM)


@hsettings(max_examples=10)
@given(st.data())
def test_ranges_of_every_parallelism_partition_all_key_groups(data):
    max_parallelism = data.draw(st.integers(min_value=1, max_value=200), label="max_parallelism")
    for parallelism in range(1, max_parallelism + 1):
        _assert_contiguous_partition(_partition_of(max_parallelism, parallelism), max_parallelism)


@hsettings(max_examples=100)
@given(st.data())
def test_ranges_partition_key_groups_at_large_max_parallelism(data):
    max_parallelism = data.draw(MAX_P, label="max_parallelism")
    parallelism = data.draw(st.integers(min_value=1, max_value=min(max_parallelism, 2000)), label="parallelism")
    _assert_contiguous_partition(_partition_of(max_parallelism, parallelism), max_parallelism)


@hsettings(max_examples=100)
@given(st.data())
def test_operator_index_inverts_key_group_range(data):
    max_parallelism = data.draw(MAX_P, label="max_parallelism")
    parallelism = data.draw(st.integers(min_value=1, max_value=max_parallelism), label="parallelism")
    index = data.draw(st.integers(min_value=0, max_value=parallelism - 1), label="index")
    owned = key_group_range(index, parallelism, max_parallelism)
    for key_group in {owned.start, owned.stop - 1, (owned.start + owned.stop) // 2}:
        assert operator_index(key_group, parallelism, max_parallelism) == index
    key_group = data.draw(st.integers(min_value=0, max_value=max_parallelism - 1), label="key_group")
    assert key_group in key_group_range(operator_index(key_group, parallelism, max_parallelism), parallelism, max_parallelism)


@hsettings(max_examples=100)
@given(st.data())
def test_key_group_range_is_flinks_formula(data):
    max_parallelism = data.draw(MAX_P)
    parallelism = data.draw(st.integers(min_value=1, max_value=max_parallelism))
    index = data.draw(st.integers(min_value=0, max_value=parallelism - 1))
    owned = key_group_range(index, parallelism, max_parallelism)
    assert owned.start == -((-index * max_parallelism) // parallelism)
    assert owned.stop - 1 == ((index + 1) * max_parallelism - 1) // parallelism


@hsettings(max_examples=100)
@given(st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1), MAX_P)
def test_key_group_from_hash_is_pmod_of_the_signed_hash(hash64, max_parallelism):
    signed = hash64 - (1 << 64) if hash64 >= 1 << 63 else hash64
    key_group = key_group_from_hash(hash64, max_parallelism)
    assert 0 <= key_group < max_parallelism
    # Spark's pmod(a, n) = ((a % n) + n) % n, where Java's % truncates toward zero.
    quotient = abs(signed) // max_parallelism
    java_rem = signed - max_parallelism * (quotient if signed >= 0 else -quotient)
    assert key_group == ((java_rem + max_parallelism) % max_parallelism)


@pytest.mark.parametrize(
    "call",
    [
        lambda: key_group_range(0, 0),
        lambda: key_group_range(0, 129),
        lambda: key_group_range(2, 2),
        lambda: key_group_range(-1, 2),
        lambda: key_group_range(0, 1, 0),
        lambda: key_group_range(0, 1, (1 << 15) + 1),
        lambda: key_group_range(True, 2),
        lambda: operator_index(128, 2),
        lambda: operator_index(-1, 2),
        lambda: operator_index(0, 0),
        lambda: operator_index(0, 3, 2),
    ],
    ids=[
        "parallelism-0",
        "parallelism-above-max",
        "index-equal-parallelism",
        "negative-index",
        "max-parallelism-0",
        "max-parallelism-above-upper-bound",
        "bool-index",
        "key-group-equal-max",
        "negative-key-group",
        "operator-parallelism-0",
        "parallelism-above-max-parallelism",
    ],
)
def test_out_of_range_arguments_raise_value_error(call):
    with pytest.raises(ValueError):
        call()
