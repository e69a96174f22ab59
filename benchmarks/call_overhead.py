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

* ``floor``: a near-empty function through the same ``LocalRunner``: it
  counts its rows, keeps the count in its state and yields one prebuilt
  one-row frame. Its own time per call (``floor - inside``) is what this
  design's machinery costs per call when the user's function does nothing
  (the key's frame, the state read and write-back through the cache, the
  GroupState, the output checks and joining, the checkpoint): the ceiling
  of the target, measured in the same run.
* ``slices``: each key's rows cut out of its batch with ``DataFrame.iloc``
  (the batch sorted by key beforehand, untimed), nothing else: what handing a
  function one pandas frame per key costs at the least, in any runner. A
  target below it cannot be met by a decorated function's runner.
* ``harness``: what a user writes by hand instead, with public pandas only: each
  batch's ``groupby("tweet", sort=False)`` iterated, the function called per
  key with the dict state, its output frames joined with ``pd.concat`` at the
  end of the batch (no cache, no store, no checkpoint: less than the runner
  does). The time of the concatenation is measured apart.

``overhead per call = (runner - loop) / calls``: everything opbuffer adds
per key and batch (grouping rows by key, state reads and writes through the
cache, the GroupState object, output validation and concatenation, the
checkpoint). Target (issue 15): <= 10 us per call at 100k tweets. Beside
it, the harness's own time per call (``harness - inside``, the same run) is
what grouping and joining per-key frames costs with pandas alone; its
``(harness - loop) / calls`` also holds the function's own slowdown on
groupby's frames (they keep the batch's index).

Both variants call the function through the same timing wrapper, so each
run also measures the time spent inside it: ``runner - inside`` is a second,
direct measure of opbuffer's own time (it charges the wrapper's 0.3 us to
opbuffer), far less sensitive to other load on the machine than a
difference of two runs. Before each timed run the harness's own data
(the views, the batches, the pre-grouped frames) is frozen out of the
garbage collector (``gc.freeze``), and the loop clears each pre-grouped
frame's column cache after its call: full collections walking the 170k
pre-grouped frames and the Series cached in them cost the loop seconds,
which made the baseline swing 17-31 s and the difference meaningless (the
clearing costs the loop 0.1 us a call). The loop counts its output rows
instead of holding its output frames (which the runner joins as it goes).

    python -m benchmarks.call_overhead [--quick] [--views N] [--tweets N] [--batches N] [--repeat R] [--out PATH]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
from typing import Any

import numpy as np
import pandas as pd

import buffering
from buffering import LocalRunner

from ._common import check_target, now, print_table, write_record
from .spark_e2e import generate_views, tweet_stats

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


class Inside:
    """The function wrapped to add up the seconds spent inside it (the same wrapper for every variant)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self, key: tuple, rows: Any, state: Any) -> Any:
        start = now()
        frames = list(tweet_stats(key, rows, state))
        self.seconds += now() - start
        return iter(frames)


class NearEmpty(Inside):
    """The floor's function: its rows counted, the count kept in its state, one prebuilt row yielded."""

    def __init__(self) -> None:
        super().__init__()
        self.row = pd.DataFrame({"tweet": [0], "views": [0], "viewers": [0]})

    def __call__(self, key: tuple, rows: Any, state: Any) -> Any:
        start = now()
        views = sum(len(frame) for frame in rows)
        state.update((state.get[0] + views if state.exists else views,))
        self.seconds += now() - start
        return iter((self.row,))


def _frozen() -> None:
    """Everything alive now (the harness's inputs) out of the collector's way; the run's own objects stay in."""
    gc.collect()
    gc.freeze()


def _no_cache(frame: pd.DataFrame) -> None:
    pass


def run_loop(groups: list[list[tuple[tuple, pd.DataFrame]]]) -> tuple[float, float, int]:
    """Seconds, seconds inside the function, calls."""
    clear_cache = getattr(pd.DataFrame, "_clear_item_cache", _no_cache)  # pandas < 3 caches columns per frame
    store: dict = {}
    calls = 0
    fn = Inside()
    _frozen()
    try:
        start = now()
        for batch in groups:
            rows_out = 0
            for key, rows in batch:
                for frame in fn(key, iter([rows]), DictState(store, key)):
                    rows_out += len(frame)
                calls += 1
                # The frame's column cache (``rows["user"]`` keeps a Series in it) would grow the pre-grouped
                # frames by 170k live Series, and the full collections walking them cost the loop seconds.
                clear_cache(rows)
        seconds = now() - start
    finally:
        gc.unfreeze()
    return seconds, fn.seconds, calls


def run_slices(batches: list[pd.DataFrame]) -> tuple[float, int]:
    """Seconds and calls of cutting each key's frame out of its batch with ``iloc`` (the batch sorted by key
    beforehand, untimed): the least any runner that hands a function one pandas frame per key pays per call."""
    cuts = []
    for frame in batches:
        ordered = frame.sort_values("tweet", kind="stable").reset_index(drop=True)
        starts = np.flatnonzero(np.diff(ordered["tweet"].to_numpy())) + 1
        cuts.append((ordered, [0, *starts.tolist()], [*starts.tolist(), len(ordered)]))
    calls = 0
    _frozen()
    try:
        start = now()
        for ordered, firsts, ends in cuts:
            iloc = ordered.iloc
            for a, b in zip(firsts, ends):
                iloc[a:b]
            calls += len(firsts)
        seconds = now() - start
    finally:
        gc.unfreeze()
    return seconds, calls


def run_runner(batches: list[pd.DataFrame], max_entries: int, root: str, fn: Inside) -> tuple[float, float, int, int]:
    """Seconds, seconds inside the function, output rows, calls."""
    location = tempfile.mkdtemp(dir=root)
    decorated = buffering.mini_batch()(buffering.cached_state(max_entries=max_entries, store="rocksdb")(fn))
    runner = LocalRunner(decorated, key="tweet", checkpoint_location=location, clock=lambda: 0)
    _frozen()
    try:
        start = now()
        rows_out = 0
        for frame in batches:
            rows_out += len(runner.process(frame))
        seconds = now() - start
        calls = sum(i["calls"] for i in runner.stats()["instances"])
    finally:
        gc.unfreeze()
        runner.close()
        shutil.rmtree(location, ignore_errors=True)
    return seconds, fn.seconds, rows_out, calls


def run_harness(batches: list[pd.DataFrame]) -> tuple[float, float, int, int, float]:
    """Seconds, seconds inside the function, output rows, calls, seconds in ``pd.concat``."""
    store: dict = {}
    calls = rows_out = 0
    joining = 0.0
    fn = Inside()
    _frozen()
    try:
        start = now()
        for frame in batches:
            outputs = []
            for key, rows in frame.groupby("tweet", sort=False):
                nkey = (key,)
                outputs.extend(fn(nkey, iter([rows]), DictState(store, nkey)))
                calls += 1
            joined = now()
            rows_out += len(pd.concat(outputs, ignore_index=True))
            joining += now() - joined
        seconds = now() - start
    finally:
        gc.unfreeze()
    return seconds, fn.seconds, rows_out, calls, joining


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
    loops, runs, floors, harnesses, slices = [], [], [], [], []
    try:
        for _ in range(args.repeat):
            loops.append(run_loop(groups))
            slices.append(run_slices(batches))
            runs.append(run_runner(batches, args.max_entries, root, Inside()))
            floors.append(run_runner(batches, args.max_entries, root, NearEmpty()))
            harnesses.append(run_harness(batches))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    loop_s, loop_inside, loop_calls = min(loops)
    run_s, run_inside, rows_out, run_calls = min(runs)
    floor_s, floor_inside, floor_rows, floor_calls = min(floors)
    harness_s, harness_inside, harness_rows, harness_calls, harness_join = min(harnesses)
    slice_s, slice_calls = min(slices)
    if len({loop_calls, run_calls, rows_out, floor_calls, floor_rows, harness_calls, harness_rows, slice_calls}) != 1:
        raise SystemExit(
            f"call counts differ: loop {loop_calls}, runner {run_calls} calls and {rows_out} rows, "
            f"floor {floor_calls} calls and {floor_rows} rows, harness {harness_calls} calls and {harness_rows} rows, "
            f"slices {slice_calls}"
        )
    overhead_us = (run_s - loop_s) / run_calls * 1e6
    harness_us = (harness_s - loop_s) / run_calls * 1e6
    outside = [(r[0] - r[1]) / run_calls * 1e6 for r in runs]
    floor_outside = [(r[0] - r[1]) / floor_calls * 1e6 for r in floors]
    print(f"{NAME}: {args.views:,} views, {args.tweets:,} tweets, {args.batches} batches, best of {args.repeat}, load {os.getloadavg()[0]:.2f}")
    print_table(
        ["variant", "seconds", "inside the function", "calls", "us per call"],
        [
            ["loop (user's code, dict state)", f"{loop_s:.2f}", f"{loop_inside:.2f}", f"{loop_calls:,}", f"{loop_s / loop_calls * 1e6:.1f}"],
            ["LocalRunner (decorated)", f"{run_s:.2f}", f"{run_inside:.2f}", f"{run_calls:,}", f"{run_s / run_calls * 1e6:.1f}"],
            ["floor: a near-empty function through LocalRunner", f"{floor_s:.2f}", f"{floor_inside:.2f}",
             f"{floor_calls:,}", f"{floor_s / floor_calls * 1e6:.1f}"],
            ["harness (groupby + pd.concat)", f"{harness_s:.2f}", f"{harness_inside:.2f}", f"{harness_calls:,}",
             f"{harness_s / harness_calls * 1e6:.1f}"],
        ],
    )
    print(f"  opbuffer's overhead per call: {overhead_us:.1f} us (runner - loop)")
    print(f"  opbuffer's own time per call, measured inside the runs: {min(outside):.1f} us (rounds: "
          + ", ".join(f"{v:.1f}" for v in outside) + ")")
    print(f"  the pandas harness's overhead per call: {harness_us:.1f} us (harness - loop), of which pd.concat "
          f"{harness_join / run_calls * 1e6:.1f} us; its own time {(harness_s - harness_inside) / run_calls * 1e6:.1f} us")
    print(f"  the floor's own time per call: {min(floor_outside):.1f} us (rounds: "
          + ", ".join(f"{v:.1f}" for v in floor_outside) + ")")
    print(f"ceiling: opbuffer's own time per call with a near-empty function = {min(floor_outside):.1f} us "
          f"(no decorated function through this design costs less per call; target {TARGET_US_PER_CALL:g} us)")
    slice_us = slice_s / slice_calls * 1e6
    print(f"ceiling: cutting one pandas frame per key out of the key-sorted batch (iloc, the sort not counted) = "
          f"{slice_us:.1f} us per call (no runner that hands each key a pandas frame costs less; target "
          f"{TARGET_US_PER_CALL:g} us)")
    target = check_target(f"overhead per call at {args.tweets:,} tweets", overhead_us, TARGET_US_PER_CALL, at_most=True, unit=" us")
    results = {
        "loop_seconds": [l[0] for l in loops],
        "loop_inside_seconds": [l[1] for l in loops],
        "runner_seconds": [r[0] for r in runs],
        "runner_inside_seconds": [r[1] for r in runs],
        "calls": run_calls,
        "overhead_us_per_call": overhead_us,
        "outside_us_per_call": outside,
        "floor_seconds": [r[0] for r in floors],
        "floor_inside_seconds": [r[1] for r in floors],
        "floor_outside_us_per_call": floor_outside,
        "harness_seconds": [h[0] for h in harnesses],
        "harness_inside_seconds": [h[1] for h in harnesses],
        "harness_concat_seconds": [h[4] for h in harnesses],
        "harness_overhead_us_per_call": harness_us,
        "slice_seconds": [x[0] for x in slices],
        "slice_us_per_call": slice_us,
        "load": list(os.getloadavg()),
    }
    params = {"views": args.views, "tweets": args.tweets, "batches": args.batches, "repeat": args.repeat, "max_entries": args.max_entries}
    write_record(NAME, params=params, results=results, targets=[target], out=args.out)
    return results


if __name__ == "__main__":
    main()
