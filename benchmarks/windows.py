"""Windowed aggregation end to end in Spark: run_stream's aggregate(window=...) vs Spark SQL's own.

Workload: ``--keys`` keys (default 100,000) x ``--windows`` tumbling windows
of one minute (default 10): ``--rows`` rows (default 2,000,000), keys uniform,
event times uniform over the windows and in order by file: file i holds the
rows of window i (one micro-batch per file, ``maxFilesPerTrigger=1``,
``trigger(availableNow=True)``). Columns ``k long, ts timestamp, v long``.
The watermark delay is 10 s, so window i closes in the batch after file i+1:
every window is emitted once (emission on watermark / append mode) and its
state deleted. ``--windows`` + 2 micro-batches (see below).

The variants (fresh checkpoint and output directories each):

(s) Spark SQL: ``withWatermark("ts", "10 seconds").groupBy(window("ts",
    "1 minute"), "k").agg(count(1), sum("v"))``, append mode, RocksDB state
    store (``RocksDBStateStoreProvider``), written by ``foreachBatch`` with
    ``ParquetSink``.
(o) ``run_stream`` of ``cached_state(max_entries=..., store="rocksdb")(
    aggregate({"n": Count(), "s": Sum("v")}, window=Tumbling("1 minute")))``
    with ``event_time="ts"``, ``watermark_delay_ms=10000`` (Spark SQL combines
    per (key, window start) before the shuffle), the same ``ParquetSink``.
(g) (o) with ``cached_state(..., layout="key_group")``: the windows' state kept
    as one block per key group (``state.blocks``), merged as byte ranges.
(r) (g) with ``run_stream(combine_before_shuffle=False)``: the rows shuffled
    as they are (as in (f)); each instance folds its batch's rows per (key,
    window start) as columns.
(f) the floor: ``repartition(P, "k")``, an identity ``mapInPandas`` and the
    ``noop`` sink; (r)'s own floor.
(c) (o)'s own floor: what (o) does without state: Spark SQL's combine per
    (key, window start), ``repartition(P, "k")``, an identity ``mapInPandas``
    of the combined rows and the ``noop`` sink.

Timed: query build + start .. ``awaitTermination()`` returns; fastest of
``--repeat`` rounds. Ratios from the same run: ``t(s) / t(o)`` (how many times
faster than Spark SQL; target >= 3x) and ``t(o) / t(f)`` (over the floor);
``t(s) / t(c)`` is the most any run_stream built this way could reach.

Two closing files of one far-future row each (key -1) move both watermarks
past every window. Correctness: each variant emitted every window once, with
the count and sum of a pandas groupby of the input.

    python -m benchmarks.windows [--quick] [--rows N] [--keys N] [--windows N] [--repeat N]
        [--parallelism P] [--max-entries N] [--variants s,o,g,r,f,c]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import pandas as pd

import buffering
from buffering import Count, Sum
from buffering.windows import Tumbling

from ._common import check_target, local_spark_builder, log, now, print_table, write_record

NAME = "windows"
REPO_ROOT = Path(__file__).resolve().parent.parent
ROWS, KEYS, WINDOWS = 2_000_000, 100_000, 10
QUICK = {"rows": 40_000, "keys": 2_000, "windows": 4}
WINDOW_MS = 60_000
DELAY_MS = 10_000
SCHEMA = "k long, ts timestamp, v long"
CLOSING_KEY = -1  # the key of the far-future rows that close every window
VARIANTS = ("s", "o", "g", "r", "f", "c")
ORDER = ("f", "c", "o", "g", "r", "s")
LABELS = {
    "s": "(s) Spark SQL groupBy(window, k).agg, RocksDB state, append",
    "o": "(o) run_stream aggregate(window=Tumbling)",
    "g": "(g) (o) with cached_state(layout='key_group')",
    "r": "(r) (g) without the SQL combine: raw rows in",
    "f": "(f) floor: repartition + identity mapInPandas + noop",
    "c": "(c) (o)'s floor: SQL combine per (k, window) + repartition + identity mapInPandas + noop",
}
TARGET_VS_SPARK = 3.0


def generate(rows: int, keys: int, windows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng([seed, keys])
    ts = np.sort(rng.integers(0, windows * WINDOW_MS, rows))  # in order: file i is window i
    return pd.DataFrame({
        "k": rng.integers(0, keys, rows, dtype=np.int64),
        "ts": pd.to_datetime(ts, unit="ms", utc=True).astype("datetime64[us, UTC]"),
        "v": rng.integers(0, 100, rows, dtype=np.int64),
    })


def write_files(df: pd.DataFrame, directory: str, windows: int) -> list[int]:
    """File i holds window i; then two files of one far-future row of CLOSING_KEY each: after them both
    engines' watermarks have passed every window (Spark closes them in a batch without data, run_stream in
    the batch of the second file), so both emit every window."""
    os.makedirs(directory, exist_ok=True)
    window = (df["ts"].astype("int64") // 1000 // WINDOW_MS).to_numpy()  # us -> ms -> window index
    far = (windows + 100) * WINDOW_MS
    closing = [
        pd.DataFrame({"k": [CLOSING_KEY], "ts": pd.to_datetime([far + i], unit="ms", utc=True).astype("datetime64[us, UTC]"),
                      "v": [0]})
        for i in range(2)
    ]
    sizes = []
    for i, part in enumerate([df[window == i].reset_index(drop=True) for i in range(windows)] + closing):
        path = os.path.join(directory, f"part-{i:05d}.parquet")
        part.to_parquet(path, index=False)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
        sizes.append(len(part))
    return sizes


def _identity(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    yield from batches


def run_variant(spark: Any, source: str, base: str, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from buffering.spark import ParquetSink, run_stream

    os.makedirs(base)
    checkpoint, out = os.path.join(base, "checkpoint"), os.path.join(base, "out")
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
    result: dict[str, Any] = {"variant": variant, "out": out, "load_before": os.getloadavg()[0]}
    started = now()
    if variant == "s":
        agg = (
            stream.withWatermark("ts", f"{DELAY_MS // 1000} seconds")
            .groupBy(F.window("ts", "1 minute").alias("w"), "k")
            .agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"))
            .select("k", F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"), "n", "s")
        )
        query = (
            agg.writeStream.outputMode("append").foreachBatch(ParquetSink(out))
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        )
    elif variant in ("o", "g", "r"):
        op = buffering.cached_state(
            max_entries=args.max_entries, store="rocksdb", layout="key" if variant == "o" else "key_group"
        )(buffering.aggregate({"n": Count(), "s": Sum("v")}, window=Tumbling("1 minute")))
        query = run_stream(
            stream, op, key="k", event_time="ts", watermark_delay_ms=DELAY_MS, checkpoint_location=checkpoint,
            sink=ParquetSink(out), parallelism=args.parallelism, trigger={"availableNow": True},
            workdir=os.path.join(base, "work"), combine_before_shuffle=False if variant == "r" else None,
        )
    elif variant == "f":
        parallelism, schema = args.parallelism, stream.schema

        def floor(batch_df: Any, batch_id: int) -> None:
            (batch_df.repartition(parallelism, "k").mapInPandas(_identity, schema)
             .write.format("noop").mode("overwrite").save())

        query = stream.writeStream.foreachBatch(floor).option("checkpointLocation", checkpoint).trigger(
            availableNow=True).start()
        result["out"] = None
    elif variant == "c":
        parallelism = args.parallelism
        window = Tumbling("1 minute")

        def combine_floor(batch_df: Any, batch_id: int) -> None:
            start = F.expr(window.start_sql("unix_millis(ts)")).alias("window_start")
            combined = batch_df.groupBy("k", start).agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"))
            (combined.repartition(parallelism, "k").mapInPandas(_identity, combined.schema)
             .write.format("noop").mode("overwrite").save())

        query = stream.writeStream.foreachBatch(combine_floor).option("checkpointLocation", checkpoint).trigger(
            availableNow=True).start()
        result["out"] = None
    else:
        raise ValueError(variant)
    query.awaitTermination()
    result["seconds"] = now() - started
    result["load_after"] = os.getloadavg()[0]
    result["batch_seconds"] = [
        json.loads(p.json).get("durationMs", {}).get("triggerExecution", 0) / 1000 for p in query.recentProgress
    ]
    if variant in ("o", "g", "r"):
        metrics = query.batch_metrics
        result["runner_batch_seconds"] = [m.seconds for m in metrics]
        result["rows_out"] = sum(m.rows_out for m in metrics)
        result["dropped_late_rows"] = sum(m.dropped_late_rows for m in metrics)
    return result


def close_worker_instances(spark: Any, tasks: int = 8) -> None:
    """Close the operator instances the Python workers keep between batches (their memory, their RocksDBs)."""

    def close(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from buffering.spark import _workers

        for _ in batches:
            pass
        _workers.close_all()
        yield pd.DataFrame({"pid": [os.getpid()]})

    spark.range(0, tasks, numPartitions=tasks).mapInPandas(close, "pid long").collect()


def read_windows(out: str) -> pd.DataFrame:
    import pyarrow.dataset as ds

    df = ds.dataset(out, format="parquet", partitioning="hive").to_table().to_pandas()
    start = pd.to_datetime(df["window_start"], utc=True).astype("datetime64[ms, UTC]").astype("int64")
    df = df[df["k"] != CLOSING_KEY]
    start = start[df.index]
    return pd.DataFrame({"k": df["k"].astype("int64"), "start": start, "n": df["n"].astype("int64"),
                         "s": df["s"].astype("int64")})


def verify(data: pd.DataFrame, outs: dict[str, str]) -> dict[str, Any]:
    """Each variant's windows equal the pandas groupby; both emitted (nearly) the same windows."""
    ms = data["ts"].astype("int64") // 1000
    expected = data.assign(start=ms - ms % WINDOW_MS).groupby(["k", "start"]).agg(n=("v", "size"), s=("v", "sum"))
    check: dict[str, Any] = {"ok": True, "problems": [], "expected_windows": len(expected)}
    for v, out in outs.items():
        got = read_windows(out)
        dupes = int(got.duplicated(["k", "start"]).sum())
        got = got.set_index(["k", "start"])
        joined = got.join(expected, rsuffix="_x", how="left")
        wrong = int(((joined["n"] != joined["n_x"]) | (joined["s"] != joined["s_x"])).sum())
        missing = len(expected.drop(index=got.index, errors="ignore"))
        check[v] = {"windows": len(got), "wrong": wrong, "duplicates": dupes, "missing": missing}
        if wrong or dupes or missing:
            check["ok"] = False
            check["problems"].append(f"({v}) {wrong} wrong, {dupes} duplicated, {missing} missing windows")
    return check


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except Exception:  # noqa: BLE001
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _git_head() -> Optional[str]:
    try:
        done = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return done.stdout.strip() or None
    except Exception:  # noqa: BLE001
        return None


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    p.add_argument("--rows", type=int, default=None, help=f"rows (default {ROWS:,})")
    p.add_argument("--keys", type=int, default=None, help=f"keys (default {KEYS:,})")
    p.add_argument("--windows", type=int, default=None, help=f"one-minute windows = files = micro-batches (default {WINDOWS})")
    p.add_argument("--repeat", type=int, default=1, help="rounds; the fastest run per variant is reported")
    p.add_argument("--parallelism", type=int, default=4, help="shuffle partitions = operator instances (default 4)")
    p.add_argument("--max-entries", type=int, default=100_000, help="cached_state(max_entries=) of (o), per instance")
    p.add_argument("--variants", default=",".join(VARIANTS), help="which of s,o,g,r,f,c to run (default all)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="4g")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run of each variant")
    p.add_argument("--note", default=None, help="free text kept in the JSON record")
    p.add_argument("--out", default=None, help="path of the JSON record (default benchmarks/results/windows.json)")
    return p


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    args = make_parser().parse_args(argv)
    started = now()
    rows = args.rows or (QUICK["rows"] if args.quick else ROWS)
    keys = args.keys or (QUICK["keys"] if args.quick else KEYS)
    windows = args.windows or (QUICK["windows"] if args.quick else WINDOWS)
    variants = [v for v in args.variants.split(",") if v]
    if any(v not in VARIANTS for v in variants):
        raise SystemExit(f"--variants takes some of {VARIANTS}, got {args.variants!r}")
    params = {
        "rows": rows, "keys": keys, "windows": windows, "window": "tumbling 1 minute", "watermark_delay_ms": DELAY_MS,
        "variants": {v: LABELS[v] for v in variants}, "repeat": args.repeat, "parallelism": args.parallelism,
        "max_entries": args.max_entries, "master": args.master, "quick": args.quick,
        "source": "readStream.parquet, maxFilesPerTrigger=1 (file i = window i), availableNow",
        "sink": "(s)/(o): ParquetSink; (f): noop", "timed": "query build + start .. awaitTermination()",
        "uptime_start": _uptime(), "git_head": _git_head(), "note": args.note,
    }
    print(f"windows: {rows:,} rows, {keys:,} keys x {windows} one-minute windows, variants {','.join(variants)}, "
          f"{args.master}, parallelism {args.parallelism}, repeat {args.repeat}", flush=True)
    print(f"load at start: {params['uptime_start']}", flush=True)
    root = tempfile.mkdtemp(prefix="opbuffer-windows-")
    builder = local_spark_builder("opbuffer-windows", master=args.master, driver_memory=args.driver_memory,
                                  parallelism=args.parallelism)
    spark = (
        builder.config("spark.sql.streaming.stateStore.providerClass",
                       "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    results: dict[str, Any] = {}
    targets: list[dict] = []
    runs_done = 0
    try:
        order = [v for v in ORDER if v in variants]
        if not args.no_warmup:
            warm = os.path.join(root, "warmup-input")
            write_files(generate(4_000, 100, 3, args.seed), warm, 3)
            for v in order:
                t = now()
                run_variant(spark, warm, os.path.join(root, f"warmup-{v}"), v, args)
                log(f"warm-up ({v}): {now() - t:.1f} s")
            close_worker_instances(spark)
        data = generate(rows, keys, windows, args.seed)
        source = os.path.join(root, "input")
        sizes = write_files(data, source, windows)
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in order}
        for rep in range(args.repeat):
            for v in order:
                runs_done += 1
                log(f"({v}) run {rep + 1}/{args.repeat} (load {os.getloadavg()[0]:.2f}) ...")
                r = run_variant(spark, source, os.path.join(root, f"{v}-{runs_done}"), v, args)
                runs[v].append(r)
                log(f"({v}) {r['seconds']:.2f} s, load {r['load_before']:.2f} -> {r['load_after']:.2f}")
                if v in ("o", "g", "r"):
                    close_worker_instances(spark)
        best = {v: min(rs, key=lambda r: r["seconds"]) for v, rs in runs.items()}
        check = verify(data, {v: best[v]["out"] for v in ("s", "o", "g", "r") if v in best})
        t = {v: r["seconds"] for v, r in best.items()}
        table = []
        for v in order:
            vs_spark = t["s"] / t[v] if "s" in t else "-"
            vs_floor = t[v] / t["f"] if "f" in t else "-"
            per_batch = best[v].get("runner_batch_seconds") or best[v]["batch_seconds"]
            table.append([LABELS[v], t[v], vs_spark, vs_floor, "/".join(f"{s:.1f}" for s in per_batch),
                          f"{best[v]['load_before']:.1f}-{best[v]['load_after']:.1f}"])
        print()
        print_table(["variant", "seconds", "vs (s) x faster", "vs floor (x)", "per batch s", "load 1m"], table,
                    title=f"{rows:,} rows, {keys:,} keys x {windows} windows, {args.master}, parallelism "
                          f"{args.parallelism}; fastest of {args.repeat}; same run")
        print(f"verify: {'OK' if check['ok'] else 'MISMATCH ' + '; '.join(check['problems'])}; "
              f"{check['expected_windows']:,} windows expected; "
              + "; ".join(f"({v}) {check[v]['windows']:,} emitted"
                          for v in ("s", "o", "g", "r") if v in check))
        for v in ("o", "g", "r"):
            if v in best:
                print(f"run_stream ({v}): rows out {best[v]['rows_out']:,}, late rows {best[v]['dropped_late_rows']}")
            if "s" in t and v in t:
                targets.append(check_target(f"({v}) vs Spark SQL (s)", t["s"] / t[v], TARGET_VS_SPARK, unit="x"))
        for v in ("f", "c"):
            if "s" in t and v in t:
                print(f"ceiling: Spark SQL (s) / {LABELS[v][:3]} = {t['s'] / t[v]:.2f}x (no run_stream of this design is "
                      "faster than its floor)")
        results = {
            "rows_per_batch": sizes, "seconds_best": t, "seconds_all": {v: [r["seconds"] for r in rs] for v, rs in runs.items()},
            "vs_spark": {v: t["s"] / t[v] for v in t} if "s" in t else None,
            "vs_floor": {v: t[v] / t["f"] for v in t} if "f" in t else None,
            "runs": {v: [{k: val for k, val in r.items() if k != "out"} for r in rs] for v, rs in runs.items()},
            "verification": check,
        }
    finally:
        params["uptime_end"] = _uptime()
        print(f"load at end: {params['uptime_end']}", flush=True)
        try:
            spark.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)
    write_record(NAME, params=params, results=results, targets=targets, out=args.out, started=started)
    print(f"runtime: {now() - started:.1f} s", flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
