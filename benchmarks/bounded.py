"""Bounded input (a backfill): the seed's WordCount through run_batch vs applyInPandas vs hash mode.

Workload (the seed's sort-based batch execution of a bounded keyed stream,
WordCount): ``--size`` records (default 4,000,000) of ``--keys`` distinct
words (default 400,000), one column ``word`` (string ``"w<id>"``), word ids
uniform, generated vectorized from ``numpy.random.default_rng([seed, keys])``
and written as ``--files`` parquet files (default 4) in a temp directory.

The variants, each reading the parquet files and writing its result as
parquet into a fresh directory (the same sink for all):

batch      ``buffering.spark.run_batch(df, aggregate({"count": Count()}), key="word",
           progress=False)`` (the candidate): Count has an exact Spark SQL twin, so
           Spark SQL combines each word's rows first (partial aggregation before the
           shuffle), then repartition by key group, sort, one row per word in Python.
batch_sort the same with ``combine_before_shuffle=False``: every record is shuffled,
           sorted and streamed to Python, vectorized partials per Arrow batch.
batch_fn   ``run_batch`` with a plain word-count function ``(key, rows, state)``
           (one Python call per word; state updated as a real stateful fn does).
aip        Spark's ``groupBy("word").applyInPandas(count_words, "word string, count long")``.
hash       hash mode: ``run_stream`` over ``spark.readStream.parquet(dir)`` with
           ``trigger(availableNow=True)`` (all files in ONE micro-batch) and
           ``cached_state(max_entries=10_000, store="rocksdb")(aggregate({"count": Count()}))``,
           the runner's defaults otherwise (map-side combine, key-group checkpoint
           in a fresh directory); sink writes the batch as parquet.
hash_nocombine  (not run by default) hash mode with ``combine_before_shuffle=False``:
           raw rows are shuffled and buffered per operator instance.
sql        the floor: ``groupBy("word").agg(count(1))`` in Spark SQL alone, written
           the same way; no Python. Any run_batch of this job reads, aggregates and
           writes at least this much, so ``time(hash) / time(sql)`` bounds the
           ratio ``time(hash) / time(batch)`` any run_batch can reach here.

Timed per run: from building the DataFrame (or starting the query) until the
parquet write returns (``awaitTermination()`` for hash). An untimed warm-up
runs every variant once on ``--warmup`` records first (Python workers start,
JIT, file listing caches). ``--repeat`` rounds (default 1; rounds alternate the
order); best (fastest) is reported, all are in the JSON. Ratios within the
same run: ``time(variant) / time(batch)`` = how many times faster batch is.

Correctness: every variant's output equals an exact ``numpy.bincount`` of the
input (every word, every count), checked after the timed runs (untimed).

Targets: batch >= 7.5x faster than hash, >= 2x faster than aip.

Spark: ``--master`` (local[2]), UI off, loopback driver, shuffle partitions =
``--parallelism`` (4), Arrow on. The load average is recorded around every run.

    python -m benchmarks.bounded [--quick] [--size N] [--keys N] [--files N] [--repeat N]
                                 [--variants batch,batch_sort,batch_fn,aip,hash,hash_nocombine] [--parallelism P]
                                 [--max-entries N] [--warmup N] [--master URL]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any, Iterator

import numpy as np
import pandas as pd

import buffering
from buffering import Count

from ._common import (
    check_target,
    local_spark_builder,
    log,
    make_parser,
    now,
    print_table,
    resolve_repeat,
    resolve_size,
    temp_dir,
    write_record,
)

NAME = "bounded"

KEYS = 400_000
QUICK_KEYS = 20_000
VARIANTS = ("batch", "batch_sort", "batch_fn", "aip", "hash", "hash_nocombine", "sql")
DEFAULT_VARIANTS = ("batch", "batch_sort", "batch_fn", "aip", "hash", "sql")
LABELS = {
    "batch": "run_batch, aggregate(Count)",
    "batch_sort": "run_batch, aggregate(Count), no SQL combine",
    "batch_fn": "run_batch, plain word-count fn",
    "aip": "groupBy.applyInPandas",
    "hash": "run_stream, 1 micro-batch, RocksDB cache",
    "hash_nocombine": "run_stream as hash, no map-side combine",
    "sql": "floor: Spark SQL groupBy.count, no Python",
}
OUTPUT_SCHEMA = "word string, count long"
TARGETS = {"hash": 7.5, "aip": 2.0}  # time(variant) / time(batch) at least


# ---------------------------------------------------------------- the operators
def word_count(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """A stateful word count in applyInPandasWithState shape: the running count of one word."""
    (total,) = state.get if state.exists else (0,)
    for frame in rows:
        total += len(frame)
    state.update((total,))
    yield pd.DataFrame({"word": [key[0]], "count": [total]})


def count_words(pdf: pd.DataFrame) -> pd.DataFrame:
    """What applyInPandas calls once per word."""
    return pd.DataFrame({"word": [pdf["word"].iat[0]], "count": [len(pdf)]})


def count_aggregate() -> Any:
    return buffering.aggregate({"count": Count()})


# ---------------------------------------------------------------- workload
def generate(size: int, keys: int, seed: int) -> np.ndarray:
    """Word ids, uniform over ``keys``, seeded by ``(seed, keys)``."""
    return np.random.default_rng([seed, keys]).integers(0, keys, size, dtype=np.int64)


def write_words(ids: np.ndarray, directory: str, files: int) -> None:
    """``files`` parquet files of one string column ``word`` = ``"w<id>"`` (built with Arrow, vectorized)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    for i, part in enumerate(np.array_split(ids, files)):
        words = pc.binary_join_element_wise(pa.array(["w"] * len(part)), pc.cast(pa.array(part), pa.string()), "")
        pq.write_table(pa.table({"word": words}), os.path.join(directory, f"part-{i:05d}.parquet"))


def exact_counts(ids: np.ndarray, keys: int) -> pd.Series:
    counts = np.bincount(ids, minlength=keys)
    present = np.flatnonzero(counts)
    return pd.Series(counts[present], index=[f"w{i}" for i in present.tolist()], dtype=np.int64).sort_index()


# ---------------------------------------------------------------- Spark
def start_spark(args: argparse.Namespace) -> Any:
    spark = local_spark_builder(
        "opbuffer-bounded", master=args.master, driver_memory=args.driver_memory, parallelism=args.parallelism
    ).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def close_worker_instances(spark: Any, tasks: int = 8) -> None:
    """Best effort: close the operator instances hash mode leaves in the Python workers (open RocksDBs)."""

    def close(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from buffering.spark import _workers

        for _ in batches:
            pass
        _workers.close_all()
        yield pd.DataFrame({"pid": [os.getpid()]})

    try:
        spark.range(0, tasks, numPartitions=tasks).mapInPandas(close, "pid long").collect()
    except Exception as err:  # noqa: BLE001 - best effort
        log(f"closing worker instances failed: {err}")


def run_variant(spark: Any, variant: str, source: str, work: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``variant`` over the parquet files in ``source``; output under ``work``."""
    from buffering.spark import ParquetSink, run_batch, run_stream

    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    out = os.path.join(work, "out")
    result: dict[str, Any] = {"variant": variant, "out": out, "load_before": list(os.getloadavg())}
    if variant in ("batch", "batch_sort", "batch_fn"):
        fn = word_count if variant == "batch_fn" else count_aggregate()
        schema = OUTPUT_SCHEMA if variant == "batch_fn" else None
        started = now()
        df = spark.read.parquet(source)
        run_batch(df, fn, key="word", output_schema=schema, parallelism=args.parallelism,
                  combine_before_shuffle=False if variant == "batch_sort" else None,
                  progress=False).write.mode("overwrite").parquet(out)
        result["seconds"] = now() - started
    elif variant == "sql":
        from pyspark.sql import functions as F

        started = now()
        df = spark.read.parquet(source)
        df.groupBy("word").agg(F.count(F.lit(1)).alias("count")).write.mode("overwrite").parquet(out)
        result["seconds"] = now() - started
    elif variant == "aip":
        started = now()
        df = spark.read.parquet(source)
        df.groupBy("word").applyInPandas(count_words, OUTPUT_SCHEMA).write.mode("overwrite").parquet(out)
        result["seconds"] = now() - started
    elif variant in ("hash", "hash_nocombine"):
        fn = buffering.cached_state(max_entries=args.max_entries, store="rocksdb")(count_aggregate())
        started = now()
        stream = spark.readStream.schema("word string").parquet(source)
        query = run_stream(
            stream,
            fn,
            key="word",
            checkpoint_location=os.path.join(work, "checkpoint"),
            sink=ParquetSink(out),
            parallelism=args.parallelism,
            trigger={"availableNow": True},
            workdir=os.path.join(work, "rocksdb"),
            combine_before_shuffle=False if variant == "hash_nocombine" else None,
        )
        query.awaitTermination()
        result["seconds"] = now() - started
        if query.exception() is not None:
            raise RuntimeError(f"hash mode query failed: {query.exception()}")
        batches = [p for p in query.recentProgress if p.numInputRows]
        result["micro_batches"] = len(batches)
        if len(batches) != 1:
            log(f"WARNING: hash mode ran {len(batches)} micro-batches with input, not 1")
        close_worker_instances(spark)
    else:
        raise ValueError(variant)
    result["load_after"] = list(os.getloadavg())
    return result


# ---------------------------------------------------------------- correctness
def read_counts(out: str) -> pd.Series:
    """word -> count of one variant's output (read with pyarrow; hash mode's batch_id partition ignored)."""
    import pyarrow.dataset as ds

    table = ds.dataset(out, format="parquet", partitioning="hive").to_table(columns=["word", "count"])
    pdf = table.to_pandas()
    return pd.Series(pdf["count"].to_numpy(np.int64), index=pdf["word"].to_numpy(), dtype=np.int64).sort_index()


def verify(exact: pd.Series, out: str) -> list[str]:
    try:
        got = read_counts(out)
    except Exception as err:  # noqa: BLE001
        return [f"output unreadable: {err}"]
    problems = []
    if got.index.has_duplicates:
        problems.append(f"{int(got.index.duplicated().sum())} words appear more than once")
        got = got[~got.index.duplicated(keep="last")]
    missing = exact.index.difference(got.index)
    extra = got.index.difference(exact.index)
    if len(missing) or len(extra):
        problems.append(f"words differ from the input: {len(missing)} missing, {len(extra)} extra")
    common = exact.index.intersection(got.index)
    wrong = int((exact.loc[common] != got.loc[common]).sum())
    if wrong:
        problems.append(f"{wrong} counts differ from an exact count of the input")
    return problems


# ---------------------------------------------------------------- main
def _parse_variants(text: str) -> list[str]:
    chosen = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in chosen if v not in VARIANTS]
    if bad or not chosen:
        raise SystemExit(f"--variants: choose from {','.join(VARIANTS)}, got {text!r}")
    if "batch" not in chosen:
        chosen.insert(0, "batch")  # the ratios are against it
    return chosen


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__.split("\n", 1)[0], default_size=4_000_000, quick_size=200_000,
                         size_help="records (words) in the input")
    parser.add_argument("--keys", type=int, default=None,
                        help=f"distinct words (default {KEYS:,}; --quick {QUICK_KEYS:,})")
    parser.add_argument("--files", type=int, default=4, help="parquet files the input is written as (default 4)")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated subset of {','.join(VARIANTS)} (default {','.join(DEFAULT_VARIANTS)}; "
                             "batch always runs)")
    parser.add_argument("--parallelism", type=int, default=4, help="shuffle partitions = run_batch/run_stream tasks")
    parser.add_argument("--max-entries", type=int, default=10_000, help="hash mode's cached_state max_entries")
    parser.add_argument("--warmup", type=int, default=20_000, help="records of the untimed warm-up run (default 20,000)")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--driver-memory", default="2g", help="spark.driver.memory (default 2g)")
    args = parser.parse_args(argv)
    started = now()
    size = resolve_size(args)
    keys = args.keys if args.keys is not None else (QUICK_KEYS if args.quick else KEYS)
    if keys < 1 or args.files < 1 or args.parallelism < 1 or args.warmup < 1:
        raise SystemExit("--keys, --files, --parallelism and --warmup must be positive")
    repeat = resolve_repeat(args, default=1, quick=1)
    variants = _parse_variants(args.variants)

    params = {
        "records": size,
        "keys": keys,
        "files": args.files,
        "generator": "word ids uniform over keys (numpy default_rng([seed, keys])), word = 'w<id>'",
        "seed": args.seed,
        "variants": {v: LABELS[v] for v in variants},
        "parallelism": args.parallelism,
        "hash_mode": f"run_stream, trigger availableNow (one micro-batch), cached_state(max_entries="
                     f"{args.max_entries}, store='rocksdb'), aggregate({{'count': Count()}}), runner defaults",
        "sink": "parquet (every variant)",
        "timed": "from reading the input (or starting the query) to the end of the parquet write",
        "warmup_records": args.warmup,
        "repeat": repeat,
        "statistic": "best (min seconds) over repetitions",
        "master": args.master,
        "quick": args.quick,
    }
    print(f"bounded: WordCount, {size:,} records, {keys:,} words, {args.files} parquet files, variants {variants}, "
          f"parallelism {args.parallelism}, {args.master}; best of {repeat}; pid {os.getpid()}", flush=True)

    spark = start_spark(args)
    results: dict[str, Any] = {"runs": {v: [] for v in variants}}
    with temp_dir("opbuffer-bounded-") as root:
        source = os.path.join(root, "input")
        warm_source = os.path.join(root, "warmup")
        with_time = now()
        ids = generate(size, keys, args.seed)
        write_words(ids, source, args.files)
        write_words(generate(args.warmup, min(keys, args.warmup), args.seed + 1), warm_source, min(args.files, 2))
        log(f"input written in {now() - with_time:.1f} s")
        exact = exact_counts(ids, keys)
        del ids

        for variant in variants:
            log(f"warm-up: {variant}")
            run_variant(spark, variant, warm_source, os.path.join(root, f"warmup-{variant}"), args)

        outs: dict[str, str] = {}
        for rep in range(repeat):
            order = variants if rep % 2 == 0 else list(reversed(variants))
            for variant in order:
                run = run_variant(spark, variant, source, os.path.join(root, f"{variant}-{rep}"), args)
                results["runs"][variant].append(run)
                log(f"{variant} run {rep + 1}: {run['seconds']:.2f} s (load {run['load_before'][0]:.1f} -> "
                    f"{run['load_after'][0]:.1f})")
                outs[variant] = run["out"]
            checks = {v: verify(exact, outs[v]) for v in variants}  # untimed, before the next round overwrites
            for v, problems in checks.items():
                for problem in problems:
                    print(f"CORRECTNESS ({v}, round {rep + 1}): {problem}", flush=True)
            results.setdefault("verification", []).append({v: {"ok": not p, "problems": p} for v, p in checks.items()})
            for v in variants:
                if rep + 1 < repeat:
                    shutil.rmtree(os.path.dirname(outs[v]), ignore_errors=True)
    spark.stop()

    best = {v: min(r["seconds"] for r in results["runs"][v]) for v in variants}
    all_ok = all(c["ok"] for round_ in results["verification"] for c in round_.values())
    rows = []
    for v in variants:
        target = TARGETS.get(v)
        r = best[v] / best["batch"]
        rows.append([
            LABELS[v],
            best[v],
            size / best[v],
            r,
            "-" if target is None else f">={target:g}x {'PASS' if r >= target else 'FAIL'}",
            "ok" if all(round_[v]["ok"] for round_ in results["verification"]) else "FAILED",
        ])
    print()
    print_table(["variant", "seconds", "records/s", "time / time(batch)", "target", "check"], rows,
                title=f"WordCount over {size:,} records / {keys:,} words, best of {repeat}; "
                      f"ratio = seconds(variant) / seconds(run_batch aggregate) in the same run")
    print(f"correctness: {'ALL OK' if all_ok else 'FAILED'} (every word's count equals an exact count of the input)")
    if "sql" in best and "hash" in best:
        ceiling = best["hash"] / best["sql"]
        results["ceiling_hash_vs_sql"] = ceiling
        print(f"ceiling: hash / Spark SQL alone = {ceiling:.2f}x, the most any run_batch of this job could reach "
              f"against this hash mode (target {TARGETS['hash']:g}x)")

    results["best_seconds"] = best
    results["ratios_vs_batch"] = {v: best[v] / best["batch"] for v in variants}
    results["correctness_ok"] = all_ok
    for runs in results["runs"].values():
        for run in runs:
            run.pop("out", None)
    targets = [
        check_target(f"{v} / run_batch (run_batch this many times faster)", best[v] / best["batch"], t, unit="x")
        for v, t in TARGETS.items() if v in best
    ]
    write_record(NAME, params=params, results=results, targets=targets, out=args.out, started=started)
    print(f"runtime: {now() - started:.1f} s", flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
