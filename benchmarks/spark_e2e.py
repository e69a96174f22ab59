"""Tweet stats at scale, end to end in Spark: applyInPandasWithState vs run_stream vs the floor.

Workload: ``--views`` views (default 2,000,000) of tweets by ``--users`` users
(default 25,000), tweet ids zipf-skewed over the cardinality (weight of the
tweet of rank r is ``1 / r**--zipf``, default 1.0), users uniform, generated
vectorized from ``numpy.random.default_rng([seed, cardinality])``. Columns
``tweet``, ``user``, ``ts`` (all long). The views are written as ``--batches``
parquet files (default 4) and read back with
``spark.readStream.schema(...).option("maxFilesPerTrigger", 1).parquet(dir)``
and ``trigger(availableNow=True)``: one micro-batch per file. Tweet
cardinalities: 100k, 10k, 1k, 20.

The variants (each with fresh checkpoint and output directories):

(a) ``groupBy("tweet").applyInPandasWithState(tweet_stats, ...)``, what a user
    writes: state ``(views long, hll binary)`` holds the count and a serialized
    ``datasketches.hll_sketch`` (lg_k 12, HLL_8, as ``ApproxDistinct``); the
    function deserializes it, loops over the rows updating the sketch one user
    at a time, serializes it back and emits ``(tweet, views, viewers)``.
(b) ``run_stream`` with the same function decorated
    ``@mini_batch()`` (no combiner, no trigger: one call per key per
    micro-batch, as in (a)) and ``@cached_state(max_entries=--max-entries,
    store="rocksdb")``.
(c) ``run_stream`` with ``cached_state(max_entries=..., store="rocksdb")(
    aggregate({"views": Count(), "viewers": ApproxDistinct("user")}))``
    (map-side combine before the shuffle, the runner's default; the default
    ``layout="auto"``: key-group blocks while the state fits the cache).
(d) the floor: the same source, ``foreachBatch``: ``repartition(P, "tweet")``,
    an identity ``mapInPandas`` and the ``noop`` sink.
(e) Spark SQL's own streaming aggregation: ``groupBy("tweet").agg(count(lit(1)),
    approx_count_distinct("user", 0.0173))`` (HyperLogLog++ with 2**12
    registers, as many as ``ApproxDistinct(lg_k=12)``), update mode, the RocksDB
    state store, the same parquet sink.
(g) (c) with ``cached_state(..., layout="key_group")``: the state kept as one
    block per key group, in the cache and in RocksDB (``state.blocks``).
(k) (c) with ``cached_state(..., layout="key")``: one record per key (the
    default before ``"auto"``).
(h) (g) with ``run_stream(combine_before_shuffle=False)``: no SQL combine, the
    rows are shuffled as they are (as in (d)) and each operator instance folds
    its batch's rows as columns (``ApproxDistinct`` hashed with numpy).
(f) the ceiling of (c): in ``foreachBatch``, exactly (c)'s Spark plan (map-side
    SQL combine, operator index, ``repartitionById``) into a ``mapInPandas``
    that reads every chunk and does nothing else; ``noop`` sink. What (c)
    costs with no operator work at all.
(i) the ceiling of (h) with ``--placement executor``: the plan
    ``placement="executor"`` runs without a combine (operator index, its
    ``mapInArrow`` adding each row's host key and the heartbeats,
    ``groupBy(host).applyInPandasWithState`` in update mode with Spark's
    state store, one group per instance) with a hosted function that reads
    its rows and yields nothing; ``noop`` sink in
    ``foreachBatch``. What hosting the instances costs with no operator work
    (compare (h) run with ``--placement executor`` against it).

(a), (b) and (c) write their output with the same parquet sink
(``buffering.spark.ParquetSink``: ``{out}/batch_id=N``, overwrite), read back
after the run for the correctness check; (d) writes nothing (the floor).

Timed per variant: from just before the query is built and started to the
return of ``awaitTermination()``. Per-batch times are recorded too: the
runner's ``BatchMetrics.seconds`` for (b) and (c) (the foreachBatch function),
and Spark's progress ``durationMs.triggerExecution`` for every variant.
``--repeat`` runs per variant (rounds; best = fastest is reported, all are in
the JSON). Ratios are computed within the same run: ``vs (a)`` = time(a) /
time(x) (how many times faster than (a)), ``vs floor`` = time(x) / time(d).

Correctness, per cardinality: the last output row per tweet of (a), (b), (c)
and (e) have the same tweets and equal view counts (also equal to a pandas
count of the input); the HLL estimates of (a), (b) and (c) (all DataSketches, the same hash)
are within 5 % of each other; (e)'s (HyperLogLog++, another hash, no sparse
mode) are reported where they are more than 5 standard errors (8.1 %) and 2
viewers off the exact distinct count (Spark's own accuracy, not a failure of
the comparison); every variant's error against the exact count is reported. A mismatch is printed loudly
and recorded in the JSON.

Targets: (c) >= 40x faster than (a) and >= 3x faster than (e) at 100k tweets;
(c) <= 1.3x the floor (d) at every cardinality; (b) never slower than (a) (>= 1x).
(g) and (h) are checked against (c)'s targets too: the same job with another state layout or plan.
Ceilings, printed beside the targets: (f) / (d) per cardinality (what (c)'s plan costs without its
operator), and at the largest cardinality (a) and (e) over the faster of (d) and (f), the most that any variant
could be faster than them in the run (also in the JSON, ``per_cardinality[...]["ceilings"]``).

Spark: ``local[2]`` (``--master``; ``--standalone N`` starts a standalone cluster of N one-core
workers for the run instead), UI off, loopback driver, shuffle partitions
= ``--parallelism`` (4). The machine's load average is recorded before and
after every run (others use the machine).

    python -m benchmarks.spark_e2e [--quick] [--views N] [--users N] [--batches N]
        [--cardinalities 100000,10000,1000,20] [--variants a,b,c,d] [--repeat N]
        [--standalone WORKERS]
        [--parallelism P] [--max-entries N] [--zipf S] [--spark-state-store hdfs|rocksdb]
        [--arrow-max-records N] [--c-combine-before-shuffle auto|off] [--placement batch|executor]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pandas as pd

import buffering
from buffering import ApproxDistinct, Count
from state.keygroups import DEFAULT_MAX_PARALLELISM

from ._common import check_target, local_spark_builder, log, now, print_table, write_record

NAME = "spark_e2e"
REPO_ROOT = Path(__file__).resolve().parent.parent

VIEWS = 2_000_000
USERS = 25_000
BATCHES = 4
#: memory each worker of --standalone offers (its executor takes Spark's default 1g of it)
STANDALONE_WORKER_MEMORY = "3g"
CARDINALITIES = (100_000, 10_000, 1_000, 20)
QUICK = {"views": 40_000, "users": 5_000, "batches": 4, "cardinalities": (2_000, 20)}
VARIANTS = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "k")
#: run order inside a round: the floors first, the slow baseline last
ORDER = ("d", "f", "i", "c", "g", "h", "k", "e", "b", "a")
#: the run_stream variants (their workers keep operator instances between runs)
STATEFUL = ("b", "c", "g", "h", "k")
#: the aggregate() variants (the same targets) and the cached_state(layout=...) each runs with
AGGREGATE_LAYOUTS = {"c": "auto", "g": "key_group", "h": "key_group", "k": "key"}
LABELS = {
    "a": "(a) applyInPandasWithState, per-row HLL",
    "b": "(b) run_stream, same fn + mini_batch + cached_state",
    "c": "(c) run_stream, aggregate(Count, ApproxDistinct)",
    "d": "(d) floor: repartition + identity mapInPandas + noop",
    "e": "(e) Spark SQL streaming agg (count, approx_count_distinct), RocksDB",
    "f": "(f) ceiling of (c): its SQL combine + shuffle, reading only",
    "i": "(i) ceiling of (h), executor: its hosting plan, reading only",
    "g": "(g) (c) with cached_state(layout='key_group')",
    "h": "(h) (g) without the SQL combine: raw rows in",
    "k": "(k) (c) with cached_state(layout='key')",
}

INPUT_SCHEMA = "tweet long, user long, ts long"
OUTPUT_SCHEMA = "tweet long, views long, viewers long"
STATE_SCHEMA = "views long, hll binary"
HLL_LG_K = 12  # ApproxDistinct's default
HLL_TYPE = "HLL_8"  # ApproxDistinct's default
HLL_TOLERANCE = 0.05

TARGET_C_VS_A = 40.0  # at the largest cardinality (100k)
TARGET_C_VS_FLOOR = 1.3
TARGET_C_VS_E = 3.0  # at the largest cardinality (100k)
#: approx_count_distinct's relative SD for HyperLogLog++ with 2**12 registers (precision
#: p = ceil(2 * log2(1.106 / rsd)) = 12), the register count of ApproxDistinct(lg_k=12)
SPARK_RSD = 0.0173
#: (e) against the exact counts: 5 standard errors of 2**12 registers, or this many viewers
SPARK_HLL_REL_TOLERANCE = 5 * 1.04 / 64
SPARK_HLL_ABS_TOLERANCE = 2
TARGET_B_VS_A = 1.0


# ---------------------------------------------------------------- the user's function
def tweet_stats(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """What a user writes for applyInPandasWithState: count + a serialized HLL sketch, updated row by row."""
    import datasketches

    if state.exists:
        views, blob = state.get
        sketch = datasketches.hll_sketch.deserialize(bytes(blob))
    else:
        views, sketch = 0, datasketches.hll_sketch(HLL_LG_K, datasketches.tgt_hll_type.HLL_8)
    for pdf in rows:
        views += len(pdf)
        for user in pdf["user"].tolist():
            sketch.update(user)
    state.update((views, sketch.serialize_compact()))
    yield pd.DataFrame({"tweet": [key[0]], "views": [views], "viewers": [int(round(sketch.get_estimate()))]})


def decorated_tweet_stats(max_entries: int) -> Any:
    return buffering.mini_batch()(buffering.cached_state(max_entries=max_entries, store="rocksdb")(tweet_stats))


def aggregate_tweet_stats(max_entries: int, layout: str = "auto") -> Any:
    op = buffering.aggregate({"views": Count(), "viewers": ApproxDistinct("user", lg_k=HLL_LG_K, tgt_type=HLL_TYPE)})
    return buffering.cached_state(max_entries=max_entries, store="rocksdb", layout=layout)(op)


def _identity(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    yield from batches


def _read_only(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Consume every chunk and yield nothing: what Spark costs without any operator work."""
    for _ in batches:
        pass
    return
    yield  # a generator


def _hosted_read_only(key: Any, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """(i)'s hosted function: read the instance's rows, yield nothing."""
    for _ in frames:
        pass
    return
    yield  # a generator


# ---------------------------------------------------------------- workload
def generate_views(n: int, tweets: int, users: int, seed: int, zipf: float = 1.0) -> pd.DataFrame:
    """``n`` views: tweet ids zipf-skewed over ``tweets`` (rank r has weight 1/r**zipf), users uniform.

    Vectorized (inverse CDF with ``searchsorted``) and seeded by ``(seed, tweets)``.
    """
    rng = np.random.default_rng([seed, tweets])
    weights = 1.0 / np.arange(1, tweets + 1, dtype=np.float64) ** zipf
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    tweet = np.searchsorted(cdf, rng.random(n), side="right")
    np.minimum(tweet, tweets - 1, out=tweet)
    return pd.DataFrame({
        "tweet": tweet.astype(np.int64),
        "user": rng.integers(0, users, n, dtype=np.int64),
        "ts": np.arange(n, dtype=np.int64) * 10,
    })


def write_files(views: pd.DataFrame, directory: str, batches: int) -> list[int]:
    """``batches`` parquet files (one micro-batch each), named and timestamped in order; returns rows per file."""
    os.makedirs(directory, exist_ok=True)
    sizes = []
    base = 1_700_000_000
    for i, part in enumerate(np.array_split(np.arange(len(views)), batches)):
        path = os.path.join(directory, f"part-{i:05d}.parquet")
        views.iloc[part].reset_index(drop=True).to_parquet(path, index=False)
        os.utime(path, (base + i, base + i))
        sizes.append(len(part))
    return sizes


# ---------------------------------------------------------------- Spark
def start_spark(args: argparse.Namespace) -> Any:
    builder = local_spark_builder(
        "opbuffer-spark-e2e", master=args.master, driver_memory=args.driver_memory, parallelism=args.parallelism
    ).config("spark.sql.streaming.numRecentProgressUpdates", "1000")
    if args.arrow_max_records is not None:
        builder = builder.config("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.arrow_max_records))
    if args.spark_state_store == "rocksdb":
        builder = builder.config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _progress(query: Any) -> list[dict[str, Any]]:
    out = []
    for p in query.recentProgress:
        try:
            d = json.loads(p.json)
        except Exception:  # noqa: BLE001 - older shapes
            d = dict(p)
        out.append({
            "batchId": d.get("batchId"),
            "numInputRows": d.get("numInputRows"),
            "durationMs": d.get("durationMs", {}),
        })
    return out


def _batch_seconds(progress: list[dict[str, Any]]) -> list[float]:
    """Seconds of each micro-batch that read rows (Spark's triggerExecution)."""
    return [
        p["durationMs"].get("triggerExecution", 0) / 1000.0
        for p in progress
        if p.get("numInputRows")
    ]


class Case:
    """One cardinality's input and work directories."""

    def __init__(self, spark: Any, root: str, source: str, args: argparse.Namespace, tag: str) -> None:
        self.spark = spark
        self.root = root
        self.source = source
        self.args = args
        self.tag = tag
        self.runs = 0

    def stream(self) -> Any:
        return self.spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).parquet(self.source)

    def fresh(self, variant: str) -> tuple[str, str]:
        """Fresh checkpoint and output directories for one run."""
        self.runs += 1
        base = os.path.join(self.root, f"{self.tag}-{variant}-{self.runs}")
        os.makedirs(base)
        return os.path.join(base, "checkpoint"), os.path.join(base, "out")


def _timed_query(build: Callable[[], Any], checkpoint: str) -> tuple[Any, float]:
    """Start ``build()`` (a DataStreamWriter) over the files with ``checkpoint``, until every file is read;
    the query and its seconds, from just before the plan is built to the return of ``awaitTermination()``."""
    started = now()
    query = build().option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    return query, now() - started


def run_variant(case: Case, variant: str) -> dict[str, Any]:
    """Run one variant once; returns its timing, per-batch times and output location."""
    from buffering.spark import ParquetSink, run_stream

    args = case.args
    checkpoint, out = case.fresh(variant)
    load_before = os.getloadavg()
    result: dict[str, Any] = {"variant": variant, "out": out, "load_before": list(load_before)}
    if variant == "a":
        query, result["seconds"] = _timed_query(
            lambda: case.stream()
            .groupBy("tweet")
            .applyInPandasWithState(tweet_stats, OUTPUT_SCHEMA, STATE_SCHEMA, "Update", "NoTimeout")
            .writeStream.outputMode("update")
            .foreachBatch(ParquetSink(out)),
            checkpoint,
        )
    elif variant in STATEFUL:
        if variant == "b":
            fn = decorated_tweet_stats(args.max_entries)
        else:
            fn = aggregate_tweet_stats(args.max_entries, AGGREGATE_LAYOUTS[variant])
        started = now()
        query = run_stream(
            case.stream(),
            fn,
            key="tweet",
            output_schema=OUTPUT_SCHEMA if variant == "b" else None,
            checkpoint_location=checkpoint,
            sink=ParquetSink(out),
            parallelism=args.parallelism,
            trigger={"availableNow": True},
            workdir=os.path.join(os.path.dirname(checkpoint), "work"),
            combine_before_shuffle=False if (variant == "h" or (variant in ("c", "g", "k") and args.c_combine_before_shuffle == "off")) else None,
            placement=args.placement,
        )
        query.awaitTermination()
        result["seconds"] = now() - started
        metrics = query.batch_metrics
        result["batch_metrics"] = [m.to_dict() for m in metrics]
        result["per_instance"] = [m.per_instance for m in metrics]
        result["runner_batch_seconds"] = [m.seconds for m in metrics]
        result["cold_instances"] = cold_instances(result["per_instance"])
    elif variant == "d":
        parallelism = args.parallelism
        spark_schema = case.stream().schema

        def floor(batch_df: Any, batch_id: int) -> None:
            (batch_df.repartition(parallelism, "tweet").mapInPandas(_identity, spark_schema)
             .write.format("noop").mode("overwrite").save())

        query, result["seconds"] = _timed_query(lambda: case.stream().writeStream.foreachBatch(floor), checkpoint)
        result["out"] = None
    elif variant == "e":
        from pyspark.sql import functions as F

        spark = case.spark
        conf = "spark.sql.streaming.stateStore.providerClass"
        before = spark.conf.get(conf, None)
        spark.conf.set(conf, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        try:
            query, result["seconds"] = _timed_query(
                lambda: case.stream()
                .groupBy("tweet")
                .agg(F.count(F.lit(1)).alias("views"), F.approx_count_distinct("user", SPARK_RSD).alias("viewers"))
                .writeStream.outputMode("update")
                .foreachBatch(ParquetSink(out)),
                checkpoint,
            )
        finally:
            if before is None:
                spark.conf.unset(conf)
            else:
                spark.conf.set(conf, before)
    elif variant == "f":
        from pyspark.sql import functions as F

        from buffering.spark._plan import operator_index_sql
        from buffering.spark._sql_combine import sql_exprs, sql_partials

        parallelism = args.parallelism
        aggs = buffering.decorators.spec_of(aggregate_tweet_stats(args.max_entries)).aggregations
        stream = case.stream()
        partials = sql_partials(aggs, stream.schema)
        assert partials is not None
        index = operator_index_sql(["tweet"], parallelism, DEFAULT_MAX_PARALLELISM)

        def ceiling(batch_df: Any, batch_id: int) -> None:
            frame = batch_df.groupBy("tweet").agg(F.count(F.lit(1)).alias("n"), *sql_exprs(aggs, partials))
            frame = frame.withColumn("op", F.expr(index)).repartitionById(parallelism, "op")
            frame.mapInPandas(_read_only, frame.schema).write.format("noop").mode("overwrite").save()

        query, result["seconds"] = _timed_query(lambda: stream.writeStream.foreachBatch(ceiling), checkpoint)
        result["out"] = None
    elif variant == "i":
        from pyspark.sql import functions as F
        from pyspark.sql.streaming.state import GroupStateTimeout

        from buffering.spark._plan import operator_index_sql
        from buffering.spark._task import HOST_COLUMN, OPERATOR_COLUMN, tag_partition
        from buffering.spark.stream import StreamRunner, host_keys

        parallelism = args.parallelism
        keys = host_keys(case.spark, parallelism, parallelism)

        def hosted() -> Any:
            stream = case.stream()
            index = F.expr(operator_index_sql(["tweet"], parallelism, DEFAULT_MAX_PARALLELISM))
            tagged = StreamRunner._tagged(stream.schema)
            frame = stream.withColumn(OPERATOR_COLUMN, index).mapInArrow(functools.partial(tag_partition, keys, tagged), tagged)
            return (frame.groupBy(HOST_COLUMN)
                    .applyInPandasWithState(_hosted_read_only, "n long", "unused int", "Update", GroupStateTimeout.NoTimeout)
                    .writeStream.outputMode("update")
                    .foreachBatch(lambda batch_df, batch_id: batch_df.write.format("noop").mode("overwrite").save()))

        query, result["seconds"] = _timed_query(hosted, checkpoint)
        result["out"] = None
    else:
        raise ValueError(variant)
    result["progress"] = _progress(query)
    result["batch_seconds"] = _batch_seconds(result["progress"])
    result["batches"] = len(result["batch_seconds"])
    result["load_after"] = list(os.getloadavg())
    return result


def cold_instances(per_instance: list[list[dict[str, Any]]]) -> list[int]:
    """Per batch after the first: instances that started with an empty cache (the task landed on a Python
    worker that did not hold the instance: it adopted the store another worker left, or restored it)."""
    return [sum(1 for i in batch if i.get("start") in ("adopted", "restored")) for batch in per_instance[1:]]


def worker_code_paths(spark: Any) -> list[str]:
    """Where the Python workers import ``buffering`` from (the code under test)."""

    def where(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import buffering as b

        for _ in batches:
            pass
        yield pd.DataFrame({"path": [os.path.dirname(os.path.abspath(b.__file__))]})

    rows = spark.range(0, 2, numPartitions=2).mapInPandas(where, "path string").collect()
    return sorted({r["path"] for r in rows})


def close_worker_instances(spark: Any, tasks: int = 8) -> list[int]:
    """Best effort: close the operator instances the Python workers keep between batches (memory, open RocksDBs)."""

    def close(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from buffering.spark import _workers

        for _ in batches:
            pass
        n = len(_workers._LIVE)
        _workers.close_all()
        yield pd.DataFrame({"pid": [os.getpid()], "closed": [n]})

    try:
        rows = spark.range(0, tasks, numPartitions=tasks).mapInPandas(close, "pid long, closed long").collect()
        return [int(r["closed"]) for r in rows]
    except Exception as err:  # noqa: BLE001 - best effort
        log(f"closing worker instances failed: {err}")
        return []


# ---------------------------------------------------------------- correctness
def last_rows(out: str) -> pd.DataFrame:
    """The last output row per tweet (highest batch id), indexed by tweet (read with pyarrow, not Spark)."""
    import pyarrow.dataset as ds

    pdf = ds.dataset(out, format="parquet", partitioning="hive").to_table().to_pandas()
    pdf = pdf.sort_values(["tweet", "batch_id"], kind="stable")
    last = pdf.groupby("tweet", sort=True).tail(1).set_index("tweet")
    return last[["views", "viewers"]].astype(np.int64)


def verify(views: pd.DataFrame, outs: dict[str, str]) -> dict[str, Any]:
    """Compare the last row per tweet of each variant with each other and with the exact numbers."""
    exact_views = views.groupby("tweet").size().astype(np.int64)
    exact_viewers = views.groupby("tweet")["user"].nunique().astype(np.int64)
    check: dict[str, Any] = {"tweets": int(len(exact_views)), "problems": [], "variants": {}}
    frames = {}
    for v, out in outs.items():
        try:
            frames[v] = last_rows(out)
        except Exception as err:  # noqa: BLE001
            check["problems"].append(f"({v}) output unreadable: {err}")
    for v, f in frames.items():
        info: dict[str, Any] = {"tweets": int(len(f))}
        missing = exact_views.index.difference(f.index)
        extra = f.index.difference(exact_views.index)
        if len(missing) or len(extra):
            check["problems"].append(f"({v}) tweets differ from the input: {len(missing)} missing, {len(extra)} extra")
        common = f.index.intersection(exact_views.index)
        wrong = int((f.loc[common, "views"] != exact_views.loc[common]).sum())
        info["wrong_view_counts_vs_input"] = wrong
        if wrong:
            check["problems"].append(f"({v}) {wrong} view counts differ from a pandas count of the input")
        est = f.loc[common, "viewers"].to_numpy(np.float64)
        true = exact_viewers.loc[common].to_numpy(np.float64)
        rel = np.abs(est - true) / np.maximum(true, 1.0)
        info["hll_max_rel_error_vs_exact"] = float(rel.max()) if len(rel) else 0.0
        if v == "e":
            # HyperLogLog++ with 2**12 registers: standard error 1.6 %; no sparse mode, so a few viewers
            # sharing a register count once (a tweet of 5 viewers reads 4 about once in 800)
            off = (rel > SPARK_HLL_REL_TOLERANCE) & (np.abs(est - true) > SPARK_HLL_ABS_TOLERANCE)
            info["hll_outside_tolerance_vs_exact"] = int(off.sum())
            if off.any():  # Spark's own estimator: reported, not a failure of the comparison
                worst = int(np.argmax(np.where(off, rel, -1.0)))
                check.setdefault("notes", []).append(
                    f"(e) Spark's HyperLogLog++: {int(off.sum())} estimates more than {SPARK_HLL_REL_TOLERANCE:.1%} "
                    f"and {SPARK_HLL_ABS_TOLERANCE} viewers off the exact count (worst {int(est[worst])} for "
                    f"{int(true[worst])})")
        info["hll_mean_rel_error_vs_exact"] = float(rel.mean()) if len(rel) else 0.0
        check["variants"][v] = info
    names = sorted(frames)
    check["pairs"] = {}
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            fx, fy = frames[x], frames[y]
            pair: dict[str, Any] = {}
            if not fx.index.equals(fy.index):
                check["problems"].append(
                    f"({x}) and ({y}) emitted different tweets: {len(fx.index.difference(fy.index))} only in ({x}), "
                    f"{len(fy.index.difference(fx.index))} only in ({y})")
            common = fx.index.intersection(fy.index)
            wrong = int((fx.loc[common, "views"] != fy.loc[common, "views"]).sum())
            pair["view_count_mismatches"] = wrong
            if wrong:
                check["problems"].append(f"({x}) and ({y}): {wrong} final view counts differ")
            ex = fx.loc[common, "viewers"].to_numpy(np.float64)
            ey = fy.loc[common, "viewers"].to_numpy(np.float64)
            rel = np.abs(ex - ey) / np.maximum(np.maximum(ex, ey), 1.0)
            pair["hll_max_rel_diff"] = float(rel.max()) if len(rel) else 0.0
            pair["hll_max_abs_diff"] = float(np.abs(ex - ey).max()) if len(rel) else 0.0
            pair["hll_identical"] = int((ex == ey).sum())
            if "e" in (x, y):
                # Spark's HyperLogLog++ hashes with another function: its errors are independent of the
                # DataSketches variants', so it is checked against the exact counts instead (below).
                outside = 0
            else:
                outside = int((rel > HLL_TOLERANCE).sum())
            pair["hll_outside_tolerance"] = outside
            if outside:
                check["problems"].append(
                    f"({x}) and ({y}): {outside} HLL estimates differ by more than {HLL_TOLERANCE:.0%} "
                    f"(max {pair['hll_max_rel_diff']:.3f})")
            check["pairs"][f"{x}-{y}"] = pair
    check["ok"] = not check["problems"]
    return check


# ---------------------------------------------------------------- main
def _parse_ints(text: str) -> list[int]:
    values = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    if not values or any(v < 1 for v in values):
        raise SystemExit(f"expected positive integers separated by commas, got {text!r}")
    return values


def _parse_variants(text: str) -> list[str]:
    chosen = [v.strip().lower().strip("()") for v in text.split(",") if v.strip()]
    bad = [v for v in chosen if v not in VARIANTS]
    if bad or not chosen:
        raise SystemExit(f"--variants takes a comma-separated subset of {','.join(VARIANTS)}, got {text!r}")
    return [v for v in ORDER if v in chosen]


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except Exception:  # noqa: BLE001
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _code_version() -> dict[str, Any]:
    """The git commit of the code under test and whether its packages have uncommitted changes."""
    def git(*cmd: str) -> Optional[str]:
        try:
            done = subprocess.run(["git", "-C", str(REPO_ROOT), *cmd], capture_output=True, text=True, timeout=10)
        except Exception:  # noqa: BLE001
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    return {
        "root": str(REPO_ROOT),
        "git_head": git("rev-parse", "HEAD"),
        "uncommitted_in_packages": git("status", "--porcelain", "--", "buffering", "state", "checkpoint"),
    }


def _fmt_batches(seconds: list[float]) -> str:
    return "/".join(f"{s:.1f}" for s in seconds) if seconds else "-"


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help=f"small sizes for a smoke run ({QUICK['views']:,} views, {QUICK['users']:,} users, "
                        f"cardinalities {','.join(map(str, QUICK['cardinalities']))})")
    p.add_argument("--views", type=int, default=None, help=f"views in total (default {VIEWS:,})")
    p.add_argument("--users", type=int, default=None, help=f"distinct users (default {USERS:,})")
    p.add_argument("--batches", type=int, default=None, help=f"parquet files = micro-batches (default {BATCHES}, >= 4)")
    p.add_argument("--cardinalities", default=None,
                   help=f"tweet cardinalities, comma-separated (default {','.join(map(str, CARDINALITIES))})")
    p.add_argument("--variants", default=",".join(VARIANTS), help="which of a,b,c,d,e,f,g,h,i,k to run (default all)")
    p.add_argument("--repeat", type=int, default=1, help="runs per variant and cardinality; the fastest is reported")
    p.add_argument("--parallelism", type=int, default=4, help="shuffle partitions = operator instances (default 4)")
    p.add_argument("--max-entries", type=int, default=50_000,
                   help="cached_state(max_entries=...) of (b) and (c), per operator instance (default 50,000)")
    p.add_argument("--zipf", type=float, default=1.0, help="zipf exponent of the tweet popularity (default 1.0)")
    p.add_argument("--seed", type=int, default=1234, help="random seed of the workload")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--standalone", type=int, default=None, metavar="N",
                   help="start a Spark standalone cluster of N one-core workers for the run (each with its own temp "
                        "and local directories, as N machines; buffering.spark.standalone.StandaloneCluster) and use "
                        "it as the master instead of --master")
    p.add_argument("--driver-memory", default="4g", help="spark.driver.memory (default 4g)")
    p.add_argument("--spark-state-store", choices=("hdfs", "rocksdb"), default="hdfs",
                   help="state store provider of (a) (default: Spark's default, HDFS-backed)")
    p.add_argument("--arrow-max-records", type=int, default=None,
                   help="spark.sql.execution.arrow.maxRecordsPerBatch (rows per pandas chunk; Spark's default 10,000)")
    p.add_argument("--placement", choices=("batch", "executor"), default="batch",
                   help="run_stream(placement=...) of (b), (c), (g), (h): batch (local master's default: SQL combine) or "
                        "executor (a cluster's default: each instance hosted in Spark's stateful operator, Python combine)")
    p.add_argument("--c-combine-before-shuffle", choices=("auto", "off"), default="auto",
                   help="run_stream(combine_before_shuffle=...) of (c): auto = the runner's default (on for aggregate)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run of each variant")
    p.add_argument("--workdir", default=None, help="directory for input files, checkpoints and outputs (default: temp)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (and --standalone's cluster directory)")
    p.add_argument("--note", default=None, help="free text kept in the JSON record (e.g. the code version)")
    p.add_argument("--out", default=None, help="path of the JSON record (default benchmarks/results/spark_e2e.json)")
    return p


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    args = make_parser().parse_args(argv)
    if args.standalone is None:
        return _run(args)
    if args.standalone < 1:
        raise SystemExit(f"--standalone takes a number of workers >= 1, got {args.standalone}")
    from buffering.spark.standalone import StandaloneCluster

    # The workers' directories (logs, temp files, executors' working stores) go with the run, as its work directory does.
    directory = tempfile.mkdtemp(prefix="opbuffer-spark-e2e-cluster-")
    try:
        with StandaloneCluster(workers=args.standalone, cores=1, memory=STANDALONE_WORKER_MEMORY,
                               directory=directory) as cluster:
            args.master = cluster.master_url
            log(f"standalone cluster {cluster.master_url}: {args.standalone} one-core workers, logs in {directory}"
                f"{' (kept)' if args.keep else ' (removed after the run; --keep keeps them)'}")
            return _run(args)
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


def _run(args: argparse.Namespace) -> dict[str, Any]:
    started = now()
    n_views = args.views or (QUICK["views"] if args.quick else VIEWS)
    users = args.users or (QUICK["users"] if args.quick else USERS)
    n_batches = args.batches or (QUICK["batches"] if args.quick else BATCHES)
    cards = _parse_ints(args.cardinalities) if args.cardinalities else list(
        QUICK["cardinalities"] if args.quick else CARDINALITIES)
    variants = _parse_variants(args.variants)
    if n_batches < 1 or args.repeat < 1 or args.parallelism < 1:
        raise SystemExit("--batches, --repeat and --parallelism must be positive")
    if n_batches < 4:
        log(f"note: --batches {n_batches} < 4 (the issue asks for at least 4 micro-batches)")

    params = {
        "views": n_views,
        "users": users,
        "batches": n_batches,
        "cardinalities": cards,
        "variants": {v: LABELS[v] for v in variants},
        "generator": f"tweets zipf(s={args.zipf}) over the cardinality by inverse CDF, users uniform; "
                     "numpy default_rng([seed, cardinality])",
        "zipf": args.zipf,
        "seed": args.seed,
        "source": "readStream.parquet, maxFilesPerTrigger=1, trigger availableNow (one micro-batch per file)",
        "sink": "(a)/(b)/(c): ParquetSink (overwrite {out}/batch_id=N); (d): noop",
        "function": f"state (views long, hll binary): datasketches hll_sketch lg_k={HLL_LG_K} {HLL_TYPE}, "
                    "deserialized, updated per row (Python loop), serialized back",
        "b": f"mini_batch() (no combiner, no trigger) + cached_state(max_entries={args.max_entries}, store='rocksdb')",
        "c": f"cached_state(max_entries={args.max_entries}, store='rocksdb')(aggregate({{'views': Count(), "
             f"'viewers': ApproxDistinct('user')}})), combine before shuffle",
        "g": f"(c) with cached_state(max_entries={args.max_entries}, store='rocksdb', layout='key_group')",
        "k": f"(c) with cached_state(max_entries={args.max_entries}, store='rocksdb', layout='key')",
        "h": "(g) with run_stream(combine_before_shuffle=False): the rows shuffled as they are, each instance folds "
             "its batch's rows as columns (ApproxDistinct hashed with numpy)",
        "d": "foreachBatch: repartition(P, 'tweet') + identity mapInPandas + write.format('noop')",
        "e": f"groupBy('tweet').agg(count(lit(1)), approx_count_distinct('user', {SPARK_RSD})) (HLL++ with 2**12 "
             "registers), update mode, RocksDB state store, ParquetSink",
        "f": "foreachBatch: (c)'s map-side SQL combine (groupBy(tweet).agg(count, hll_sketch_agg)), operator index, "
             "repartitionById, a mapInPandas that reads every chunk and yields nothing, noop",
        "i": "placement='executor''s plan without a combine: operator index, its mapInArrow adding the host key and heartbeats, "
             "groupBy(host).applyInPandasWithState (update, Spark's state store) reading every chunk and yielding "
             "nothing, foreachBatch noop",
        "timed": "query build + start .. awaitTermination() returns",
        "statistic": "fastest of --repeat runs",
        "repeat": args.repeat,
        "parallelism": args.parallelism,
        "master": args.master,
        "standalone_workers": args.standalone,
        "spark_state_store_for_a": args.spark_state_store,
        "max_entries": args.max_entries,
        "arrow_max_records_per_batch": args.arrow_max_records or "Spark default (10000)",
        "c_combine_before_shuffle": args.c_combine_before_shuffle,
        "placement": args.placement,
        "quick": args.quick,
        "warmup": not args.no_warmup,
        "uptime_start": _uptime(),
        "code": _code_version(),
        "note": args.note,
    }
    print(f"spark_e2e: {n_views:,} views, {users:,} users, {n_batches} micro-batches (parquet files), tweet "
          f"cardinalities {cards}, variants {','.join(variants)}, {args.master}, parallelism {args.parallelism}, "
          f"repeat {args.repeat}; pid {os.getpid()}", flush=True)
    print(f"load at start: {params['uptime_start']}", flush=True)

    root = args.workdir or tempfile.mkdtemp(prefix="opbuffer-spark-e2e-")
    os.makedirs(root, exist_ok=True)
    spark = start_spark(args)
    results: dict[str, Any] = {"per_cardinality": {}}
    rows: list[list[Any]] = []
    targets: list[dict] = []
    all_ok = True
    try:
        import pyspark

        params["pyspark"] = pyspark.__version__
        params["worker_buffering_paths"] = worker_code_paths(spark)
        log(f"workers import buffering from {params['worker_buffering_paths']}")
        if not args.no_warmup:
            source = os.path.join(root, "warmup-input")
            write_files(generate_views(8_000, 100, 500, args.seed), source, 4)
            case = Case(spark, root, source, args, "warmup")
            with_state = False
            for v in variants:
                t = now()
                run_variant(case, v)
                with_state |= v in STATEFUL
                log(f"warm-up ({v}): {now() - t:.1f} s")
            if with_state:
                close_worker_instances(spark)

        for card in cards:
            log(f"[{card}] generating {n_views:,} views")
            views = generate_views(n_views, card, users, args.seed, args.zipf)
            source = os.path.join(root, f"input-{card}")
            sizes = write_files(views, source, n_batches)
            case = Case(spark, root, source, args, f"t{card}")
            distinct_per_file = [int(views["tweet"].iloc[s:e].nunique())
                                 for s, e in zip(np.cumsum([0, *sizes[:-1]]), np.cumsum(sizes))]
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
            errors: dict[str, str] = {}
            for rep in range(args.repeat):
                for v in variants:
                    if v in errors:
                        continue
                    log(f"[{card}] ({v}) run {rep + 1}/{args.repeat} ... (load {os.getloadavg()[0]:.2f})")
                    try:
                        r = run_variant(case, v)
                    except Exception as err:  # noqa: BLE001 - record and go on with the others
                        errors[v] = f"{type(err).__name__}: {err}"
                        print(f"ERROR [{card}] ({v}): {errors[v]}", flush=True)
                        traceback.print_exc()
                        continue
                    runs[v].append(r)
                    log(f"[{card}] ({v}) {r['seconds']:.2f} s; batches {_fmt_batches(r['batch_seconds'])} s; "
                        f"load {r['load_before'][0]:.2f} -> {r['load_after'][0]:.2f}"
                        + (f"; cold-cache instances per batch after the first: {r['cold_instances']}"
                           if "cold_instances" in r else ""))
                    if v in STATEFUL:
                        closed = close_worker_instances(spark)
                        log(f"[{card}] closed {sum(closed)} operator instances kept by {len(closed)} worker tasks")
            best = {v: min(rs, key=lambda r: r["seconds"]) for v, rs in runs.items() if rs}
            outs = {v: best[v]["out"] for v in ("a", "b", "e", *AGGREGATE_LAYOUTS) if v in best}
            check = verify(views, outs) if outs else {"ok": True, "problems": [], "note": "nothing to check"}
            for v, e in errors.items():
                check["problems"].append(f"({v}) failed: {e}")
                check["ok"] = False
            all_ok &= check["ok"]
            for problem in check["problems"]:
                print(f"!!! CORRECTNESS MISMATCH [{card} tweets]: {problem}", flush=True)
            for note in check.get("notes", []):
                print(f"note [{card} tweets]: {note}", flush=True)

            t = {v: best[v]["seconds"] for v in best}
            for v in variants:
                if v not in best:
                    rows.append([card, LABELS[v], "failed" if v in errors else "-", "-", "-", "-", "-", "-", "-"])
                    continue
                vs_a = t["a"] / t[v] if "a" in t else None
                vs_floor = t[v] / t["d"] if "d" in t else None
                target = "-"
                if v in AGGREGATE_LAYOUTS:
                    parts = []
                    if card == max(cards) and vs_a is not None:
                        parts.append(f"vs(a)>={TARGET_C_VS_A:g}x {'PASS' if vs_a >= TARGET_C_VS_A else 'FAIL'}")
                    if vs_floor is not None:
                        parts.append(f"floor<={TARGET_C_VS_FLOOR:g}x {'PASS' if vs_floor <= TARGET_C_VS_FLOOR else 'FAIL'}")
                    if card == max(cards) and "e" in t:
                        vs_e = t["e"] / t[v]
                        parts.append(f"vs(e) {vs_e:.2f}x>={TARGET_C_VS_E:g}x {'PASS' if vs_e >= TARGET_C_VS_E else 'FAIL'}")
                    target = "; ".join(parts) or "-"
                elif v == "b" and vs_a is not None:
                    target = f"vs(a)>={TARGET_B_VS_A:g}x {'PASS' if vs_a >= TARGET_B_VS_A else 'FAIL'}"
                rows.append([
                    card,
                    LABELS[v],
                    t[v],
                    vs_a if vs_a is not None else "-",
                    vs_floor if vs_floor is not None else "-",
                    _fmt_batches(best[v].get("runner_batch_seconds") or best[v]["batch_seconds"]),
                    f"{best[v]['load_before'][0]:.1f}-{best[v]['load_after'][0]:.1f}",
                    target,
                    ("ok" if check["ok"] else "MISMATCH") if v not in ("d", "f", "i") else "-",
                ])
            results["per_cardinality"][str(card)] = {
                "distinct_tweets": int(views["tweet"].nunique()),
                "distinct_tweets_per_batch": distinct_per_file,
                "rows_per_batch": sizes,
                "seconds_best": t,
                "seconds_all": {v: [r["seconds"] for r in rs] for v, rs in runs.items()},
                "vs_a": {v: t["a"] / t[v] for v in t} if "a" in t else None,
                "vs_floor": {v: t[v] / t["d"] for v in t} if "d" in t else None,
                "runs": {v: [{k: val for k, val in r.items() if k != "out"} for r in rs] for v, rs in runs.items()},
                "errors": errors,
                "verification": check,
            }
            log(f"[{card}] " + ", ".join(f"({v}) {s:.2f} s" for v, s in t.items()))
            shutil.rmtree(source, ignore_errors=True)

        print()
        print_table(
            ["tweets", "variant", "seconds", "vs (a) x faster", "vs floor (x)", "per batch s", "load 1m", "target",
             "check"],
            rows,
            title=f"{n_views:,} views, {users:,} users, {n_batches} micro-batches, {args.master}, parallelism "
                  f"{args.parallelism}; seconds = query start .. awaitTermination (fastest of {args.repeat}); "
                  f"vs (a) = t(a)/t(x), vs floor = t(x)/t(d), same run",
        )
        print("per batch s: run_stream's BatchMetrics.seconds for (b)/(c), Spark's triggerExecution for (a)/(d); "
              "load 1m: the 1-minute load average before-after the run (2 cores)")
        for card in cards:
            c = results["per_cardinality"].get(str(card))
            if not c:
                continue
            v = c["verification"]
            pairs = "; ".join(
                f"{k}: views mismatches {p['view_count_mismatches']}, HLL max rel diff {p['hll_max_rel_diff']:.4f} "
                f"(max abs {p.get('hll_max_abs_diff', 0):.0f}, outside tolerance {p['hll_outside_tolerance']})"
                for k, p in v.get("pairs", {}).items())
            errs = "; ".join(f"({k}) HLL max rel err vs exact {i['hll_max_rel_error_vs_exact']:.4f}"
                             for k, i in v.get("variants", {}).items())
            print(f"verify [{card}]: {'OK' if v['ok'] else 'MISMATCH'}; {v.get('tweets', 0):,} tweets; {pairs}; {errs}")
        for card in cards:
            c = results["per_cardinality"].get(str(card))
            for v in STATEFUL:
                for r in (c or {}).get("runs", {}).get(v, []):
                    bm = r.get("batch_metrics", [])
                    hits = "/".join(f"{m['cache_hit_ratio']:.2f}" for m in bm)
                    ckpt = "/".join(f"{m['checkpoint_seconds']:.2f}" for m in bm)
                    commits = "/".join(f"{m['commit_seconds']:.2f}" for m in bm)
                    tasks = "/".join(f"{m.get('task_seconds_max', 0):.2f}" for m in bm)
                    sinks = "/".join(f"{m.get('sink_seconds', 0):.2f}" for m in bm)
                    print(f"run_stream [{card}] ({v}): cache hit ratio per batch {hits}, cold-cache instances "
                          f"per batch after the first {r.get('cold_instances')} of {args.parallelism}, "
                          f"slowest task s {tasks} (checkpoint {ckpt}), sink s {sinks}, commit s {commits}")
        print(f"correctness: {'ALL OK' if all_ok else 'MISMATCH (see above)'}")

        for card in cards:
            c = results["per_cardinality"].get(str(card))
            if not c:
                continue
            t = c["seconds_best"]
            for v in AGGREGATE_LAYOUTS:  # (g), (h), (k): (c) with another layout / plan: the same targets
                if "a" in t and v in t and card == max(cards):
                    targets.append(check_target(f"({v}) vs (a) at {card} tweets", t["a"] / t[v], TARGET_C_VS_A, unit="x"))
                if v in t and "d" in t:
                    targets.append(check_target(f"({v}) / floor (d) at {card} tweets", t[v] / t["d"], TARGET_C_VS_FLOOR,
                                                at_most=True, unit="x"))
                if v in t and "e" in t and card == max(cards):
                    targets.append(check_target(f"({v}) vs Spark SQL (e) at {card} tweets", t["e"] / t[v],
                                                TARGET_C_VS_E, unit="x"))
            if "c" in t and "f" in t:
                # not a target: how far (c) is from what its Spark plan alone costs
                log(f"[{card}] ceiling: (f) / floor (d) = {t['f'] / t['d']:.2f}x; (c) / (f) = {t['c'] / t['f']:.2f}x"
                    if "d" in t else f"[{card}] (c) / (f) = {t['c'] / t['f']:.2f}x")
            floors = [t[f] for f in ("d", "f") if f in t]
            if floors and card == max(cards) and ("a" in t or "e" in t):
                # not a target: the most that any variant could reach in this run against (a) and (e),
                # since none is faster than its floor (the faster of (d) and (f))
                c["ceilings"] = {f"vs ({x})": t[x] / min(floors) for x in ("a", "e") if x in t}
                log(f"[{card}] ceiling: " + "; ".join(
                    f"{name}: {ratio:.2f}x ((d) or (f), the faster)" for name, ratio in c["ceilings"].items()))
            if "h" in t and "i" in t and args.placement == "executor":
                log(f"[{card}] executor ceiling: (i) / floor (d) = {t['i'] / t['d']:.2f}x; (h) / (i) = {t['h'] / t['i']:.2f}x"
                    if "d" in t else f"[{card}] (h) / (i) = {t['h'] / t['i']:.2f}x")
            if "a" in t and "b" in t:
                targets.append(check_target(f"(b) vs (a) at {card} tweets", t["a"] / t["b"], TARGET_B_VS_A, unit="x"))
        results["correctness_ok"] = all_ok
    finally:
        params["uptime_end"] = _uptime()
        print(f"load at end: {params['uptime_end']}", flush=True)
        try:
            spark.stop()
        finally:
            if not args.keep and not args.workdir:
                shutil.rmtree(root, ignore_errors=True)
    write_record(NAME, params=params, results=results, targets=targets, out=args.out, started=started)
    print(f"runtime: {now() - started:.1f} s", flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
