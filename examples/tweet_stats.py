"""Tweet stats: the main job. Views and approximate viewers per tweet over a skewed stream, on local Spark.

What it does, end to end:

1. generates a skewed (zipf) stream of views ``(tweet, user, ts)`` as parquet
   files, one file per micro-batch;
2. runs :data:`TWEET_STATS` through :func:`buffering.spark.run_stream`: a
   ``buffering.aggregate`` operator (a combined mini-batch: a count and a
   HyperLogLog sketch of the users per tweet, pre-aggregated before the
   shuffle and merged into the state once per tweet per micro-batch), its
   state in RocksDB behind a bounded write-back cache (``cached_state``), a
   key-group checkpoint committed per micro-batch, output to a
   :class:`~buffering.spark.ParquetSink`. It prints each batch's throughput and
   cache hit ratio. ``--operator function`` runs :func:`tweet_stats` instead,
   the same stats as a decorated user function (``mini_batch(combine=...)`` on
   ``cached_state``);
3. runs Spark's own ``groupBy("tweet").applyInPandasWithState`` with
   :func:`plain_tweet_stats`, an undecorated function that updates a count and
   a datasketches HLL row by row, on the same files;
4. checks that both report the same final view count for every tweet (and
   that it is the number of generated views), and writes a PNG chart of the
   per-batch and total times of the two runs.

Run it (``bash scripts/demo.sh`` does, with matplotlib from the ``demo`` extra)::

    python examples/tweet_stats.py --views 200000 --tweets 10000 --batches 4

Options: ``--views``, ``--tweets``, ``--users``, ``--batches``,
``--partitions``, ``--cache-entries``, ``--operator``, ``--out`` (default
``examples/output/tweet_stats``). The process exits with 1 when the view
counts disagree.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import pandas as pd

import buffering
from buffering import ApproxDistinct, Count, spec_of
from buffering.spark import BatchMetrics, ParquetSink, run_stream

from _spark import local_spark, ship_by_value

INPUT_SCHEMA = "tweet long, user long, ts timestamp"
OUTPUT_SCHEMA = "tweet long, views long, viewers long"
#: Spark's state schema of the plain applyInPandasWithState run (a serialized HLL sketch).
PLAIN_STATE_SCHEMA = "views long, sketch binary"
HLL_LG_K = 12

VIEWS = Count()
VIEWERS = ApproxDistinct("user", lg_k=HLL_LG_K)


# ------------------------------------------------------------------ the operators

#: Cached tweets per operator instance: of the default run's 9,007 viewed tweets an instance
#: holds about 2,250, and a batch touches about 1,400 of them, which a warm cache keeps.
CACHE_ENTRIES = 2_000

#: The main job's operator: per tweet, a count and an HLL sketch of the users, with no user code.
#: ``aggregate`` is a combined mini-batch (accumulators are merged before the shuffle and once per
#: key per flush, vectorized); ``cached_state`` keeps the accumulators in RocksDB behind a cache.
TWEET_STATS = buffering.cached_state(max_entries=CACHE_ENTRIES, store="rocksdb")(
    buffering.aggregate({"views": VIEWS, "viewers": VIEWERS})
)

_OUTPUT_COLUMNS = pd.Index(["tweet", "views", "viewers"])


@buffering.mini_batch(combine={"views": VIEWS, "viewers": VIEWERS})
@buffering.cached_state(max_entries=CACHE_ENTRIES, store="rocksdb")
def tweet_stats(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """The same stats as a decorated user function (``--operator function``).

    ``rows`` hold pre-aggregated partials (one row per flush: ``views`` a
    count, ``viewers`` an HLL sketch), so this runs once per tweet per
    micro-batch, however many views the tweet got. The state is
    ``(views, sketch)``: live Python objects in the cache, pickled to RocksDB
    only when evicted or checkpointed.
    """
    views, viewers = state.get if state.exists else (0, VIEWERS.empty())
    for combined in rows:
        for n, sketch in zip(combined["views"].tolist(), combined["viewers"].tolist()):
            views = VIEWS.merge(views, int(n))
            viewers = VIEWERS.merge(viewers, sketch)
    state.update((views, viewers))
    # One small frame per call is the costliest step here: build it from one int64 block
    # (several times cheaper than pd.DataFrame({...}) with a list per column).
    yield pd.DataFrame(np.array([[key[0], views, VIEWERS.result(viewers)]], dtype=np.int64), columns=_OUTPUT_COLUMNS)


def plain_tweet_stats(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """The same stats written the usual way for ``applyInPandasWithState``: one update per row.

    State (Spark's, ``views long, sketch binary``): the count and the
    serialized HLL sketch.
    """
    import datasketches

    if state.exists:
        views, blob = state.get
        sketch = datasketches.hll_sketch.deserialize(bytes(blob))
    else:
        views, sketch = 0, datasketches.hll_sketch(HLL_LG_K, datasketches.tgt_hll_type.HLL_8)
    for pdf in rows:
        for user in pdf["user"].tolist():
            views += 1
            sketch.update(int(user))
    state.update((views, sketch.serialize_compact()))
    yield pd.DataFrame({"tweet": [key[0]], "views": [views], "viewers": [int(round(sketch.get_estimate()))]})


# ------------------------------------------------------------------ input


def generate_views(directory: str, views: int, tweets: int, users: int, batches: int, seed: int = 42) -> list[pd.DataFrame]:
    """Write ``views`` zipf-skewed views of ``tweets`` tweets as ``batches`` parquet files; return the frames.

    Tweet ``0`` is the most viewed (weight ``1 / rank**1.1``); users are uniform.
    """
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, tweets + 1, dtype=np.float64) ** 1.1
    weights /= weights.sum()
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    start = pd.Timestamp("2026-01-01", tz="UTC").value // 1_000
    bounds = np.linspace(0, views, batches + 1).astype(np.int64).tolist()
    frames = []
    for b, (offset, end) in enumerate(zip(bounds, bounds[1:])):
        rows = end - offset
        frame = pd.DataFrame(
            {
                "tweet": rng.choice(tweets, size=rows, p=weights).astype(np.int64),
                "user": rng.integers(0, users, size=rows).astype(np.int64),
                # one view every 10 ms, in microseconds since the epoch
                "ts": pd.to_datetime(start + (np.arange(rows, dtype=np.int64) + offset) * 10_000, unit="us", utc=True).astype(
                    "datetime64[us, UTC]"  # Spark reads micros, not the nanoseconds pandas writes by default
                ),
            }
        )
        frame.to_parquet(os.path.join(directory, f"views-{b:05d}.parquet"), index=False)
        frames.append(frame)
    return frames


def view_stream(spark: Any, directory: str) -> Any:
    """The files as a stream, one file per micro-batch."""
    return spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).parquet(directory)


# ------------------------------------------------------------------ the runs


@dataclass
class Run:
    """Timings of one streaming run."""

    name: str
    total_seconds: float
    #: batch id -> seconds: the numbers printed per batch (and drawn in the chart). opbuffer: its
    #: runner's time for the batch (``BatchMetrics.seconds``); plain: Spark's triggerExecution.
    batch_seconds: dict[int, float]
    metrics: list[BatchMetrics] = field(default_factory=list)


def _trigger_seconds(query: Any) -> dict[int, float]:
    """batch id -> seconds of Spark's progress reports (triggerExecution: the whole micro-batch)."""
    out: dict[int, float] = {}
    for progress in query.recentProgress:
        if progress.numInputRows > 0:
            out[int(progress.batchId)] = progress.durationMs.get("triggerExecution", 0) / 1000.0
    return out


#: How an instance started when its cache was empty although it had state (``per_instance[i]["start"]``).
COLD_STARTS = ("adopted", "restored")
COLD_INSTANCE = (
    "a cold instance: its task ran in a Python worker that did not hold it, so its cache started empty "
    "(adopted: it took over the working store another Python worker of the executor left; restored: it was "
    "rebuilt from the checkpoint), and its first reads of the batch miss"
)


def cold_starts(m: BatchMetrics) -> dict[str, int]:
    """How many of the batch's instances started cold, by how they started (empty when all were warm or new)."""
    out: dict[str, int] = {}
    for instance in m.per_instance:
        start = instance.get("start")  # absent in metrics of an opbuffer that did not report it
        if start in COLD_STARTS:
            out[start] = out.get(start, 0) + 1
    return out


def batch_printer() -> Any:
    """The ``on_batch`` callback: one line per batch; the first cold instance also prints what that is."""
    explained = False

    def print_batch(m: BatchMetrics) -> None:
        nonlocal explained
        cold = cold_starts(m)
        how = ", ".join(f"{n} {start}" for start, n in sorted(cold.items()))
        print(
            f"  batch {m.batch_id}: {m.rows_in:>9,} rows in {m.seconds:6.2f} s = {m.rows_per_second:>10,.0f} rows/s, "
            f"cache hit ratio {m.cache_hit_ratio:5.3f} ({m.cache_hits:,} hits, {m.cache_misses:,} misses, "
            f"{m.cache_evictions:,} evictions), {m.calls:,} calls, checkpoint {m.checkpoint_bytes / 1e6:.1f} MB"
            + (f", {sum(cold.values())} of {len(m.per_instance)} instances cold ({how})" if cold else ""),
            flush=True,
        )
        if cold and not explained:
            print(f"    ({COLD_INSTANCE})", flush=True)
            explained = True

    return print_batch


def _import_worker_modules(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    import datasketches  # noqa: F401
    import rocksdict  # noqa: F401

    import buffering.spark._task  # noqa: F401

    for frame in frames:
        yield frame


def warm_up(spark: Any) -> float:
    """Start the JVM's code paths and the Python workers (with their imports) before anything is timed."""
    started = time.perf_counter()
    spark.range(0, 1_000, numPartitions=2).mapInPandas(_import_worker_modules, "id long").groupBy().count().collect()
    return time.perf_counter() - started


def opbuffer_operator(operator: str = "aggregate", cache_entries: Optional[int] = None) -> Any:
    """TWEET_STATS (or the tweet_stats function), with ``cache_entries`` instead of the cache it declares when given."""
    fn = TWEET_STATS if operator == "aggregate" else tweet_stats
    if cache_entries is not None:
        fn = buffering.cached_state(max_entries=cache_entries, store="rocksdb")(fn)
    return fn


def run_opbuffer(spark: Any, input_dir: str, out_dir: str, fn: Any, operator: str = "aggregate", parallelism: Optional[int] = None) -> Run:
    """``fn`` (see :func:`opbuffer_operator`) through buffering.spark.run_stream; prints each batch's metrics."""
    started = time.perf_counter()
    query = run_stream(
        view_stream(spark, input_dir),
        fn,
        key="tweet",
        output_schema=None if operator == "aggregate" else OUTPUT_SCHEMA,  # aggregate() infers it
        checkpoint_location=os.path.join(out_dir, "checkpoint"),
        sink=ParquetSink(os.path.join(out_dir, "output")),
        parallelism=parallelism,
        trigger={"availableNow": True},
        query_name="tweet_stats_opbuffer",
        on_batch=batch_printer(),
    )
    query.awaitTermination()
    total = time.perf_counter() - started
    metrics = query.batch_metrics
    # The chart draws what the lines printed: the runner's own seconds per batch.
    return Run("opbuffer (run_stream)", total, {m.batch_id: m.seconds for m in metrics}, metrics)


def run_plain(spark: Any, input_dir: str, out_dir: str) -> Run:
    """plain_tweet_stats through Spark's own groupBy().applyInPandasWithState."""
    started = time.perf_counter()
    query = (
        view_stream(spark, input_dir)
        .groupBy("tweet")
        .applyInPandasWithState(plain_tweet_stats, OUTPUT_SCHEMA, PLAIN_STATE_SCHEMA, "Update", "NoTimeout")
        .writeStream.outputMode("update")
        .foreachBatch(ParquetSink(os.path.join(out_dir, "output")))
        .option("checkpointLocation", os.path.join(out_dir, "checkpoint"))
        .trigger(availableNow=True)
        .queryName("tweet_stats_plain")
        .start()
    )
    query.awaitTermination()
    total = time.perf_counter() - started
    return Run("applyInPandasWithState", total, _trigger_seconds(query))


def final_stats(spark: Any, out_dir: str) -> pd.DataFrame:
    """The last row written for each tweet (its final views and viewers), indexed by tweet."""
    out = ParquetSink(os.path.join(out_dir, "output")).read(spark).toPandas()
    out = out.sort_values(["tweet", "batch_id"]).groupby("tweet").tail(1)
    return out.set_index("tweet")[["views", "viewers"]].sort_index()


# ------------------------------------------------------------------ chart


def write_chart(path: str, runs: Sequence[Run], views: int, tweets: int) -> Optional[str]:
    """A PNG with the per-batch and total seconds of each run; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (per_batch, total) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 1.3]})
    batch_ids = sorted(set().union(*(r.batch_seconds for r in runs)))
    width = 0.8 / len(runs)
    colors = ["#1f77b4", "#d62728", "#2ca02c"]
    for i, run in enumerate(runs):
        xs = [b + (i - (len(runs) - 1) / 2) * width for b in batch_ids]
        per_batch.bar(xs, [run.batch_seconds.get(b, 0.0) for b in batch_ids], width, label=run.name, color=colors[i % 3])
    per_batch.set_xticks(batch_ids)
    per_batch.set_xlabel("micro-batch")
    per_batch.set_ylabel("seconds (as printed per batch)")
    per_batch.set_title("time per micro-batch: opbuffer's runner / Spark's trigger")
    per_batch.legend(loc="upper center", ncol=len(runs))
    per_batch.margins(y=0.18)  # room for the legend above the tallest bar
    bars = total.bar(range(len(runs)), [r.total_seconds for r in runs], color=colors[: len(runs)])
    total.bar_label(bars, fmt="%.1f s")
    total.margins(y=0.12)
    total.set_xticks(range(len(runs)))
    total.set_xticklabels([r.name.split(" ")[0] for r in runs])
    total.set_title("total (query start to end)")
    speedup = runs[-1].total_seconds / runs[0].total_seconds if runs[0].total_seconds else float("inf")
    fig.suptitle(
        f"views and viewers per tweet: {views:,} zipf views of {tweets:,} tweets, Spark local; "
        f"{runs[0].name.split(' ')[0]} {speedup:.1f}x faster in total"
    )
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------ main


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--views", type=int, default=200_000, help="views generated in total")
    parser.add_argument("--tweets", type=int, default=10_000, help="distinct tweets (zipf-skewed)")
    parser.add_argument("--users", type=int, default=50_000, help="distinct users (uniform)")
    parser.add_argument("--batches", type=int, default=4, help="parquet files = micro-batches")
    parser.add_argument("--partitions", type=int, default=4, help="shuffle partitions = operator instances (own session only)")
    parser.add_argument(
        "--cache-entries", type=int, default=None,
        help=f"cached tweets per operator instance (default: what the operator declares, {spec_of(TWEET_STATS).state.max_entries:,})",
    )
    parser.add_argument(
        "--operator", choices=["aggregate", "function"], default="aggregate",
        help="opbuffer side: buffering.aggregate(...) or the decorated tweet_stats function",
    )
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "output", "tweet_stats"),
        help="working directory: input files, checkpoints, outputs, chart (replaced on every run)",
    )
    args = parser.parse_args(argv)
    for name in ("views", "tweets", "users", "batches", "partitions", "cache_entries"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.batches > args.views:
        parser.error("--batches must not exceed --views")
    return args


def main(argv: Optional[Sequence[str]] = None, spark: Any = None) -> dict[str, Any]:
    """Run the job; with ``spark`` given, use that session (and leave it running).

    Returns a summary: totals, per-batch seconds, the speedup, whether the view
    counts agree, and the chart's path (None without matplotlib).
    """
    args = parse_args(argv)
    out = os.path.abspath(args.out)
    shutil.rmtree(out, ignore_errors=True)
    input_dir = os.path.join(out, "input")
    frames = generate_views(input_dir, args.views, args.tweets, args.users, args.batches)
    expected = pd.concat(frames).groupby("tweet").size().sort_index()
    print(
        f"input: {args.views:,} views of {args.tweets:,} tweets by {args.users:,} users in {args.batches} parquet files "
        f"({input_dir}); the top tweet has {int(expected.max()):,} views, {len(expected):,} tweets were viewed",
        flush=True,
    )
    ship_by_value(__name__)
    own_session = spark is None
    if own_session:
        spark = local_spark("opbuffer-tweet-stats", args.partitions)
    try:
        parallelism = int(spark.conf.get("spark.sql.shuffle.partitions"))
        print(f"warm-up: Spark's JVM and Python workers started in {warm_up(spark):.1f} s (timed runs start warm)", flush=True)
        what = "aggregate({views: Count(), viewers: ApproxDistinct(user)})" if args.operator == "aggregate" else "the tweet_stats function"
        fn = opbuffer_operator(args.operator, args.cache_entries)
        cache = spec_of(fn).state  # what runs, not what an option or a comment says
        print(
            f"\nopbuffer: run_stream of {what}, combined before the shuffle, {cache.store} state behind a "
            f"{cache.max_entries:,}-entry cache per instance, {parallelism} instances, a checkpoint per batch; "
            "seconds per batch: the runner's own (batch in to commit)",
            flush=True,
        )
        fast = run_opbuffer(spark, input_dir, os.path.join(out, "opbuffer"), fn, args.operator, parallelism)
        print(f"  total {fast.total_seconds:.1f} s", flush=True)
        print(
            "\nplain: groupBy('tweet').applyInPandasWithState, one state update per row; "
            "seconds per batch: Spark's triggerExecution",
            flush=True,
        )
        plain = run_plain(spark, input_dir, os.path.join(out, "plain"))
        for b in sorted(plain.batch_seconds):
            rows = len(frames[b]) if b < len(frames) else 0
            seconds = plain.batch_seconds[b]
            print(f"  batch {b}: {rows:>9,} rows in {seconds:6.2f} s = {rows / seconds if seconds else 0:>10,.0f} rows/s", flush=True)
        print(f"  total {plain.total_seconds:.1f} s", flush=True)

        fast_stats, plain_stats = final_stats(spark, os.path.join(out, "opbuffer")), final_stats(spark, os.path.join(out, "plain"))
    finally:
        if own_session:
            spark.stop()

    agree = fast_stats["views"].equals(plain_stats["views"]) and fast_stats["views"].to_dict() == expected.to_dict()
    viewers_diff = (fast_stats["viewers"] - plain_stats["viewers"]).abs() / plain_stats["viewers"].clip(lower=1)
    speedup = plain.total_seconds / fast.total_seconds if fast.total_seconds else float("inf")
    chart = write_chart(os.path.join(out, "tweet_stats.png"), [fast, plain], args.views, args.tweets)

    print()
    if agree:
        print(f"check: final view counts agree for all {len(expected):,} tweets ({int(expected.sum()):,} views; "
              "both runs equal the generated data)")
    else:
        print("check: FINAL VIEW COUNTS DISAGREE between opbuffer, applyInPandasWithState and the generated data")
    print(f"check: approximate viewers differ by at most {viewers_diff.max():.2%} between the two HLL computations "
          "(a sketch merged from partials vs one updated row by row; HLL's standard error at lg_k=12 is about 1.6%)")
    print(f"speedup: {speedup:.1f}x  (applyInPandasWithState {plain.total_seconds:.1f} s / opbuffer {fast.total_seconds:.1f} s, "
          "each from query start to end)")
    print(f"chart: {chart}" if chart else "chart: skipped, matplotlib is not installed (pip install -e '.[demo]')")
    return {
        "agree": agree,
        "speedup": speedup,
        "opbuffer_seconds": fast.total_seconds,
        "plain_seconds": plain.total_seconds,
        "opbuffer_batches": fast.batch_seconds,
        "plain_batches": plain.batch_seconds,
        "batch_metrics": [m.to_dict() for m in fast.metrics],
        "max_viewers_difference": float(viewers_diff.max()) if len(viewers_diff) else 0.0,
        "chart": chart,
        "out": out,
    }


if __name__ == "__main__":
    sys.exit(0 if main()["agree"] else 1)
