"""The state layouts of an ``aggregate()``, where each wins: ``layout="key"``, ``"key_group"`` and ``"auto"``.

One LocalRunner (one instance, a checkpoint every batch, RocksDB working store)
runs the tweet-stats aggregate of ``benchmarks.spark_e2e`` (count and
approximate distinct viewers per tweet) with each layout, in the same process,
alternating, best of ``--repeat``, in two regimes:

fits      ``--views`` zipf views of ``--tweets`` tweets in ``--batches`` batches,
          ``cached_state(max_entries=--fits-entries)``: the cache holds the
          state and most keys change every batch (where key-group blocks win).
small     ``--small-views`` zipf views of ``--small-tweets`` tweets (a few keys per
          key group) in ``--batches`` batches, ``max_entries=--fits-entries``:
          where a block's fixed costs (a few numpy calls per key group in
          every merge, write-back and checkpoint) outweigh its keys' work;
          ``--small-rounds`` rounds (it takes milliseconds a batch).
outgrows  ``--outgrow-batches`` batches of ``--outgrow-rows`` views of tweets
          uniform over ``--outgrow-tweets``, ``max_entries=--outgrow-entries``:
          the state grows to many times the bound and every batch changes a
          few keys of every key group (where blocks lose: each batch loads and
          writes back whole key groups for a few keys each).

``"auto"`` (the default) starts with blocks and switches an instance to
per-key records at the end of the first batch in which its cache evicted a
key group. The table gives each layout's seconds and ``auto`` over the faster
of the two others: what choosing by default costs against choosing right by
hand. All three layouts' outputs are checked equal.

Usage::

    python -m benchmarks.layouts [--quick] [--repeat N] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np
import pandas as pd

from benchmarks._common import log, print_table, write_record
from benchmarks.spark_e2e import aggregate_tweet_stats, generate_views
from buffering.local import LocalRunner

NAME = "layouts"
LAYOUTS = ("key", "key_group", "auto")


def run(layout: str, batches: list[pd.DataFrame], max_entries: int, root: str) -> tuple[float, pd.DataFrame, list[str]]:
    """Seconds to process ``batches`` (a checkpoint each) and close; the outputs; the layout after each batch."""
    location = tempfile.mkdtemp(dir=root)
    op = aggregate_tweet_stats(max_entries, layout)
    started = time.perf_counter()
    runner = LocalRunner(op, "tweet", checkpoint_location=os.path.join(location, "ck"))
    outputs, layouts = [], []
    for batch in batches:
        outputs.append(runner.process(batch))
        layouts.append(runner.instances[0].layout)
    runner.close()
    seconds = time.perf_counter() - started
    shutil.rmtree(location, ignore_errors=True)
    frame = pd.concat([o.assign(batch=i) for i, o in enumerate(outputs)], ignore_index=True)
    return seconds, frame.sort_values(["batch", "tweet"], ignore_index=True), layouts


def split(frame: pd.DataFrame, parts: int) -> list[pd.DataFrame]:
    cuts = np.linspace(0, len(frame), parts + 1).astype(int)
    return [frame.iloc[a:b].reset_index(drop=True) for a, b in zip(cuts[:-1], cuts[1:])]


def regimes(args: argparse.Namespace) -> dict[str, tuple[list[pd.DataFrame], int, int]]:
    """Per regime: its batches, its max_entries and its rounds."""
    views = generate_views(args.views, args.tweets, 50_000, seed=args.seed)
    fits = split(views, args.batches)
    rng = np.random.default_rng([args.seed, args.outgrow_tweets])
    n = args.outgrow_rows * args.outgrow_batches
    uniform = pd.DataFrame({
        "view": np.arange(n, dtype=np.int64),
        "user": rng.integers(0, 50_000, n, dtype=np.int64),
        "tweet": rng.integers(0, args.outgrow_tweets, n, dtype=np.int64),
    })
    outgrows = split(uniform, args.outgrow_batches)
    small = split(generate_views(args.small_views, args.small_tweets, 50_000, seed=args.seed), args.batches)
    return {
        "fits": (fits, args.fits_entries, args.repeat),
        "small": (small, args.fits_entries, args.small_rounds),
        "outgrows": (outgrows, args.outgrow_entries, args.repeat),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--views", type=int, default=2_000_000, help="fits: zipf views (default 2,000,000)")
    p.add_argument("--tweets", type=int, default=100_000, help="fits: tweets (default 100,000)")
    p.add_argument("--batches", type=int, default=4, help="fits: micro-batches (default 4)")
    p.add_argument("--fits-entries", type=int, default=200_000, help="fits: max_entries (default 200,000)")
    p.add_argument("--small-views", type=int, default=20_000, help="small: zipf views (default 20,000)")
    p.add_argument("--small-tweets", type=int, default=1_000, help="small: tweets (default 1,000)")
    p.add_argument("--small-rounds", type=int, default=10, help="small: rounds, best of (default 10)")
    p.add_argument("--outgrow-tweets", type=int, default=1_000_000, help="outgrows: tweets (default 1,000,000)")
    p.add_argument("--outgrow-rows", type=int, default=10_000, help="outgrows: views a batch (default 10,000)")
    p.add_argument("--outgrow-batches", type=int, default=40, help="outgrows: micro-batches (default 40)")
    p.add_argument("--outgrow-entries", type=int, default=20_000, help="outgrows: max_entries (default 20,000)")
    p.add_argument("--repeat", type=int, default=2, help="rounds, best of (default 2)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run of a few seconds)")
    p.add_argument("--out", default=None, help="path of the JSON record (default benchmarks/results/layouts.json)")
    return p


def main(argv: Any = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    if args.quick:
        args.views, args.tweets, args.fits_entries, args.repeat, args.small_rounds = 200_000, 10_000, 20_000, 1, 2
        args.outgrow_tweets, args.outgrow_rows, args.outgrow_batches, args.outgrow_entries = 100_000, 2_000, 10, 2_000
    for name in ("views", "tweets", "batches", "fits_entries", "outgrow_tweets", "outgrow_rows", "outgrow_batches",
                 "outgrow_entries", "repeat", "small_views", "small_tweets", "small_rounds"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    started = time.perf_counter()
    results: dict[str, Any] = {}
    rows = []
    root = tempfile.mkdtemp(prefix="opbuffer-layouts-")
    try:
        for regime, (batches, max_entries, rounds) in regimes(args).items():
            best: dict[str, float] = {}
            switched: dict[str, list[str]] = {}
            outputs: dict[str, pd.DataFrame] = {}
            for round_ in range(rounds):
                for layout in LAYOUTS if round_ % 2 == 0 else LAYOUTS[::-1]:
                    seconds, frame, layouts = run(layout, batches, max_entries, root)
                    log(f"{regime} round {round_ + 1} {layout}: {seconds:.2f} s (load {os.getloadavg()[0]:.1f})")
                    best[layout] = min(best.get(layout, float("inf")), seconds)
                    outputs[layout], switched[layout] = frame, layouts
            equal = all(outputs[layout].equals(outputs["key"]) for layout in LAYOUTS)
            if not equal:
                raise SystemExit(f"{regime}: the layouts' outputs differ")
            faster = min(best["key"], best["key_group"])
            auto_layouts = switched["auto"]
            switch_batch = next((i for i, layout in enumerate(auto_layouts) if layout == "key"), None)
            results[regime] = {
                "seconds": best,
                "auto_over_faster": best["auto"] / faster,
                "key_group_over_key": best["key_group"] / best["key"],
                "auto_switched_after_batch": switch_batch,
                "rows": int(sum(len(b) for b in batches)),
                "batches": len(batches),
                "max_entries": max_entries,
                "rounds": rounds,
                "outputs_equal": equal,
            }
            rows.append([
                regime, f"{len(batches)} x {len(batches[0]):,}", f"{max_entries:,}",
                f"{best['key']:.2f}", f"{best['key_group']:.2f}", f"{best['auto']:.2f}",
                f"{best['key_group'] / best['key']:.2f}x", f"{best['auto'] / faster:.2f}x",
                "never" if switch_batch is None else f"after batch {switch_batch + 1}",
            ])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{NAME}: best of {args.repeat} (small: {args.small_rounds}), load {os.getloadavg()[0]:.2f}; outputs of the three layouts equal")
    print_table(
        ["regime", "batches x rows", "max_entries", "key s", "key_group s", "auto s", "key_group / key",
         "auto / faster", "auto per key"],
        rows,
    )
    write_record(NAME, params=vars(args), results=results, out=args.out, started=started)
    return results


if __name__ == "__main__":
    main()
