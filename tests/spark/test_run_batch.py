"""The Spark bounded runner: ``buffering.spark.bounded.run_batch`` and its partition function.

Spark tests compare ``run_batch`` with ``LocalRunner`` given all rows in one
batch (each key's final output row). The partition function is also tested
without Spark, on plain pandas frames.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import pandas as pd
import pytest

import buffering
from buffering import ApproxDistinct, Count, LocalRunner, spec_of
from buffering.spark.bounded import BoundedPlan, process_partition, run_batch
from pyspark.sql.streaming import StatefulProcessor
from state.group_state import GroupStateTimeout

STATS_SCHEMA = "tweet long, n long, users long"


# ------------------------------------------------------------------ operators


def count_and_list(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """Count of the key's rows and its ``x`` values in the order received; state: (count,)."""
    frames = list(rows)
    (count,) = state.get if state.exists else (0,)
    xs = [int(x) for frame in frames for x in frame["x"]]
    count += len(xs)
    state.update((count,))
    yield pd.DataFrame({"tweet": [key[0]], "n": [count], "xs": [xs]})


@buffering.mini_batch(combine={"n": Count(), "users": ApproxDistinct("user")})
def combined_stats(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """Views and approximate viewers of a tweet, from combined rows (one per call)."""
    views, viewers = Count(), ApproxDistinct("user")
    n, users = (state.get[0], state.get[1]) if state.exists else (0, viewers.empty())
    for row in rows:
        n = views.merge(n, int(row["n"].iloc[0]))
        users = viewers.merge(users, row["users"].iloc[0])
    state.update((n, users))
    yield pd.DataFrame({"tweet": [key[0]], "n": [n], "users": [viewers.result(users)]})


AGGREGATE = buffering.aggregate({"n": Count(), "users": ApproxDistinct("user")})

OPERATORS = {
    "plain": (count_and_list, "tweet long, n long, xs array<long>"),
    "combine": (combined_stats, STATS_SCHEMA),
    "aggregate": (AGGREGATE, None),
}


# ------------------------------------------------------------------ helpers


def views(n: int = 300, tweets: int = 25, seed: int = 7) -> pd.DataFrame:
    """``n`` views: tweet (int64, skewed), user (str), x (the row's position, to check order)."""
    rng = np.random.default_rng(seed)
    tweet = np.minimum(rng.geometric(0.15, n), tweets).astype(np.int64)
    return pd.DataFrame({"tweet": tweet, "user": [f"u{u}" for u in rng.integers(0, 40, n)], "x": np.arange(n)})


def local_final(fn: Any, pdf: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """LocalRunner with all rows in one batch: the last output row per key, sorted by key."""
    runner = LocalRunner(fn, key=key)
    try:
        out = runner.process(pdf)
    finally:
        runner.close()
    return tidy(out.drop_duplicates(key, keep="last"), key)


def tidy(frame: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """Sorted by key, fresh index, comparable values: arrays as lists of int, integer columns as int64."""
    frame = frame.sort_values(key).reset_index(drop=True)
    for column in frame.columns:
        values = frame[column].tolist()
        if values and isinstance(values[0], (list, np.ndarray)):
            frame[column] = [[int(x) for x in v] for v in values]
        elif values and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
            frame[column] = np.asarray(values, dtype=np.int64)
    return frame


def collect(df: Any, key: list[str]) -> pd.DataFrame:
    return tidy(df.toPandas(), key)


@contextmanager
def spark_conf(spark: Any, name: str, value: str) -> Iterator[None]:
    """Set a session conf for the block, restoring the previous value (or unsetting it) after."""
    previous = spark.conf.get(name, None)
    spark.conf.set(name, value)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(name)
        else:
            spark.conf.set(name, previous)


def plan_for(fn: Any, output_columns: tuple[str, ...], key: tuple[str, ...] = ("tweet",), **kw: Any) -> BoundedPlan:
    return BoundedPlan(spec=spec_of(fn), key_columns=key, output_columns=output_columns, processing_time_ms=1_000, **kw)


def split(frame: pd.DataFrame, sizes: list[int]) -> list[pd.DataFrame]:
    """``frame`` cut into consecutive frames of ``sizes`` rows, each with a fresh index (like Arrow batches)."""
    out, start = [], 0
    for size in sizes:
        out.append(frame.iloc[start : start + size].reset_index(drop=True))
        start += size
    assert start == len(frame)
    return out


# ------------------------------------------------------------------ the partition function, without Spark


def test_partition_function_carries_keys_across_batches() -> None:
    pdf = views(60, tweets=6).sort_values("tweet", kind="stable").reset_index(drop=True)
    batches = split(pdf, [1, 7, 2, 20, 13, 4, 13])  # cuts fall inside keys, one batch is inside one key
    out = pd.concat(process_partition(plan_for(count_and_list, ("tweet", "n", "xs")), iter(batches)))
    assert tidy(out, ["tweet"]).equals(local_final(count_and_list, pdf, ["tweet"]))


def test_partition_function_aggregates_across_batches() -> None:
    pdf = views(60, tweets=6).sort_values("tweet", kind="stable").reset_index(drop=True)
    batches = split(pdf, [1, 7, 2, 20, 13, 4, 13])
    out = pd.concat(process_partition(plan_for(AGGREGATE, ("tweet", "n", "users")), iter(batches)))
    assert tidy(out, ["tweet"]).equals(local_final(AGGREGATE, pdf, ["tweet"]))


def test_partition_function_combines_across_batches() -> None:
    pdf = views(60, tweets=6).sort_values("tweet", kind="stable").reset_index(drop=True)
    batches = split(pdf, [1, 7, 2, 20, 13, 4, 13])
    out = pd.concat(process_partition(plan_for(combined_stats, ("tweet", "n", "users")), iter(batches)))
    assert tidy(out, ["tweet"]).equals(local_final(combined_stats, pdf, ["tweet"]))


def test_partition_function_applies_a_callable_combiner_to_all_rows_of_a_key() -> None:
    @buffering.mini_batch(combine=lambda rows: rows.groupby("user", as_index=False).size())
    def per_user(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        (frame,) = list(rows)
        yield pd.DataFrame({"tweet": [key[0]], "pairs": [sorted(zip(frame["user"], frame["size"]))]})

    pdf = views(60, tweets=6).sort_values("tweet", kind="stable").reset_index(drop=True)
    out = pd.concat(process_partition(plan_for(per_user, ("tweet", "pairs")), iter(split(pdf, [5, 30, 25]))))
    expected = pdf.groupby("tweet").apply(lambda g: sorted(g["user"].value_counts().items()), include_groups=False)
    assert dict(zip(out["tweet"], out["pairs"])) == expected.to_dict()


def test_partition_function_output_keeps_datetime_and_extension_dtypes() -> None:
    def stamped(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        n = sum(len(f) for f in rows)
        yield pd.DataFrame({"tweet": [key[0]], "n": pd.array([n], dtype="Int64"),
                            "at": [pd.Timestamp("2026-01-01") + pd.Timedelta(seconds=n)]})

    pdf = pd.DataFrame({"tweet": [1, 1, 2, 3, 3, 3], "x": range(6)})
    out = pd.concat(process_partition(plan_for(stamped, ("tweet", "at", "n")), iter([pdf])))
    assert list(out.columns) == ["tweet", "at", "n"]
    assert str(out["n"].dtype) == "Int64" and out["at"].dtype.kind == "M"
    assert out["n"].tolist() == [2, 1, 3]


def test_partition_function_yields_nothing_for_no_rows() -> None:
    plan = plan_for(count_and_list, ("tweet", "n", "xs"))
    assert list(process_partition(plan, iter([views(0), views(0)]))) == []


def test_partition_function_names_a_missing_output_column() -> None:
    plan = plan_for(count_and_list, ("tweet", "n", "missing"))
    with pytest.raises(ValueError, match=r"output column\(s\) \['missing'\]"):
        list(process_partition(plan, iter([views(10)])))


def test_partition_function_fires_a_timeout_once_per_key() -> None:
    calls: list[tuple[int, bool, Any]] = []

    def session(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        frames = list(rows)
        calls.append((key[0], state.hasTimedOut, state.getOption))
        if not state.hasTimedOut:
            state.update((sum(len(f) for f in frames),))
            state.setTimeoutDuration(10)
        else:
            state.setTimeoutDuration(10)  # set again while timing out: never fires
        yield pd.DataFrame({"tweet": [key[0]], "timed_out": [state.hasTimedOut]})

    pdf = pd.DataFrame({"tweet": [1, 1, 2, 2, 2], "x": range(5)})
    plan = plan_for(session, ("tweet", "timed_out"), timeout_conf=GroupStateTimeout.ProcessingTimeTimeout)
    out = pd.concat(process_partition(plan, iter(split(pdf, [1, 3, 1]))))
    assert calls == [(1, False, None), (1, True, (2,)), (2, False, None), (2, True, (3,))]
    assert out["timed_out"].tolist() == [False, True, False, True]


# ------------------------------------------------------------------ run_batch on Spark


@pytest.mark.spark
@pytest.mark.parametrize(
    "operator, sql_combine",
    [("plain", None), ("combine", True), ("combine", False), ("aggregate", True), ("aggregate", False)],
)
def test_run_batch_equals_local_runner(spark: Any, operator: str, sql_combine: Any) -> None:
    fn, schema = OPERATORS[operator]
    pdf = views()
    out = run_batch(spark.createDataFrame(pdf), fn, key="tweet", output_schema=schema,
                    combine_before_shuffle=sql_combine, progress=False)
    assert collect(out, ["tweet"]).equals(local_final(fn, pdf, ["tweet"]))


@pytest.mark.spark
def test_combine_before_shuffle_needs_sql_twins(spark: Any) -> None:
    fn = buffering.aggregate({"n": Count(), "first": buffering.First("x")})
    with pytest.raises(ValueError, match="exact Spark SQL twin"):
        run_batch(spark.createDataFrame(views(10)), fn, key="tweet", combine_before_shuffle=True, progress=False)


@pytest.mark.spark
@pytest.mark.parametrize("operator", ["plain", "combine", "aggregate"])
def test_keys_spanning_arrow_batches(spark: Any, operator: str) -> None:
    fn, schema = OPERATORS[operator]
    pdf = views(200, tweets=8)  # ~25 rows per key, batches of 3 rows: every key spans batches
    with spark_conf(spark, "spark.sql.execution.arrow.maxRecordsPerBatch", "3"):
        out = collect(run_batch(spark.createDataFrame(pdf), fn, key="tweet", output_schema=schema,
                                parallelism=2, combine_before_shuffle=False, progress=False), ["tweet"])
    assert out.equals(local_final(fn, pdf, ["tweet"]))


@pytest.mark.spark
def test_rows_of_a_key_keep_input_partition_order(spark: Any) -> None:
    pdf = views(200, tweets=5)
    df = spark.createDataFrame(pdf).repartition(3)  # rows now in some other partition order
    expected = df.rdd.mapPartitions(lambda rows: [[r["x"] for r in rows]]).collect()  # partition by partition
    position = {x: i for i, x in enumerate(x for part in expected for x in part)}
    out = collect(run_batch(df, count_and_list, key="tweet", output_schema=OPERATORS["plain"][1], progress=False),
                  ["tweet"])
    for xs in out["xs"]:
        assert [position[x] for x in xs] == sorted(position[x] for x in xs)


@pytest.mark.spark
def test_two_key_columns(spark: Any) -> None:
    pdf = views(150, tweets=6)
    pdf["kind"] = np.where(pdf["x"] % 3 == 0, "reply", "view")

    def per_pair(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        frame = pd.concat(list(rows))
        yield pd.DataFrame({"tweet": [key[0]], "kind": [key[1]], "n": [len(frame)], "xs": [frame["x"].tolist()]})

    out = run_batch(spark.createDataFrame(pdf), per_pair, key=["tweet", "kind"],
                    output_schema="tweet long, kind string, n long, xs array<long>", progress=False)
    got = collect(out, ["tweet", "kind"])
    assert got.equals(local_final(per_pair, pdf, ["tweet", "kind"]))
    assert len(got) == len(pdf.groupby(["tweet", "kind"]))


@pytest.mark.spark
def test_timeout_set_by_fn_fires_once_at_end_of_key(spark: Any) -> None:
    def session(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        n = sum(len(f) for f in rows)
        if state.hasTimedOut:
            (total,) = state.get
            state.setTimeoutDuration(5)  # never fires: the key has ended
            yield pd.DataFrame({"tweet": [key[0]], "event": ["timeout"], "n": [total]})
        else:
            state.update((n,))
            state.setTimeoutDuration(60_000)
            yield pd.DataFrame({"tweet": [key[0]], "event": ["data"], "n": [n]})

    pdf = views(120, tweets=5)
    out = run_batch(spark.createDataFrame(pdf), session, key="tweet", output_schema="tweet long, event string, n long",
                    timeout="processing", progress=False).toPandas()
    counts = pdf.groupby("tweet").size()
    assert sorted(out.itertuples(index=False, name=None)) == sorted(
        [(t, "data", n) for t, n in counts.items()] + [(t, "timeout", n) for t, n in counts.items()]
    )


@pytest.mark.spark
def test_progress_returns_the_persisted_result(spark: Any) -> None:
    pdf = views(100)
    out = run_batch(spark.createDataFrame(pdf), AGGREGATE, key="tweet", progress=True)
    try:
        assert out.is_cached
        assert collect(out, ["tweet"]).equals(local_final(AGGREGATE, pdf, ["tweet"]))
    finally:
        out.unpersist()


@pytest.mark.spark
def test_streaming_df_is_rejected(spark: Any) -> None:
    stream = spark.readStream.format("rate").load()
    with pytest.raises(ValueError, match="streaming DataFrame"):
        run_batch(stream, AGGREGATE, key="value", progress=False)


@pytest.mark.spark
def test_missing_key_column_is_rejected(spark: Any) -> None:
    with pytest.raises(ValueError, match=r"\['nope'\]"):
        run_batch(spark.createDataFrame(views(10)), AGGREGATE, key=["tweet", "nope"], progress=False)


@pytest.mark.spark
def test_missing_aggregation_input_column_is_rejected(spark: Any) -> None:
    with pytest.raises(ValueError, match=r"\['viewer'\]"):
        run_batch(spark.createDataFrame(views(10)), buffering.aggregate({"u": ApproxDistinct("viewer")}), key="tweet",
                  progress=False)


@pytest.mark.spark
@pytest.mark.parametrize("parallelism", [0, 129, 2.5, True])
def test_bad_parallelism_is_rejected(spark: Any, parallelism: Any) -> None:
    with pytest.raises(ValueError, match=f"parallelism must be .*got {parallelism!r}"):
        run_batch(spark.createDataFrame(views(10)), AGGREGATE, key="tweet", parallelism=parallelism, progress=False)


@pytest.mark.spark
@pytest.mark.slow  # the failing task is attempted 4 times (local[2,4])
def test_missing_output_column_fails_the_job(spark: Any) -> None:
    df = spark.createDataFrame(views(20))
    with pytest.raises(Exception, match=r"output column\(s\) \['xs2'\]"):  # a PythonException from the task
        run_batch(df, count_and_list, key="tweet", output_schema="tweet long, n long, xs2 array<long>",
                  parallelism=1, progress=False).collect()  # one task: its retries are the only repeats


# ------------------------------------------------------------------ transformWithStateInPandas processors


class CountThenRemind(StatefulProcessor):
    """Rows per key in a ValueState; a timer emits the count again, negated, when it fires."""

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        n = (self.count.get() or (0,))[0] + sum(len(f) for f in rows)
        self.count.update((n,))
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 10)
        yield pd.DataFrame({"tweet": [int(key[0])], "n": [n]})

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        yield pd.DataFrame({"tweet": [int(key[0])], "n": [-self.count.get()[0]]})


def test_partition_function_runs_a_processor_per_key_and_fires_its_timers_when_its_rows_end() -> None:
    pdf = pd.DataFrame({"tweet": [1, 1, 2, 2, 2], "x": range(5)})
    plan = plan_for(CountThenRemind(), ("tweet", "n"), timeout_conf=GroupStateTimeout.ProcessingTimeTimeout,
                    key_types=("long",))
    out = pd.concat(process_partition(plan, iter(split(pdf, [1, 3, 1]))))
    assert out.values.tolist() == [[1, 2], [1, -2], [2, 3], [2, -3]]


@pytest.mark.spark
def test_run_batch_runs_a_processor_with_one_call_per_key(spark: Any) -> None:
    pdf = views()
    out = run_batch(spark.createDataFrame(pdf), CountThenRemind(), key="tweet", output_schema="tweet long, n long",
                    time_mode="ProcessingTime", progress=False)
    got = collect(out, ["tweet", "n"])
    counts = pdf.groupby("tweet").size()
    expected = sorted([(int(t), int(n)) for t, n in counts.items()] + [(int(t), -int(n)) for t, n in counts.items()])
    assert sorted(got.itertuples(index=False, name=None)) == expected
