"""Tests of buffering.aggregations: partials, merges and results against pandas references."""

from __future__ import annotations

import math
import pickle
from typing import Any, Callable

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buffering.aggregations import (
    Aggregation,
    Aggregations,
    ApproxDistinct,
    CollectSet,
    ColumnNotFoundError,
    Count,
    First,
    HllPartial,
    Last,
    Max,
    Mean,
    Min,
    Sum,
    arrow_type,
    combine_frame,
)
from state.keys import normalize_key

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Value columns of the random frames: nullable ints, plain ints, floats with NaN, strings with None.
NUMERIC = ["i", "j", "f"]
ALL = ["i", "j", "f", "s"]


def _clean(s: pd.Series) -> pd.Series:
    return s.dropna()


def _none_if_empty(f: Callable[[pd.Series], Any]) -> Callable[[pd.Series], Any]:
    def ref(s: pd.Series) -> Any:
        s = _clean(s)
        return None if len(s) == 0 else f(s)

    return ref


# kind -> (factory(column), columns it applies to, pandas reference over one group's column)
KINDS: dict[str, tuple[Callable[[str], Aggregation], list, Callable[[pd.Series], Any]]] = {
    "count_rows": (lambda c: Count(), ["j"], len),
    "count": (Count, ALL, lambda s: int(s.count())),
    "sum": (Sum, NUMERIC, _none_if_empty(lambda s: s.sum())),
    "min": (Min, ALL, _none_if_empty(lambda s: s.min())),
    "max": (Max, ALL, _none_if_empty(lambda s: s.max())),
    "mean": (Mean, NUMERIC, _none_if_empty(lambda s: s.astype(float).mean())),
    "first": (First, ALL, _none_if_empty(lambda s: s.iloc[0])),
    "last": (Last, ALL, _none_if_empty(lambda s: s.iloc[-1])),
    "collect_set": (lambda c: CollectSet(c, max_size=3), ALL, lambda s: sorted(set(_clean(s).tolist()))[:3]),
    "approx_distinct": (lambda c: ApproxDistinct(c, lg_k=10), ALL, lambda s: int(_clean(s).nunique())),
}
COMMUTATIVE = [k for k in KINDS if k not in ("first", "last")]


def same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (float, np.floating)) or isinstance(b, (float, np.floating)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-6)
    return a == b


STRINGS = np.array(["", "a", "b", "ab", "xyz", "zz", "é"], dtype=object)


@st.composite
def frames(draw, min_rows: int = 0, max_rows: int = 40) -> pd.DataFrame:
    """Random frames: hypothesis picks the shape (rows, keys, null rate, value spread), numpy the cells.

    Columns: keys ``k1`` (ints) and ``k2`` (strings); values ``i`` (nullable
    Int64), ``j`` (int64 up to 2**40, no nulls), ``f`` (float64, nulls as NaN),
    ``s`` (object strings with None, including the empty string).
    """
    n = draw(st.integers(min_rows, max_rows))
    keys = draw(st.integers(1, 4))
    null_rate = draw(st.sampled_from([0.0, 0.3, 0.8, 1.0]))
    spread = draw(st.sampled_from([3, 1000, 2**40]))  # few distinct values ... all distinct
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def nulls() -> np.ndarray:
        return rng.random(n) < null_rate

    i = pd.array(rng.integers(-spread, spread, n), dtype="Int64")
    i[nulls()] = pd.NA
    f = np.round(rng.normal(0, 1, n) * min(spread, 10**6), 3)
    f[nulls()] = np.nan
    s = STRINGS[rng.integers(0, len(STRINGS), n)]
    s[nulls()] = None
    return pd.DataFrame(
        {
            "k1": rng.integers(0, keys, n),
            "k2": np.array(["a", "b"], dtype=object)[rng.integers(0, 2, n)],
            "i": i,
            "j": rng.integers(-spread, spread, n),
            "f": f,
            "s": pd.Series(s, dtype=object),
        }
    )


@st.composite
def chunked(draw, min_rows: int = 0, max_rows: int = 40) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
    """A frame and its split into consecutive chunks (some possibly empty)."""
    df = draw(frames(min_rows, max_rows))
    cuts = sorted(draw(st.lists(st.integers(0, len(df)), max_size=4)))
    bounds = [0, *cuts, len(df)]
    return df, [df.iloc[a:b] for a, b in zip(bounds, bounds[1:])]


BY = st.sampled_from([["k1"], ["k1", "k2"]])


def _groups(df: pd.DataFrame, by: list[str]) -> dict:
    """label (as in a partials index) -> group frame, in order of first appearance."""
    key = by[0] if len(by) == 1 else by
    return {label: g for label, g in df.groupby(key, sort=False)}


# ------------------------------------------------------------------ results vs pandas


@pytest.mark.parametrize("kind", KINDS)
@SETTINGS
@given(df=frames(), by=BY)
def test_partials_over_groups_match_pandas_reference(kind, df, by):
    make, columns, reference = KINDS[kind]
    groups = _groups(df, by)
    for column in columns:
        agg = make(column)
        partials = agg.partials(df, by)
        assert list(partials.index) == list(groups)
        for label, group in groups.items():
            got = agg.result(partials[label] if len(by) == 1 else partials.loc[label])
            assert same(got, reference(group[column])), (column, label, got)


@pytest.mark.parametrize("kind", KINDS)
@SETTINGS
@given(data=chunked(), by=BY)
def test_merging_chunk_partials_in_order_matches_pandas_reference(kind, data, by):
    df, chunks = data
    make, columns, reference = KINDS[kind]
    for column in columns:
        agg = make(column)
        acc: dict = {}
        for chunk in chunks:  # what the mini-batch buffer does: one partial per key per chunk
            partials = agg.partials(chunk, by)
            for label, p in zip(partials.index, partials.tolist()):
                acc[label] = agg.merge(acc.get(label, agg.empty()), p)
        groups = _groups(df, by)
        assert list(acc) == list(groups)
        for label, group in groups.items():
            got = agg.result(acc[label])
            assert same(got, reference(group[column])), (column, label, got)


@pytest.mark.parametrize("kind", KINDS)
@SETTINGS
@given(df=frames())
def test_partial_of_frame_matches_pandas_reference(kind, df):
    make, columns, reference = KINDS[kind]
    for column in columns:
        agg = make(column)
        assert same(agg.result(agg.partial(df)), reference(df[column]))


# ------------------------------------------------------------------ merge laws


def _three_partials(kind: str, data) -> list[tuple[Aggregation, list]]:
    _, chunks = data
    make, columns, _ = KINDS[kind]
    out = []
    for column in columns:
        agg = make(column)
        parts = [agg.partial(c) for c in chunks] + [agg.empty()] * 3
        out.append((agg, parts[:3]))
    return out


@pytest.mark.parametrize("kind", KINDS)
@SETTINGS
@given(data=chunked())
def test_merge_is_associative(kind, data):
    for agg, (a, b, c) in _three_partials(kind, data):
        left = agg.merge(agg.merge(a, b), c)
        right = agg.merge(a, agg.merge(b, c))
        assert same(agg.result(left), agg.result(right))
        if kind not in ("approx_distinct", "sum", "mean"):  # exact partials (no float rounding)
            assert left == right


@pytest.mark.parametrize("kind", COMMUTATIVE)
@SETTINGS
@given(data=chunked())
def test_merge_is_commutative(kind, data):
    for agg, (a, b, _) in _three_partials(kind, data):
        assert same(agg.result(agg.merge(a, b)), agg.result(agg.merge(b, a)))


@pytest.mark.parametrize("kind", KINDS)
@SETTINGS
@given(df=frames())
def test_empty_is_the_identity_of_merge(kind, df):
    make, columns, _ = KINDS[kind]
    for column in columns:
        agg = make(column)
        p = agg.partial(df)
        assert same(agg.result(agg.merge(agg.empty(), p)), agg.result(p))
        assert same(agg.result(agg.merge(p, agg.empty())), agg.result(p))


@pytest.mark.parametrize("kind", KINDS)
def test_merge_does_not_mutate_its_inputs(kind):
    make, columns, _ = KINDS[kind]
    df = pd.DataFrame({"i": pd.array([1, None, 3], dtype="Int64"), "j": [1, 2, 3], "f": [1.0, 2.5, None],
                       "s": ["b", "a", None]})
    for column in columns:
        agg = make(column)
        a, b = agg.partial(df.iloc[:2]), agg.partial(df.iloc[2:])
        before = pickle.dumps((a, b), protocol=5)
        agg.merge(a, b)
        agg.merge_many([a, b, a])
        assert pickle.dumps((a, b), protocol=5) == before


@pytest.mark.parametrize("kind", KINDS)
@SETTINGS
@given(data=chunked())
def test_merge_many_equals_merging_in_order(kind, data):
    _, chunks = data
    make, columns, _ = KINDS[kind]
    for column in columns:
        agg = make(column)
        parts = [agg.partial(c) for c in chunks]
        folded = agg.empty()
        for p in parts:
            folded = agg.merge(folded, p)
        assert same(agg.result(agg.merge_many(parts)), agg.result(folded))


def test_first_merge_keeps_the_earlier_value():
    agg = First("x")
    assert agg.merge(1, 2) == 1
    assert agg.merge(None, 2) == 2
    assert agg.merge(1, None) == 1


def test_last_merge_keeps_the_later_value():
    agg = Last("x")
    assert agg.merge(1, 2) == 2
    assert agg.merge(1, None) == 1
    assert agg.merge(None, 2) == 2


def test_first_and_last_follow_arrival_order_not_value_order():
    df = pd.DataFrame({"k": [1, 1, 1, 1], "x": [None, 5.0, 1.0, None]})
    assert First("x").partials(df, "k").tolist() == [5.0]
    assert Last("x").partials(df, "k").tolist() == [1.0]


# ------------------------------------------------------------------ grouping and nulls


def test_partials_index_is_group_keys_in_order_of_first_appearance():
    df = pd.DataFrame({"a": [3, 1, 3, 2, 1], "b": ["y", "x", "x", "y", "x"], "v": [1, 2, 3, 4, 5]})
    single = Count().partials(df, ["a"])
    assert isinstance(single.index, pd.Index) and not isinstance(single.index, pd.MultiIndex)
    assert single.index.name == "a"
    assert single.to_dict() == {3: 2, 1: 2, 2: 1}
    assert list(single.index) == [3, 1, 2]
    multi = Sum("v").partials(df, ["a", "b"])
    assert isinstance(multi.index, pd.MultiIndex)
    assert list(multi.index.names) == ["a", "b"]
    assert list(multi.index) == [(3, "y"), (1, "x"), (3, "x"), (2, "y")]
    assert multi.tolist() == [1, 7, 3, 4]


def test_rows_with_a_null_key_form_their_own_group():
    df = pd.DataFrame({"k": [1.0, None, 1.0, None], "v": [1, 2, 3, 4]})
    partials = Sum("v").partials(df, "k")
    assert len(partials) == 2
    assert partials.tolist() == [4, 6]


@pytest.mark.parametrize("make", [Sum, Min, Max, First, Last, Mean])
def test_a_group_of_only_nulls_gives_none(make):
    df = pd.DataFrame({"k": [1, 2, 2], "x": [1.0, None, np.nan]})
    agg = make("x")
    results = [agg.result(p) for p in agg.partials(df, "k")]
    assert results[1] is None
    assert agg.result(agg.partial(df.iloc[1:])) is None


def test_count_of_a_column_counts_non_null_values_and_count_counts_rows():
    df = pd.DataFrame({"k": [1, 1, 2], "x": [None, 1.0, None]})
    assert Count().partials(df, "k").tolist() == [2, 1]
    assert Count("x").partials(df, "k").tolist() == [1, 0]
    assert Count("x").partials(df, "k").dtype == np.int64


def test_partials_are_python_scalars():
    df = pd.DataFrame({"k": [1, 1], "i": [2, 3], "f": [0.5, 1.0], "t": pd.to_datetime(["2020-01-01", "2021-01-01"])})
    assert type(Sum("i").partial(df)) is int
    assert type(Max("f").partials(df, "k").iloc[0]) is float
    assert type(Count().partial(df)) is int
    assert Min("t").partial(df) == pd.Timestamp("2020-01-01")


def test_sum_of_bools_counts_trues():
    df = pd.DataFrame({"k": [1, 1, 1], "b": [True, False, True]})
    assert Sum("b").partials(df, "k").tolist() == [2]
    assert Mean("b").result(Mean("b").partial(df)) == pytest.approx(2 / 3)


def test_sum_rejects_a_non_numeric_column():
    df = pd.DataFrame({"k": [1], "s": ["x"]})
    with pytest.raises(TypeError, match="'s'"):
        Sum("s").partials(df, "k")


def test_sum_merges_ints_exactly_beyond_int64():
    agg = Sum("x")
    big = 2**62
    assert agg.merge_many([big, big, big]) == 3 * big


def test_sum_of_decimals_stays_decimal():
    from decimal import Decimal

    df = pd.DataFrame({"k": [1, 1, 2], "d": [Decimal("1.10"), Decimal("2.20"), None]})
    assert Sum("d").partials(df, "k").tolist() == [Decimal("3.30"), None]


def test_min_max_first_of_datetimes_are_timestamps_and_skip_nat():
    for tz in (None, "UTC"):
        t = pd.Series(pd.to_datetime(["2021-01-01", None, "2020-06-01", "2022-01-01"])).dt.tz_localize(tz)
        df = pd.DataFrame({"k": [1, 1, 1, 2], "t": t})
        assert Min("t").partials(df, "k").tolist() == [t[2], t[3]]
        assert Max("t").partials(df, "k").tolist() == [t[0], t[3]]
        assert Last("t").partials(df, "k").tolist() == [t[2], t[3]]
        assert isinstance(Min("t").partial(df), pd.Timestamp)


def test_min_max_and_collect_set_of_many_strings_follow_python_ordering():
    rng = np.random.default_rng(11)
    alphabet = list("aAzZ09_é€😀 ")
    words = ["".join(rng.choice(alphabet, rng.integers(0, 6))) for _ in range(2000)]
    df = pd.DataFrame({"k": rng.integers(0, 3, len(words)), "s": words})
    for agg, ref in ((Min("s"), min), (Max("s"), max), (CollectSet("s", max_size=50), lambda v: sorted(set(v))[:50])):
        got = dict(zip(agg.partials(df, "k").index, map(agg.result, agg.partials(df, "k"))))
        assert got == {k: ref(g.tolist()) for k, g in df.groupby("k")["s"]}


def test_approx_distinct_counts_the_empty_string():
    df = pd.DataFrame({"s": ["", "a", "", None]})
    assert ApproxDistinct("s").result(ApproxDistinct("s").partial(df)) == 2


def test_partials_of_an_empty_frame_is_an_empty_series():
    df = pd.DataFrame({"k": pd.Series([], dtype=np.int64), "x": pd.Series([], dtype=float)})
    for agg in (Count(), Sum("x"), Mean("x"), CollectSet("x"), ApproxDistinct("x")):
        assert len(agg.partials(df, "k")) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_partial_of_an_empty_frame_is_the_identity(kind):
    make, columns, _ = KINDS[kind]
    agg = make(columns[0])
    df = pd.DataFrame({c: pd.Series([], dtype=float) for c in ALL})
    assert same(agg.result(agg.partial(df)), agg.result(agg.empty()))


def test_by_must_name_at_least_one_column():
    with pytest.raises(ValueError, match="at least one key column"):
        Count().partials(pd.DataFrame({"x": [1]}), [])


# ------------------------------------------------------------------ CollectSet


def test_collect_set_keeps_the_smallest_values_when_over_max_size():
    df = pd.DataFrame({"k": [1] * 6, "x": [5, 3, 9, 3, 1, 7]})
    agg = CollectSet("x", max_size=3)
    assert agg.result(agg.partials(df, "k").iloc[0]) == [1, 3, 5]
    assert agg.result(agg.merge(agg.partial(df.iloc[:3]), agg.partial(df.iloc[3:]))) == [1, 3, 5]


def test_collect_set_result_is_a_sorted_list_of_distinct_values():
    df = pd.DataFrame({"x": ["b", None, "a", "b"]})
    assert CollectSet("x").result(CollectSet("x").partial(df)) == ["a", "b"]


@pytest.mark.parametrize("max_size", [0, -1])
def test_collect_set_rejects_max_size_below_one(max_size):
    with pytest.raises(ValueError, match="max_size"):
        CollectSet("x", max_size=max_size)


# ------------------------------------------------------------------ ApproxDistinct


@pytest.mark.parametrize("n", [10_000, 40_000, 100_000])
def test_approx_distinct_estimate_is_within_three_standard_errors(n):
    rng = np.random.default_rng(n)
    values = rng.integers(0, n, size=n)  # about 63% distinct
    exact = len(np.unique(values))
    lg_k = 12
    bound = 3 * 1.04 / math.sqrt(2**lg_k) * exact
    agg = ApproxDistinct("x", lg_k=lg_k)
    df = pd.DataFrame({"k": 0, "x": values})
    assert abs(agg.result(agg.partial(df)) - exact) <= bound
    chunks = [df.iloc[idx] for idx in np.array_split(np.arange(len(df)), 7)]
    merged = agg.merge_many(agg.partials(c, "k").iloc[0] for c in chunks)
    assert abs(agg.result(merged) - exact) <= bound


def test_approx_distinct_strings_estimate_is_within_three_standard_errors():
    rng = np.random.default_rng(7)
    values = pd.Series(rng.integers(0, 30_000, size=30_000)).map("user-{}".format)
    exact = values.nunique()
    agg = ApproxDistinct("x", lg_k=12)
    got = agg.result(agg.partial(pd.DataFrame({"x": values})))
    assert abs(got - exact) <= 3 * 1.04 / 64 * exact


def test_approx_distinct_merge_of_sketches_equals_the_union():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 50_000, 30_000)
    b = rng.integers(25_000, 75_000, 30_000)
    union = np.concatenate([a, b])
    agg = ApproxDistinct("x", lg_k=12)
    merged = agg.merge(agg.partial(pd.DataFrame({"x": a})), agg.partial(pd.DataFrame({"x": b})))
    # The union's registers do not depend on how the values were split.
    np.random.default_rng(4).shuffle(union)
    halves = np.array_split(union, 2)
    resplit = agg.merge(agg.partial(pd.DataFrame({"x": halves[0]})), agg.partial(pd.DataFrame({"x": halves[1]})))
    assert merged.estimate() == resplit.estimate()
    exact = len(np.unique(union))
    assert abs(agg.result(merged) - exact) <= 3 * 1.04 / 64 * exact


def test_approx_distinct_is_exact_for_small_cardinalities():
    df = pd.DataFrame({"k": [1] * 50 + [2] * 3, "x": list(range(25)) * 2 + [7, 7, 8]})
    agg = ApproxDistinct("x")
    assert [agg.result(p) for p in agg.partials(df, "k")] == [25, 2]


def test_approx_distinct_counts_an_int_and_the_equal_float_as_one_value():
    agg = ApproxDistinct("x")
    as_int = agg.partial(pd.DataFrame({"x": np.array([1, 2, 3], dtype=np.int64)}))
    as_float = agg.partial(pd.DataFrame({"x": [1.0, 2.0, None, 3.5]}))  # float64 because of the null
    assert agg.result(agg.merge(as_int, as_float)) == 4


@pytest.mark.parametrize("lg_k", [6, 22, 12.5])
def test_approx_distinct_rejects_lg_k_out_of_range(lg_k):
    with pytest.raises(ValueError, match="lg_k"):
        ApproxDistinct("x", lg_k=lg_k)


# ------------------------------------------------------------------ pickling


PICKLE_FRAME = pd.DataFrame(
    {
        "k1": [1, 2, 1, 3],
        "i": pd.array([1, None, 3, None], dtype="Int64"),
        "j": [5, 6, 7, 8],
        "f": [1.5, np.nan, 2.5, np.nan],
        "s": ["x", "y", None, None],
    }
)


@pytest.mark.parametrize("kind", KINDS)
def test_partials_and_results_round_trip_through_pickle(kind):
    make, columns, _ = KINDS[kind]
    for column in columns:
        agg = make(column)
        partials = agg.partials(PICKLE_FRAME, "k1")
        loaded = pickle.loads(pickle.dumps(partials, protocol=5))
        assert list(loaded.index) == list(partials.index)
        for p, q in zip(partials.tolist(), loaded.tolist()):
            assert same(agg.result(q), agg.result(p))
            r = agg.result(p)
            assert same(pickle.loads(pickle.dumps(r, protocol=5)), r)
        one = agg.merge(agg.partial(PICKLE_FRAME), agg.empty())
        assert same(agg.result(pickle.loads(pickle.dumps(one, protocol=5))), agg.result(one))


@pytest.mark.parametrize("kind", KINDS)
def test_aggregations_round_trip_through_pickle(kind):
    make, columns, _ = KINDS[kind]
    agg = make(columns[0])
    loaded = pickle.loads(pickle.dumps(agg, protocol=5))
    assert loaded == agg and repr(loaded) == repr(agg)
    assert same(loaded.result(loaded.partial(PICKLE_FRAME)), agg.result(agg.partial(PICKLE_FRAME)))


def test_hll_partial_pickles_as_the_compact_sketch_and_stays_mergeable():
    agg = ApproxDistinct("x", lg_k=11)
    p = agg.partial(pd.DataFrame({"x": np.arange(5000)}))
    q = pickle.loads(pickle.dumps(p, protocol=5))
    assert isinstance(q, HllPartial) and q.lg_k == 11
    assert q.estimate() == p.estimate()
    assert agg.result(agg.merge(q, agg.partial(pd.DataFrame({"x": np.arange(5000, 6000)})))) == pytest.approx(
        6000, rel=0.1
    )


def test_hll_partial_pickle_names_one_module_level_function():
    # A bound classmethod would pickle `getattr` and the class too: three import lookups per sketch.
    p = ApproxDistinct("x").partial(pd.DataFrame({"x": [1, 2, 3]}))
    data = pickle.dumps(p, protocol=5)
    assert b"getattr" not in data and b"HllPartial" not in data


# {"n": Count(), "viewers": ApproxDistinct("u", lg_k=7), "hi": Max("u")} of u = ann, bob, ann, pickled
# (protocol 5) by buffering/aggregations.py before it became a package: what checkpoints and state stores hold.
STORED_BEFORE_THE_PACKAGE_SPLIT = (
    b"\x80\x05\x95a\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01n\x94K\x03\x8c\x07viewers\x94"
    b"\x8c\x16buffering.aggregations\x94\x8c\x0c_hll_partial\x94\x93\x94"
    b"C\x10\x02\x01\x07\x07\x03\x08\x02\x08\xf8\x11`\x04\xbf d\x1c\x94\x85\x94R\x94"
    b"\x8c\x02hi\x94\x8c\x03bob\x94u."
)


def test_accumulators_stored_before_the_package_split_still_load():
    aggs = Aggregations({"n": Count(), "viewers": ApproxDistinct("u", lg_k=7), "hi": Max("u")})
    acc = pickle.loads(STORED_BEFORE_THE_PACKAGE_SPLIT)
    assert isinstance(acc["viewers"], HllPartial)
    assert aggs.result(acc) == {"n": 3, "viewers": 2, "hi": "bob"}


def test_accumulators_pickle_as_before_the_package_split():
    # Byte for byte: state written now stays readable by code from before the split.
    acc = pickle.loads(STORED_BEFORE_THE_PACKAGE_SPLIT)
    assert pickle.dumps(acc, protocol=5) == STORED_BEFORE_THE_PACKAGE_SPLIT


def test_approx_distinct_merges_in_a_row_do_not_share_state():
    agg = ApproxDistinct("x", lg_k=12)
    a, b, c, d = (agg.partial(pd.DataFrame({"x": np.arange(lo, lo + 1000)})) for lo in (0, 1000, 5000, 6000))
    ab = agg.merge(a, b)
    cd = agg.merge(c, d)  # ab must not change
    assert agg.result(ab) == pytest.approx(2000, rel=0.05)
    assert agg.result(cd) == pytest.approx(2000, rel=0.05)
    assert agg.result(agg.merge(ab, cd)) == pytest.approx(4000, rel=0.05)


def test_approx_distinct_merge_with_an_empty_partial_returns_the_other():
    agg = ApproxDistinct("x")
    p = agg.partial(pd.DataFrame({"x": [1, 2]}))
    assert agg.merge(p, agg.empty()) is p and agg.merge(agg.empty(), p) is p


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("make", [Count, Sum, Min, Max, Mean, First, Last, CollectSet, ApproxDistinct])
def test_missing_column_error_names_the_column_and_the_available_ones(make):
    df = pd.DataFrame({"k": [1], "amount": [2]})
    agg = make("nope")
    for call in (lambda: agg.partials(df, ["k"]), lambda: agg.partial(df)):
        with pytest.raises(KeyError) as info:
            call()
        message = str(info.value)
        assert "'nope'" in message and "'amount'" in message and "'k'" in message
        assert isinstance(info.value, (ColumnNotFoundError, ValueError))


def test_missing_key_column_error_names_the_column():
    with pytest.raises(ColumnNotFoundError, match="'user'.*available columns"):
        Count().partials(pd.DataFrame({"x": [1]}), ["user"])


def test_aggregations_missing_columns_are_named_together():
    aggs = Aggregations({"a": Sum("p"), "b": Max("q")})
    with pytest.raises(ColumnNotFoundError, match="'p', 'q'"):
        aggs.partials(pd.DataFrame({"k": [1]}), "k")


def test_an_aggregation_of_a_column_needs_the_column():
    with pytest.raises(TypeError, match="needs an input column"):
        Sum()


# ------------------------------------------------------------------ Aggregations


def _aggs() -> Aggregations:
    return Aggregations(
        {
            "n": Count(),
            "total": Sum("j"),
            "avg": Mean("f"),
            "hi": Max("s"),
            "first": First("i"),
            "last": Last("s"),
            "tags": CollectSet("s", max_size=2),
            "users": ApproxDistinct("j"),
        }
    )


@SETTINGS
@given(df=frames(), by=BY)
def test_combine_frame_has_one_column_of_partials_per_output(df, by):
    aggs = _aggs()
    frame = combine_frame(df, by, dict(aggs))
    assert list(frame.columns) == list(aggs)
    for name, agg in aggs.items():
        expected = agg.partials(df, by)
        assert list(frame.index) == list(expected.index)
        assert all(same(agg.result(p), agg.result(q)) for p, q in zip(frame[name], expected))


@SETTINGS
@given(data=chunked(), by=BY)
def test_merge_frames_of_chunks_equals_the_partials_of_the_whole_frame(data, by):
    df, chunks = data
    aggs = _aggs()
    merged = aggs.partials(chunks[0], by)
    for chunk in chunks[1:]:
        merged = aggs.merge_frames(merged, aggs.partials(chunk, by))
    whole = aggs.partials(df, by)
    assert list(merged.index) == list(whole.index)
    got, expected = aggs.results(merged), aggs.results(whole)
    for name in aggs:
        assert all(same(a, b) for a, b in zip(got[name], expected[name])), name


@SETTINGS
@given(data=chunked(), by=BY)
def test_merge_into_accumulators_equals_the_results_of_the_whole_frame(data, by):
    df, chunks = data
    aggs = _aggs()
    accumulators: dict = {}
    for chunk in chunks:
        aggs.merge_into(accumulators, aggs.partials(chunk, by))
    whole = aggs.results(aggs.partials(df, by))
    assert list(accumulators) == [normalize_key(k) for k in whole.index]
    for label, row in whole.iterrows():
        got = aggs.result(accumulators[normalize_key(label)])
        assert all(same(got[name], row[name]) for name in aggs), label


def test_results_frame_has_the_key_columns_then_one_column_per_output():
    aggs = Aggregations({"n": Count(), "total": Sum("v")})
    df = pd.DataFrame({"a": [1, 1, 2], "b": ["x", "x", "y"], "v": [1, 2, 3]})
    accumulators: dict = {}
    aggs.merge_into(accumulators, aggs.partials(df, ["a", "b"]))
    out = aggs.results_frame(accumulators, ["a", "b"])
    assert list(out.columns) == ["a", "b", "n", "total"]
    assert out.values.tolist() == [[1, "x", 2, 3], [2, "y", 1, 3]]


def test_results_frame_of_one_scalar_key_column_equals_the_general_path():
    aggs = Aggregations({"n": Count(), "hi": Max("v")})
    accumulators = {7: {"n": 2, "hi": 5}, "k": {"n": 1}}  # "k" lacks an output: it counts as empty
    flat = aggs.results_frame(accumulators, ["key"])
    general = aggs.results_frame(accumulators, ["key"], key_columns=lambda k: (k,))
    pd.testing.assert_frame_equal(flat, general)
    assert flat.values.tolist() == [[7, 2, 5], ["k", 1, None]]


def test_results_frame_rejects_an_output_named_like_the_key_column():
    aggs = Aggregations({"key": Count()})
    with pytest.raises(ValueError, match="'key'"):
        aggs.results_frame({1: {"key": 1}}, ["key"])


def test_aggregations_merge_treats_a_missing_output_as_empty():
    aggs = Aggregations({"n": Count(), "hi": Max("v")})
    assert aggs.merge({"n": 2}, {"n": 1, "hi": 5}) == {"n": 3, "hi": 5}
    assert aggs.result({"n": 2}) == {"n": 2, "hi": None}
    assert aggs.empty() == {"n": 0, "hi": None}


def test_aggregations_reject_non_aggregations():
    with pytest.raises(TypeError, match="'x'"):
        Aggregations({"x": sum})
    with pytest.raises(ValueError):
        Aggregations({})


def test_output_types_follow_the_input_types():
    df = pd.DataFrame(
        {"i": [1], "f": [1.0], "s": ["a"], "b": [True], "t": pd.to_datetime(["2020-01-01"])}
    )
    aggs = Aggregations(
        {
            "n": Count(),
            "si": Sum("i"),
            "sf": Sum("f"),
            "sb": Sum("b"),
            "m": Mean("i"),
            "lo": Min("s"),
            "hi": Max("t"),
            "first": First("f"),
            "tags": CollectSet("s"),
            "users": ApproxDistinct("s"),
        }
    )
    types = aggs.output_types(df.dtypes)
    assert types == {
        "n": "int64",
        "si": "int64",
        "sf": "double",
        "sb": "int64",
        "m": "double",
        "lo": "string",
        "hi": "timestamp[ns]",
        "first": "double",
        "tags": "list<string>",
        "users": "int64",
    }
    import pyarrow as pa

    assert arrow_type(types["tags"]) == pa.list_(pa.string())
    assert arrow_type(types["hi"]) == pa.timestamp("ns")


def test_output_type_of_an_input_typed_aggregation_needs_the_input_type():
    with pytest.raises(ValueError, match="input column's type"):
        Min("x").output_type()
    assert Min("x").output_type("int32") == "int32"
