"""Backfill: run the streaming job's operator over historical parquet files as one batch job.

:func:`buffering.spark.run_batch` takes a batch DataFrame and the same
decorated function a stream runs (here ``tweet_stats`` from the main job):
rows are routed by key group as in the stream, sorted by key within each
partition, and the function is called once per tweet with all its rows
combined (``mini_batch(combine=...)``), state held for one key at a time. No
RocksDB, cache or checkpoint is needed for bounded input.

Run it on local Spark::

    python examples/backfill.py --views 100000 --tweets 5000 --files 4

It checks each tweet's view count against pandas over the same files.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import Any, Optional, Sequence

import pandas as pd

from buffering.spark import run_batch

from _spark import local_spark, ship_by_value
from tweet_stats import INPUT_SCHEMA, OUTPUT_SCHEMA, generate_views, tweet_stats


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--views", type=int, default=100_000, help="historical views generated")
    parser.add_argument("--tweets", type=int, default=5_000, help="distinct tweets (zipf-skewed)")
    parser.add_argument("--users", type=int, default=50_000, help="distinct users")
    parser.add_argument("--files", type=int, default=4, help="parquet files of history")
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "output", "backfill"),
        help="working directory (replaced on every run)",
    )
    args = parser.parse_args(argv)
    if min(args.views, args.tweets, args.users, args.files) < 1 or args.files > args.views:
        parser.error("sizes must be >= 1 and --files <= --views")
    return args


def main(argv: Optional[Sequence[str]] = None, spark: Any = None) -> dict[str, Any]:
    """Generate history, backfill per-tweet stats with run_batch, check them; with ``spark`` given, use that session."""
    args = parse_args(argv)
    out = os.path.abspath(args.out)
    shutil.rmtree(out, ignore_errors=True)
    history = os.path.join(out, "history")
    frames = generate_views(history, args.views, args.tweets, args.users, args.files)
    expected = pd.concat(frames).groupby("tweet").size()
    print(f"history: {args.views:,} views of {len(expected):,} tweets in {args.files} parquet files ({history})", flush=True)
    ship_by_value(__name__)
    ship_by_value("tweet_stats")  # the operator comes from the main job's module
    own_session = spark is None
    if own_session:
        spark = local_spark("opbuffer-backfill")
    try:
        started = time.perf_counter()
        views = spark.read.schema(INPUT_SCHEMA).parquet(history)
        stats = run_batch(views, tweet_stats, key="tweet", output_schema=OUTPUT_SCHEMA, progress=False)
        stats.write.mode("overwrite").parquet(os.path.join(out, "stats"))
        seconds = time.perf_counter() - started
        result = spark.read.parquet(os.path.join(out, "stats")).toPandas().set_index("tweet").sort_index()
    finally:
        if own_session:
            spark.stop()
    correct = len(result) == len(expected) and result["views"].to_dict() == expected.sort_index().to_dict()
    top = result.sort_values("views", ascending=False).head(3)
    print(f"run_batch: {args.views:,} views -> {len(result):,} tweets in {seconds:.1f} s "
          f"({args.views / seconds:,.0f} rows/s); top tweets:")
    print(top.to_string())
    print("check: every tweet's views equal a pandas count of the history" if correct else "check: VIEW COUNTS ARE WRONG")
    return {"tweets": len(result), "seconds": seconds, "correct": correct}


if __name__ == "__main__":
    sys.exit(0 if main()["correct"] else 1)
