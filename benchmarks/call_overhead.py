"""opbuffer's own cost per call of a decorated function, beyond the user's code.

Workload: the tweet-stats function of ``benchmarks.spark_e2e`` variant (b)
(count + a datasketches HLL in the state, updated row by row), decorated
``@mini_batch()`` + ``@cached_state(max_entries=..., store="rocksdb")``, over
``--views`` zipf-skewed views of ``--tweets`` tweets in ``--batches`` batches.

Measured in the same process, alternating, best of ``--repeat``:

* ``loop``: the undecorated function called once per key on frames grouped
  beforehand (untimed), with state in a plain dict behind a minimal state
  object (``exists``/``get``/``update``): what the user's own code costs.
* ``runner``: the decorated function through ``LocalRunner`` (RocksDB working
  store behind the cache, a checkpoint per batch, the runner's grouping of
  each batch by key, output frames concatenated): what a user runs.

``overhead per call = (runner - loop) / calls``: everything opbuffer adds
per key and batch (grouping rows by key, state reads and writes through the
cache, the GroupState object, output validation and concatenation, the
checkpoint). Target (issue 15): <= 10 us per call at 100k tweets.

    python -m benchmarks.call_overhead [--quick] [--views N] [--tweets N] [--batches N] [--repeat R] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from typing import Any

import pandas as pd

from buffering import LocalRunner

from ._common import check_target, now, print_table, write_record
from .spark_e2e import decorated_tweet_stats, generate_views, tweet_stats

NAME = "call_overhead"
TARGET_US_PER_CALL = 10.0


class DictState:
    """The part of GroupState the function uses, over a plain dict: the least a state can cost."""

    __slots__ = ("store", "key")

    def __init__(self, store: dict, key: Any) -> None:
        self.store = store
        self.key = key

    @property
    def exists(self) -> bool:
        return self.key in self.store

    @property
    def get(self) -> Any:
        return self.store[self.key]

    def update(self, value: Any) -> None:
        self.store[self.key] = value


def grouped(batches: list[pd.DataFrame]) -> list[list[tuple[tuple, pd.DataFrame]]]:
    """Each batch's rows per key, as the function receives them (done before any timing)."""
    out = []
    for frame in batches:
        out.append([((key,), rows.reset_index(drop=True)) for key, rows in frame.groupby("tweet", sort=False)])
    return out


def run_loop(groups: list[list[tuple[tuple, pd.DataFrame]]]) -> tuple[float, int]:
    store: dict = {}
    calls = 0
    start = now()
    for batch in groups:
        outputs = []
        for key, rows in batch:
            outputs.extend(tweet_stats(key, iter([rows]), DictState(store, key)))
            calls += 1
    return now() - start, calls


def run_runner(batches: list[pd.DataFrame], max_entries: int, root: str) -> tuple[float, int, int]:
    location = tempfile.mkdtemp(dir=root)
    runner = LocalRunner(decorated_tweet_stats(max_entries), key="tweet", checkpoint_location=location, clock=lambda: 0)
    try:
        start = now()
        rows_out = 0
        for frame in batches:
            rows_out += len(runner.process(frame))
        seconds = now() - start
        calls = sum(i["calls"] for i in runner.stats()["instances"])
    finally:
        runner.close()
        shutil.rmtree(location, ignore_errors=True)
    return seconds, rows_out, calls


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.call_overhead", description=__doc__.splitlines()[0])
    p.add_argument("--views", type=int, default=1_000_000)
    p.add_argument("--tweets", type=int, default=100_000)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--max-entries", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="200k views, 2 rounds")
    p.add_argument("--out", default=None, help="JSON record path (default benchmarks/results/call_overhead.json)")
    return p


def main(argv: Any = None) -> dict[str, Any]:
    args = make_parser().parse_args(argv)
    if args.quick:
        args.views, args.repeat = 200_000, 2
    views = generate_views(args.views, args.tweets, 25_000, seed=7)
    size = -(-len(views) // args.batches)
    batches = [views.iloc[i : i + size].reset_index(drop=True) for i in range(0, len(views), size)]
    groups = grouped(batches)
    root = tempfile.mkdtemp(prefix="opbuffer-call-overhead-")
    loops, runs = [], []
    try:
        for _ in range(args.repeat):
            loops.append(run_loop(groups))
            runs.append(run_runner(batches, args.max_entries, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    loop_s, loop_calls = min(loops)
    run_s, rows_out, run_calls = min(runs)
    if loop_calls != run_calls or rows_out != run_calls:
        raise SystemExit(f"call counts differ: loop {loop_calls}, runner {run_calls} calls and {rows_out} rows")
    overhead_us = (run_s - loop_s) / run_calls * 1e6
    print(f"{NAME}: {args.views:,} views, {args.tweets:,} tweets, {args.batches} batches, best of {args.repeat}, load {os.getloadavg()[0]:.2f}")
    print_table(
        ["variant", "seconds", "calls", "us per call"],
        [
            ["loop (user's code, dict state)", f"{loop_s:.2f}", f"{loop_calls:,}", f"{loop_s / loop_calls * 1e6:.1f}"],
            ["LocalRunner (decorated)", f"{run_s:.2f}", f"{run_calls:,}", f"{run_s / run_calls * 1e6:.1f}"],
        ],
    )
    print(f"  opbuffer's overhead per call: {overhead_us:.1f} us")
    target = check_target(f"overhead per call at {args.tweets:,} tweets", overhead_us, TARGET_US_PER_CALL, at_most=True, unit=" us")
    results = {
        "loop_seconds": [l[0] for l in loops],
        "runner_seconds": [r[0] for r in runs],
        "calls": run_calls,
        "overhead_us_per_call": overhead_us,
        "load": list(os.getloadavg()),
    }
    params = {"views": args.views, "tweets": args.tweets, "batches": args.batches, "repeat": args.repeat, "max_entries": args.max_entries}
    write_record(NAME, params=params, results=results, targets=[target], out=args.out)
    return results


if __name__ == "__main__":
    main()
