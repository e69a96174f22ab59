"""aggregate() accumulators as columns: the same answers and sketches as DataSketches, packed values users can read."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pandas as pd
import pytest

datasketches = pytest.importorskip("datasketches")

from buffering import ApproxDistinct, CollectSet, Count, LocalRunner, Max, aggregate, cached_state  # noqa: E402
from buffering.aggregations.columnar import (  # noqa: E402
    _fill,
    ColumnarLayout,
    HllField,
    PackedAccumulator,
    coupon_limit,
)
from buffering.aggregations.sketches import HllPartial  # noqa: E402

HLL_8 = datasketches.tgt_hll_type.HLL_8
HLL_4 = datasketches.tgt_hll_type.HLL_4


def sketch(values, lg_k=12, tgt=HLL_8):
    s = datasketches.hll_sketch(lg_k, tgt)
    for v in values:
        s.update(int(v))
    return s


def coupons_of(image: bytes) -> set[int]:
    """The coupons of a LIST/SET sketch image (compact or updatable)."""
    body = 8 if image[0] == 2 else 12
    words = struct.unpack_from(f"<{(len(image) - body) // 4}I", image, body)
    return {w for w in words if w}


def registers_of(s) -> np.ndarray:
    union = datasketches.hll_union(s.lg_config_k)
    union.update(s)
    image = union.get_result(HLL_8).serialize_updatable()
    return np.frombuffer(image, dtype=np.uint8, count=1 << s.lg_config_k, offset=40)


def hll_column(field: HllField, sketches):
    return field.from_sketch_bytes([s.serialize_updatable() for s in sketches])


# ---------------------------------------------------------------- DataSketches' own rules
@pytest.mark.parametrize("lg_k", range(7, 22))
def test_the_coupon_limit_is_where_datasketches_turns_a_sketch_into_registers(lg_k):
    registers_size = 40 + (1 << lg_k)  # an HLL_8 sketch's image once it holds registers
    s, n = sketch([], lg_k), 0
    while s.get_updatable_serialization_bytes() != registers_size:
        s.update(10**9 + n)
        n += 1
    before = sketch(range(10**9, 10**9 + n - 1), lg_k)  # the values just before it turned
    assert len(coupons_of(before.serialize_compact())) == coupon_limit(lg_k)


@pytest.mark.parametrize("lg_k", [8, 12, 16, 21])
def test_a_coupon_set_estimates_its_size_as_datasketches_rounds_it(lg_k):
    field = HllField(lg_k)
    for n in sorted({0, 1, 7, 8, min(100, coupon_limit(lg_k)), min(384, coupon_limit(lg_k))}):
        s = sketch(range(n * 7919, n * 7919 + n), lg_k)
        column = hll_column(field, [s])
        assert field.results(column)[0] == round(s.get_estimate()) == n


def test_merged_coupons_are_the_coupons_of_a_sketch_of_all_the_values():
    field = HllField(12)
    a, b = sketch(range(0, 150)), sketch(range(100, 300), tgt=HLL_4)  # overlapping; HLL_4 as Spark sends
    merged = field.merge(hll_column(field, [a]), hll_column(field, [b]))
    expected = sketch(range(0, 300))
    assert set(merged.coupons.tolist()) == coupons_of(expected.serialize_compact())
    assert field.results(merged)[0] == round(expected.get_estimate()) == 300


def test_a_key_past_the_coupon_limit_holds_the_registers_of_a_sketch_of_all_its_values():
    field = HllField(12)
    a, b = sketch(range(0, 300)), sketch(range(250, 700))
    merged = field.merge(hll_column(field, [a]), hll_column(field, [b]))
    assert merged.dense_rows.tolist() == [0] and len(merged.coupons) == 0
    assert np.array_equal(merged.registers[0], registers_of(sketch(range(0, 700))))


def test_the_estimate_of_merged_registers_is_the_estimate_of_a_datasketches_union():
    field = HllField(12)
    a, b = sketch(range(0, 3000)), sketch(range(2000, 9000))
    union = datasketches.hll_union(12)
    union.update(a)
    union.update(b)
    merged = field.merge(hll_column(field, [a]), hll_column(field, [b]))
    assert field.results(merged)[0] == round(union.get_result(HLL_8).get_estimate())


def test_a_register_array_reads_back_as_a_datasketches_sketch_that_unions_with_others():
    field = HllField(12)
    column = hll_column(field, [sketch(range(0, 5000))])
    partial = field.partial(column, 0)
    union = datasketches.hll_union(12)
    union.update(partial.sketch)
    union.update(sketch(range(5000, 6000)))
    assert abs(union.get_estimate() - 6000) < 6000 * 0.05


@pytest.mark.parametrize("tgt", [HLL_8, HLL_4, datasketches.tgt_hll_type.HLL_6])
@pytest.mark.parametrize("form", ["updatable", "compact"])
def test_the_registers_read_from_a_sketch_image_are_its_datasketches_registers(tgt, form):
    field = HllField(12)
    sketches = [sketch(range(i * 10**6, i * 10**6 + 500 + 700 * i), tgt=tgt) for i in range(4)]
    images = [s.serialize_updatable() if form == "updatable" else s.serialize_compact() for s in sketches]
    column = field.from_sketch_bytes(images)
    assert column.dense_rows.tolist() == [0, 1, 2, 3]
    for registers, s in zip(column.registers, sketches):
        assert np.array_equal(registers, registers_of(s))


def test_a_sketch_of_another_lg_k_is_refused_naming_both():
    with pytest.raises(ValueError, match="lg_k 12.*lg_k 10"):
        HllField(12).from_sketch_bytes([sketch(range(5), lg_k=10).serialize_compact()])


# ---------------------------------------------------------------- packed values
def layout():
    return ColumnarLayout.of({"views": Count(), "viewers": ApproxDistinct("user")})


def test_every_aggregation_but_collect_set_has_a_column_form():
    assert ColumnarLayout.of({"n": Count(), "d": ApproxDistinct("u"), "top": Max("v")}) is not None
    assert ColumnarLayout.of({"n": Count(), "users": CollectSet("u")}) is None


def test_a_stored_value_unpickles_to_a_mapping_of_the_partials():
    lay = layout()
    block = lay.from_accumulators([{"views": 5, "viewers": HllPartial(sketch([1, 2, 3]))}])
    (value,) = lay.encode(block)
    acc = pickle.loads(value)
    assert isinstance(acc, PackedAccumulator)
    assert acc["views"] == 5 and round(acc["viewers"].estimate()) == 3
    assert sorted(acc.keys()) == ["viewers", "views"] and "views" in acc


def test_stored_values_decode_to_the_block_they_were_encoded_from():
    lay = layout()
    sizes = [0, 3, 400, 2000]
    accs = [{"views": n, "viewers": HllPartial(sketch(range(i * 10**6, i * 10**6 + n)))} for i, n in enumerate(sizes)]
    block = lay.from_accumulators(accs)
    again = lay.decode([*lay.encode(block), None])
    assert again[0].tolist() == [*sizes, 0]
    assert lay.results(again)["viewers"].tolist() == [*lay.results(block)["viewers"].tolist(), 0]


def test_values_of_other_aggregations_are_refused_naming_both():
    other = ColumnarLayout.of({"n": Count()})
    (value,) = other.encode(other.from_accumulators([{"n": 1}]))
    with pytest.raises(ValueError, match="other aggregations.*'n': 'count'.*'views': 'count'"):
        layout().decode([value])


def test_accumulators_stored_as_dicts_by_older_versions_are_read():
    lay = layout()
    old = {"views": 2, "viewers": HllPartial(sketch([1, 2]))}
    merged = lay.merge(lay.decode([old, None]), lay.from_accumulators([{"views": 1, "viewers": HllPartial(sketch([3]))}] * 2))
    assert lay.results(merged)["views"].tolist() == [3, 1]
    assert lay.results(merged)["viewers"].tolist() == [3, 1]


# ---------------------------------------------------------------- through a runner
def views(seed: int, n: int = 3000) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"tweet": rng.zipf(1.3, n) % 200, "user": rng.integers(0, 2000, n)})


def expected(frames) -> pd.DataFrame:
    everything = pd.concat(frames)
    return everything.groupby("tweet").agg(views=("user", "size"), viewers=("user", "nunique"))


def final(outputs) -> pd.DataFrame:
    out = pd.concat(outputs)
    return out.groupby("tweet").tail(1).set_index("tweet").sort_index()[["views", "viewers"]]


def tweet_stats():
    return cached_state(max_entries=50, store="rocksdb")(aggregate({"views": Count(), "viewers": ApproxDistinct("user")}))


def test_aggregate_counts_and_distinct_viewers_as_a_groupby_does(tmp_path):
    frames = [views(s) for s in range(4)]
    runner = LocalRunner(tweet_stats(), key="tweet", parallelism=2)
    result = final([runner.process(f) for f in frames])
    truth = expected(frames)
    assert (result["views"] == truth["views"]).all()
    small = truth["viewers"] <= 384  # coupon sets: exact
    assert (result["viewers"][small] == truth["viewers"][small]).all()
    assert (abs(result["viewers"] - truth["viewers"]) <= 0.05 * truth["viewers"]).all()


def test_aggregate_state_restored_at_another_parallelism_goes_on_counting(tmp_path):
    frames = [views(s) for s in range(4)]
    first = LocalRunner(tweet_stats(), key="tweet", parallelism=3, checkpoint_location=str(tmp_path))
    outputs = [first.process(f) for f in frames[:2]]
    first.close()
    second = LocalRunner(tweet_stats(), key="tweet", parallelism=2, checkpoint_location=str(tmp_path))
    outputs += [second.process(f) for f in frames[2:]]
    result, truth = final(outputs), expected(frames)
    assert (result["views"] == truth["views"]).all()
    small = truth["viewers"] <= 384
    assert (result["viewers"][small] == truth["viewers"][small]).all()


def test_a_runners_state_shows_each_keys_accumulators_as_a_mapping():
    runner = LocalRunner(tweet_stats(), key="tweet")
    runner.process(pd.DataFrame({"tweet": [1, 1, 2], "user": [10, 11, 10]}))
    acc = runner.get_state(1)
    assert acc["views"] == 2 and round(acc["viewers"].estimate()) == 2
    assert {k: v["views"] for k, v in runner.state().items()} == {(1,): 2, (2,): 1}


# ---------------------------------------------------------------- sums, picks, means
from buffering import First, Last, Mean, Min, Sum  # noqa: E402
from buffering.aggregations import Aggregations  # noqa: E402

SCALARS = {"n": Count(), "total": Sum("x"), "lo": Min("x"), "hi": Max("x"), "first": First("x"), "last": Last("x"),
           "avg": Mean("x")}


def object_path(aggs, earlier, later):
    return [aggs.merge(a, b) for a, b in zip(earlier, later)]


@pytest.mark.parametrize("values", [
    [1, 5, None, -3],
    [1.5, None, 2.25, -0.5],
    [1, 2.5, None, 7],  # ints and floats mixed across keys and batches
    ["b", "a", None, "c"],  # strings: kept as objects
    [2**62, 2**62, 3, None],  # a sum past int64 stays exact
])
def test_sums_picks_and_means_merge_as_the_object_path_does(values):
    aggs = Aggregations(SCALARS if not isinstance(values[0], str) else
                        {k: v for k, v in SCALARS.items() if k not in ("total", "avg")})
    lay = ColumnarLayout.of(aggs)
    frame = pd.DataFrame({"k": [0, 1, 2, 3, 0, 1, 2, 3], "x": values + values[::-1]})
    earlier = [acc for _, acc in aggs.rows(aggs.partials(frame.iloc[:4], ["k"]))]
    later = [acc for _, acc in aggs.rows(aggs.partials(frame.iloc[4:], ["k"]))]
    stored = lay.encode(lay.from_accumulators(earlier))
    merged = lay.merge(lay.decode(stored), lay.from_accumulators(later))
    got = lay.results(lay.decode(lay.encode(merged)))
    expected = [aggs.result(acc) for acc in object_path(aggs, earlier, later)]
    for name in aggs:
        assert got[name].tolist() == [e[name] for e in expected], name


def test_a_mean_of_no_values_is_none_and_its_partial_is_the_identity():
    lay = ColumnarLayout.of({"avg": Mean("x")})
    block = lay.from_accumulators([{"avg": (0, 0)}])
    assert lay.results(block)["avg"].tolist() == [None]
    assert pickle.loads(lay.encode(block)[0])["avg"] == (0, 0)


def test_outputs_named_with_separators_keep_their_accumulators_as_objects():
    assert ColumnarLayout.of({"a:b": Count()}) is None


def test_a_packed_accumulator_equals_the_dict_of_its_partials():
    lay = ColumnarLayout.of({"n": Count(), "top": Max("v")})
    (value,) = lay.encode(lay.from_accumulators([{"n": 2, "top": 7}]))
    assert PackedAccumulator(value) == {"n": 2, "top": 7}
    assert PackedAccumulator(value) != {"n": 3, "top": 7}


def test_a_packed_accumulators_repr_is_the_mapping_of_its_outputs_to_their_partials():
    lay = ColumnarLayout.of({"n": Count(), "top": Max("v")})
    (value,) = lay.encode(lay.from_accumulators([{"n": 2, "top": 7}]))
    assert repr(PackedAccumulator(value)) == "PackedAccumulator({'n': 2, 'top': 7})"


def test_an_aggregates_state_prints_as_the_mapping_not_as_pickle_bytes():
    runner = LocalRunner(aggregate({"views": Count(), "top": Max("v")}), key="k")
    runner.process(pd.DataFrame({"k": [1, 1, 2], "v": [3, 9, 4]}))
    acc = runner.get_state(1)
    assert str(acc) == f"{acc}" == "%s" % acc == "PackedAccumulator({'views': 2, 'top': 9})"
    assert str(runner.state()) == (
        "{(1,): PackedAccumulator({'views': 2, 'top': 9}), (2,): PackedAccumulator({'views': 1, 'top': 4})}"
    )


def test_a_packed_accumulator_decodes_its_partials_only_when_shown(monkeypatch):
    decoded = []
    as_dict = PackedAccumulator.as_dict
    monkeypatch.setattr(PackedAccumulator, "as_dict", lambda self: decoded.append(1) or as_dict(self))
    lay = ColumnarLayout.of({"n": Count()})
    (value,) = lay.encode(lay.from_accumulators([{"n": 2}]))
    acc = PackedAccumulator(value)
    pickle.loads(pickle.dumps(acc))
    assert decoded == []
    repr(acc)
    assert decoded == [1]



# ---------------------------------------------------------------- partials of raw rows
from buffering.aggregations import Grouping  # noqa: E402
from buffering.aggregations.sketches import _hll_values  # noqa: E402
from buffering.buffer import RowPartials  # noqa: E402

RAW_COLUMNS = {
    "ints": pd.Series([0, 1, -1, 2**63 - 1, -(2**63), 7, 7, 123456789], dtype="int64"),
    "bools": pd.Series([True, False, True, True, False, False, True, False]),
    "uints": pd.Series([0, 1, 2**64 - 1, 2**63, 5, 5, 9, 10], dtype="uint64"),
    "floats": pd.Series([0.5, -0.0, 3.0, float("inf"), -float("inf"), 1e300, None, -2.25]),
    "nullable": pd.Series([1, None, 3, 4, None, 6, 7, 8], dtype="Int64"),
    "times": pd.Series(pd.to_datetime(["2026-01-01 00:00:00", "1969-12-31 23:59:59.5", None, "2000-02-29 00:00:00"] * 2, format="ISO8601")),
    "zoned": pd.Series(pd.to_datetime(["2026-01-01 12:00", "2026-06-01 00:30", None, "2026-03-29 02:30"] * 2)).dt.tz_localize(
        "Europe/Paris", nonexistent="shift_forward"),
    "spans": pd.Series(pd.to_timedelta([0, 1, -5, None, 10**15, 3, 3, 2], unit="ns")),
}


@pytest.mark.parametrize("column", list(RAW_COLUMNS))
def test_each_rows_coupon_is_the_one_datasketches_adds_for_its_value(column):
    frame = pd.DataFrame({column: RAW_COLUMNS[column]})
    groups, coupons = ApproxDistinct(column).coupons(frame, Grouping.single(frame))
    fed = _hll_values(frame[column].dropna())  # what the library path feeds the sketch, value by value
    assert len(coupons) == len(fed) == len(groups)
    for value, coupon in zip(fed, coupons.tolist()):
        one = datasketches.hll_sketch(12, HLL_8)
        one.update(value)
        assert coupons_of(one.serialize_compact()) == {coupon}, (column, value)


def test_random_longs_hash_to_the_coupons_datasketches_makes():
    values = np.random.default_rng(5).integers(-(2**63), 2**63 - 1, 5000, dtype=np.int64)
    frame = pd.DataFrame({"v": values})
    _, coupons = ApproxDistinct("v").coupons(frame, Grouping.single(frame))
    assert set(coupons.tolist()) == coupons_of(sketch(values.tolist(), lg_k=21).serialize_compact())


def test_strings_have_no_numpy_coupons():
    frame = pd.DataFrame({"v": ["a", "b"]})
    assert ApproxDistinct("v").coupons(frame, Grouping.single(frame)) is None


def group_values(seed: int, lg_k: int) -> pd.DataFrame:
    """Groups from one value to past the coupon limit (they turn into registers), with repeats and nulls."""
    rng = np.random.default_rng(seed)
    sizes = [1, 3, coupon_limit(lg_k), coupon_limit(lg_k) + 20, 4 * coupon_limit(lg_k)]
    keys = np.repeat(np.arange(len(sizes)), sizes)
    frame = pd.DataFrame({"k": keys, "v": rng.integers(0, 10**12, len(keys)).astype(float)})
    frame = pd.concat([frame, pd.DataFrame({"k": [0, 3], "v": [np.nan, np.nan]})], ignore_index=True)
    return pd.concat([frame, frame.iloc[::3]], ignore_index=True).sample(frac=1, random_state=seed)


@pytest.mark.parametrize("lg_k", [7, 12])
def test_raw_rows_give_the_coupons_and_registers_of_a_datasketches_sketch_per_group(lg_k):
    frame = group_values(lg_k, lg_k)
    agg = ApproxDistinct("v", lg_k=lg_k)
    field = HllField(lg_k)
    grouping = Grouping.of(frame, "k")
    got = field.from_rows(agg, frame, grouping)
    expected = field.from_partials(agg._grouped(frame, grouping))  # a sketch per group, updated value by value
    assert got.dense_rows.tolist() == expected.dense_rows.tolist() and len(got.dense_rows) == 2
    assert np.array_equal(got.registers, expected.registers)
    pairs = lambda c: sorted(zip(c.rows.tolist(), c.coupons.tolist()))  # noqa: E731
    assert pairs(got) == pairs(expected)
    assert field.results(got).tolist() == field.results(expected).tolist()


def test_a_block_of_raw_rows_equals_the_block_of_their_partials():
    aggs = Aggregations({**SCALARS, "viewers": ApproxDistinct("x"), "named": Count("y"), "words": ApproxDistinct("y")})
    lay = ColumnarLayout.of(aggs)
    frame = pd.DataFrame({"k": [3, 1, 3, 2, 1, 3], "x": [1, 5, None, -3, 5, 8], "y": ["a", None, "b", "a", "c", "b"]})
    grouping = Grouping.of(frame, "k")
    from_rows = lay.from_rows(aggs, frame, grouping)
    from_partials = lay.from_accumulators([acc for _, acc in aggs.rows(aggs.partials(frame, ["k"]))])
    assert lay.encode(from_rows) == lay.encode(from_partials)


def tweet_layout():
    aggs = Aggregations({"views": Count(), "viewers": ApproxDistinct("user", lg_k=7)})
    return aggs, ColumnarLayout.of(aggs)


def chunks(seed: int, n: int = 6):
    rng = np.random.default_rng(seed)
    return [pd.DataFrame({"tweet": rng.integers(0, 30, 200), "user": rng.integers(0, 500, 200)}) for _ in range(n)]


@pytest.mark.parametrize("fold_rows", [1, 450, 10**6], ids=["every chunk", "some chunks", "at the end"])
def test_rows_folded_early_give_the_block_of_one_fold(fold_rows):
    aggs, lay = tweet_layout()
    frames = chunks(1)
    partials = RowPartials(["tweet"], None, lay, aggs, fold_rows=fold_rows)
    for frame in frames:
        partials.add(frame, arrival_ms=0)
    assert len(partials) == 1200
    keys, block, rows = partials.drain()
    whole = pd.concat(frames, ignore_index=True)
    order = pd.unique(whole["tweet"]).tolist()
    assert keys == order  # first-arrival order
    assert rows == whole["tweet"].value_counts()[order].tolist()
    grouping = Grouping.of(whole, "tweet")
    assert lay.encode(block) == lay.encode(lay.from_rows(aggs, whole, grouping))
    assert len(partials) == 0 and partials.drain()[0] == []


def test_an_object_key_column_of_mixed_types_gives_one_row_per_key():
    aggs, lay = tweet_layout()
    partials = RowPartials(["tweet"], None, lay, aggs)
    partials.add(pd.DataFrame({"tweet": pd.Series([1, 1.0, True, 2], dtype=object), "user": [1, 2, 3, 4]}), arrival_ms=0)
    keys, block, rows = partials.drain()
    assert len(keys) == len(set(keys)) == len(rows) == lay.fields[0].length(block[0])
    assert sum(rows) == 4 and lay.results(block)["views"].tolist() == rows


def test_a_chunk_without_the_input_column_is_refused_naming_it():
    aggs, lay = tweet_layout()
    partials = RowPartials(["tweet"], None, lay, aggs)
    with pytest.raises(KeyError, match="user"):
        partials.add(pd.DataFrame({"tweet": [1]}), arrival_ms=0)
    assert len(partials) == 0


# ---------------------------------------------------------------- partials as a column, vectorized
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from buffering.aggregations.columnar import _scalar_column, _scalar_column_of_array  # noqa: E402

PARTIAL_VALUES = st.one_of(
    st.none(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.booleans(), st.text(max_size=3),
    st.integers(-(2**63), 2**63 - 1).map(np.int64), st.floats(width=32).map(np.float32),
)


def columns_equal(a, b) -> bool:
    return a.tags.tolist() == b.tags.tolist() and a.bits.tolist() == b.bits.tolist() and a.objects == b.objects


def per_value(values):
    return _scalar_column([p.item() if isinstance(p, np.generic) else p for p in values])


@settings(max_examples=300, deadline=None)
@given(st.lists(PARTIAL_VALUES, max_size=12))
def test_an_object_array_of_partials_becomes_the_column_the_per_value_loop_makes(values):
    array = np.empty(len(values), dtype=object)
    array[:] = values
    column = _scalar_column_of_array(array)
    assert column is None or columns_equal(column, per_value(array))
    if all(v is None or type(v) is float or (type(v) is int and -(2**63) <= v < 2**63) for v in values):
        assert column is not None  # ints that fit, floats and None need no Python step per value


@pytest.mark.parametrize("array", [
    np.array([0, 3, -7, 2**63 - 1, -(2**63)], dtype=np.int64),
    np.array([1, 2, 3], dtype=np.int32),
    np.array([0, 2**63 - 1], dtype=np.uint64),
    np.array([1.5, -0.0, np.nan, np.inf], dtype=np.float64),
    np.array([0.25, -2.0], dtype=np.float32),
    np.array([], dtype=np.int64),
], ids=["int64", "int32", "uint64 that fits", "float64", "float32", "empty"])
def test_a_numeric_array_of_partials_becomes_the_column_of_its_python_values(array):
    column = _scalar_column_of_array(array)
    assert column is not None and columns_equal(column, per_value(array))


@pytest.mark.parametrize("array", [
    np.array([2**63], dtype=np.uint64), np.array([True, False]), np.array(["a", "b"], dtype=object),
    np.array([1, 2**64], dtype=object), np.zeros((2, 2), dtype=np.int64),
], ids=["uint64 past int64", "bools", "strings", "an int past int64", "two dimensions"])
def test_partials_the_vectorized_path_does_not_take_are_left_to_the_loop(array):
    assert _scalar_column_of_array(array) is None


@pytest.mark.parametrize("rows", [5, 300])  # below and above the word path's 64 rows
@pytest.mark.parametrize("width", [3, 8, 45])
def test_fill_writes_the_constant_at_every_position_and_nothing_else(rows, width):
    rng = np.random.default_rng(rows + width)
    gaps = rng.integers(0, 11, rows)  # every residue mod 8, rows back to back included
    pos = np.cumsum(gaps + width) - width
    buf = np.full(int(pos[-1]) + width + int(rng.integers(0, 9)), 0xEE, dtype=np.uint8)
    constant = rng.integers(0, 256, width, dtype=np.uint8)
    expected = buf.copy()
    for p in pos.tolist():
        expected[p : p + width] = constant
    _fill(buf, pos, constant)
    assert buf.tobytes() == expected.tobytes()
