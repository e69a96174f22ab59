"""The map-side combine in Spark SQL gives exactly the partials of the Python combine."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

import buffering
from buffering import ApproxDistinct, Count, First, Max, Mean, Min, Sum
from buffering.aggregations import Aggregations
from buffering.spark._sql_combine import accumulators, sql_partials
from checkpoint.storage import batch_metrics_path

from .helpers import all_rows, collect_sink, stream_of, write_batches

SCHEMA = StructType(
    [StructField("k", LongType()), StructField("x", LongType()), StructField("s", StringType()), StructField("f", DoubleType())]
)


def test_integral_and_string_aggregations_have_sql_twins():
    aggs = Aggregations({"n": Count(), "nx": Count("x"), "sx": Sum("x"), "mx": Mean("x"), "lo": Min("s"), "hi": Max("x"), "u": ApproxDistinct("s")})
    assert [p.kind for p in sql_partials(aggs, SCHEMA)] == ["count", "count", "sum", "mean", "pick_str", "pick_int", "hll"]


@pytest.mark.parametrize(
    "agg",
    [Sum("f"), Count("f"), Min("f"), First("x"), ApproxDistinct("f")],
    ids=["sum-double", "count-double", "min-double", "first", "hll-double"],
)
def test_aggregations_without_an_exact_sql_twin_fall_back_to_python(agg):
    assert sql_partials(Aggregations({"a": agg}), SCHEMA) is None


def test_each_rows_accumulator_holds_its_partials_with_none_where_no_value_was_non_null():
    datasketches = pytest.importorskip("datasketches")
    sketch = datasketches.hll_sketch(12)
    sketch.update("a")
    aggs = Aggregations({"n": Count(), "sx": Sum("x"), "mx": Mean("x"), "lo": Min("s"), "hi": Max("x"), "u": ApproxDistinct("s")})
    partials = sql_partials(aggs, SCHEMA)
    values = {
        "count": [[3, 1]],
        "sum": [[2**60, 0], [2, 0]],
        "mean": [[9, 0], [3, 0]],
        "pick_str": [["b", None], [1, 0]],
        "pick_int": [[-7, 0], [2, 0]],
        "hll": [[sketch.serialize_compact(), bytearray(sketch.serialize_compact())]],
    }
    frame = pd.DataFrame({c: v for p in partials for c, v in zip(p.columns, values[p.kind])})
    first, second = accumulators(frame, partials)
    assert {k: v for k, v in first.items() if k != "u"} == {"n": 3, "sx": 2**60, "mx": (9, 3), "lo": "b", "hi": -7}
    assert {k: v for k, v in second.items() if k != "u"} == {"n": 1, "sx": None, "mx": (0, 0), "lo": None, "hi": None}
    assert [round(a["u"].estimate()) for a in (first, second)] == [1, 1]


@pytest.mark.spark
@pytest.mark.slow
def test_sql_combine_equals_python_combine_with_nulls_and_large_integers(spark, tmp_path):
    rng = np.random.default_rng(4)
    frames = []
    for b in range(2):
        n = 400
        x = pd.array(rng.integers(-(2**55), 2**55, n), dtype="Int64")  # beyond float precision, sums within int64
        x[rng.random(n) < 0.2] = pd.NA  # some keys see only nulls
        s = pd.Series([f"s{v}" for v in rng.integers(0, 50, n)], dtype=object)
        s[rng.random(n) < 0.2] = None
        frames.append(pd.DataFrame({"k": rng.integers(0, 30, n).astype(np.int64), "x": x, "s": s, "f": rng.random(n)}))
    source = write_batches(str(tmp_path / "in"), frames)
    operator = buffering.aggregate(
        {"n": Count(), "nx": Count("x"), "sx": Sum("x"), "mx": Mean("x"), "lo": Min("s"), "hi": Max("x"), "u": ApproxDistinct("s")}
    )
    results = {}
    for combine in (True, False):
        out: list = []
        query = buffering.spark.run_stream(
            stream_of(spark, source, "k long, x long, s string, f double"),
            operator,
            key="k",
            checkpoint_location=str(tmp_path / f"ck-{combine}"),
            sink=collect_sink(out),
            trigger={"availableNow": True},
            combine_before_shuffle=combine,
        )
        query.awaitTermination()
        assert query.runner.combine == ("sql" if combine else "none")
        results[combine] = all_rows(out, ["k"])
    pd.testing.assert_frame_equal(results[True], results[False])


def _rows(rng: np.random.Generator, n: int, keys: int) -> pd.DataFrame:
    """``n`` rows of ``keys`` keys (about n / keys rows per key)."""
    return pd.DataFrame({"k": rng.integers(0, keys, n).astype(np.int64), "x": rng.integers(0, 99, n).astype(np.int64),
                         "s": "a", "f": 0.5})


@pytest.mark.spark
@pytest.mark.slow
def test_the_sql_combine_is_skipped_after_a_batch_with_few_rows_per_key_and_resumed_after_one_with_many(spark, tmp_path):
    """Left to choose, run_stream sends a batch's rows as they are when the previous batch had fewer than
    RAW_ROWS_PER_KEY rows per key (the combine shrinks too little): the outputs stay those of the combine."""
    from buffering.spark.stream import RAW_ROWS_PER_KEY

    rng = np.random.default_rng(8)
    # about 1.2, 8, 80 and 80 rows per key
    frames = [_rows(rng, 60, 50), _rows(rng, 400, 50), _rows(rng, 400, 5), _rows(rng, 400, 5)]
    source = write_batches(str(tmp_path / "in"), frames)
    operator = buffering.aggregate({"n": Count(), "sx": Sum("x"), "u": ApproxDistinct("x")})
    results, combines = {}, {}
    for combine in (None, True):
        out: list = []
        query = buffering.spark.run_stream(
            stream_of(spark, source, "k long, x long, s string, f double"), operator, key="k",
            checkpoint_location=str(tmp_path / f"ck-{combine}"), sink=collect_sink(out), trigger={"availableNow": True},
            combine_before_shuffle=combine, parallelism=2,
        )
        query.awaitTermination()
        combines[combine] = [m.combine for m in query.batch_metrics]
        results[combine] = all_rows(out, ["k"])
    assert 8 < RAW_ROWS_PER_KEY < 80  # the batches above fall on either side of it
    assert combines == {None: ["sql", "none", "none", "sql"], True: ["sql"] * 4}
    pd.testing.assert_frame_equal(results[None], results[True])


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    "aggregations, combine, placement",
    [
        ({"n": Count(), "sx": Sum("x")}, False, "batch"),  # raw rows, folded as columns by the instances
        ({"n": Count(), "fx": First("x")}, True, "batch"),  # First has no SQL twin: the Python combine
        ({"n": Count(), "sx": Sum("x")}, False, "executor"),  # raw rows through Spark's stateful operator
    ],
    ids=["raw-rows", "python-combine", "executor-placement"],
)
def test_an_aggregate_reads_only_its_columns_so_others_of_any_type_never_reach_python(
    spark, tmp_path, aggregations, combine, placement
):
    """A year-month interval has no Arrow conversion to pandas (mapInPandas over it fails): an aggregate
    that does not read such a column ships only its key and input columns, and its results are those of
    the same input without the column."""
    from pyspark.sql import functions as F

    rng = np.random.default_rng(11)
    frames = [
        pd.DataFrame({"k": rng.integers(0, 20, 200).astype(np.int64), "x": rng.integers(0, 99, 200).astype(np.int64),
                      "s": "a", "f": 0.5})
        for _ in range(2)
    ]
    source = write_batches(str(tmp_path / "in"), frames)
    operator = buffering.aggregate(aggregations)
    results = {}
    for extra in (False, True):
        stream = stream_of(spark, source, "k long, x long, s string, f double")
        if extra:
            stream = stream.withColumn("extra", F.make_ym_interval(F.lit(1), F.lit(2)))
        out: list = []
        query = buffering.spark.run_stream(
            stream, operator, key="k", checkpoint_location=str(tmp_path / f"ck-{extra}"), sink=collect_sink(out),
            trigger={"availableNow": True}, combine_before_shuffle=combine, placement=placement, parallelism=2,
        )
        query.awaitTermination()
        assert query.runner.combine == ("python" if combine else "none")
        results[extra] = all_rows(out, ["k"])
    assert len(results[True]) > 0
    pd.testing.assert_frame_equal(results[True], results[False])


@pytest.mark.spark
@pytest.mark.slow
def test_a_restarted_query_skips_the_sql_combine_when_its_last_committed_batch_had_few_rows_per_key(spark, tmp_path):
    """The first batch after a restart is decided as the next batch of the last run would have been."""
    rng = np.random.default_rng(9)
    source = write_batches(str(tmp_path / "in"), [_rows(rng, 60, 50)])  # about 1.2 rows per key
    operator = buffering.aggregate({"n": Count(), "sx": Sum("x")})

    def run() -> list[str]:
        query = buffering.spark.run_stream(
            stream_of(spark, source, "k long, x long, s string, f double"), operator, key="k",
            checkpoint_location=str(tmp_path / "ck"), sink=collect_sink([]), trigger={"availableNow": True}, parallelism=2,
        )
        query.awaitTermination()
        return [m.combine for m in query.batch_metrics]

    assert run() == ["sql"]  # a new query has nothing to go by
    write_batches(source, [_rows(rng, 400, 5)], first=1)  # about 80 rows per key
    assert run() == ["none"]  # after 1.2 rows per key in the last committed batch
    write_batches(source, [_rows(rng, 60, 50)], first=2)
    assert run() == ["sql"]  # after 80
    record = tmp_path / "ck" / batch_metrics_path(2)  # the record of that 1.2-rows-per-key batch
    assert record.exists()
    record.write_bytes(b"{torn")
    write_batches(source, [_rows(rng, 400, 5)], first=3)
    assert run() == ["sql"]  # a damaged record is not trusted: combined, as by a new query
