"""Deduplication: emit each (user, event id) the first time it is seen, drop every later copy.

The state is the set of event ids each user has sent so far: with many users
that is large, so it lives in RocksDB behind a bounded write-back cache
(``cached_state(max_entries=..., store="rocksdb")``): active users stay in
memory as live Python sets, the others are read back with one multi-get per
flush. Every micro-batch commits a key-group checkpoint, so after a crash the
job resumes without emitting an id twice or losing one.

Run it on local Spark (generated input, a few seconds of work)::

    python examples/dedup.py --events 60000 --users 20000 --batches 3

The operator's unit tests (LocalRunner, no Spark) are in
``examples/test_examples.py``. Under the streaming runner::

    run_stream(events_df, first_seen, key="user", output_schema=OUTPUT_SCHEMA,
               checkpoint_location=..., sink=ParquetSink(...))
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import pandas as pd

import buffering
from buffering.spark import BatchMetrics, ParquetSink, run_stream

from _spark import local_spark, ship_by_value

INPUT_SCHEMA = "user long, event_id long, ts long"
OUTPUT_SCHEMA = "user long, event_id long, ts long"


@buffering.cached_state(max_entries=2_000, store="rocksdb")
def first_seen(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """The rows of ``rows`` whose ``event_id`` this user has not sent before (first copy only, arrival order).

    State: ``(seen,)``, the set of the user's event ids. It is a live Python set
    while cached; RocksDB holds it pickled.
    """
    (seen,) = state.get if state.exists else (set(),)
    fresh = []
    for pdf in rows:
        # Plain Python over the few rows of one user: a pandas call per key costs more than the loop.
        positions = []
        for i, event_id in enumerate(pdf["event_id"].tolist()):
            if event_id not in seen:  # not sent before, in this call or an earlier one
                seen.add(event_id)
                positions.append(i)
        if positions:
            fresh.append(pdf if len(positions) == len(pdf) else pdf.iloc[positions])
    if fresh:
        state.update((seen,))
        yield from fresh


def generate_events(directory: str, events: int, users: int, batches: int, duplicates: float = 0.3, seed: int = 7) -> list[pd.DataFrame]:
    """Write ``events`` events of ``users`` users as ``batches`` parquet files, ``duplicates`` of them re-sent copies.

    A copy repeats an earlier event (same user and id, a later ``ts``), often in a later file.
    """
    rng = np.random.default_rng(seed)
    originals = events - int(events * duplicates)
    user = rng.integers(0, users, size=originals).astype(np.int64)
    event_id = rng.permutation(originals).astype(np.int64) + 1_000_000  # unique per event
    # each copy repeats one of the first 90% of the originals, placed after it
    source = rng.integers(0, max(1, int(originals * 0.9)), size=events - originals)
    order = np.concatenate([np.arange(originals), source + rng.integers(1, max(2, events // 3), size=len(source))])
    user = np.concatenate([user, user[source]])
    event_id = np.concatenate([event_id, event_id[source]])
    position = np.argsort(order, kind="stable")
    frame = pd.DataFrame({"user": user[position], "event_id": event_id[position]})
    frame["ts"] = 1_767_225_600_000 + np.arange(len(frame), dtype=np.int64) * 5
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    bounds = np.linspace(0, len(frame), batches + 1).astype(np.int64).tolist()
    frames = [frame.iloc[lo:hi].reset_index(drop=True) for lo, hi in zip(bounds, bounds[1:])]
    for b, part in enumerate(frames):
        part.to_parquet(os.path.join(directory, f"events-{b:05d}.parquet"), index=False)
    return frames


def _print_batch(m: BatchMetrics) -> None:
    print(
        f"  batch {m.batch_id}: {m.rows_in:>8,} events in, {m.rows_out:>8,} first-seen out, {m.seconds:5.2f} s, "
        f"cache hit ratio {m.cache_hit_ratio:.3f} ({m.cache_evictions:,} evictions), checkpoint {m.checkpoint_bytes / 1e6:.2f} MB",
        flush=True,
    )


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--events", type=int, default=60_000, help="events generated (copies included)")
    parser.add_argument("--users", type=int, default=20_000, help="distinct users (= keys)")
    parser.add_argument("--batches", type=int, default=3, help="parquet files = micro-batches")
    parser.add_argument("--duplicates", type=float, default=0.3, help="fraction of events that are re-sent copies")
    parser.add_argument("--cache-entries", type=int, default=2_000, help="cached users per operator instance")
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "output", "dedup"),
        help="working directory (replaced on every run)",
    )
    args = parser.parse_args(argv)
    if min(args.events, args.users, args.batches, args.cache_entries) < 1 or not 0 <= args.duplicates < 1:
        parser.error("sizes must be >= 1 and --duplicates in [0, 1)")
    return args


def main(argv: Optional[Sequence[str]] = None, spark: Any = None) -> dict[str, Any]:
    """Generate events, deduplicate them with run_stream, check the output; with ``spark`` given, use that session."""
    args = parse_args(argv)
    out = os.path.abspath(args.out)
    shutil.rmtree(out, ignore_errors=True)
    input_dir = os.path.join(out, "input")
    frames = generate_events(input_dir, args.events, args.users, args.batches, args.duplicates)
    data = pd.concat(frames, ignore_index=True)
    distinct = data.drop_duplicates(["user", "event_id"])
    print(f"input: {len(data):,} events ({len(data) - len(distinct):,} re-sent copies) of {data['user'].nunique():,} users "
          f"in {args.batches} files", flush=True)
    ship_by_value(__name__)
    own_session = spark is None
    if own_session:
        spark = local_spark("opbuffer-dedup")
    sink = ParquetSink(os.path.join(out, "output"))
    try:
        fn = buffering.cached_state(max_entries=args.cache_entries, store="rocksdb")(first_seen)
        stream = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).parquet(input_dir)
        print(f"run_stream: state in RocksDB behind a {args.cache_entries:,}-entry cache per instance", flush=True)
        started = time.perf_counter()
        query = run_stream(
            stream,
            fn,
            key="user",
            output_schema=OUTPUT_SCHEMA,
            checkpoint_location=os.path.join(out, "checkpoint"),
            sink=sink,
            trigger={"availableNow": True},
            query_name="dedup",
            on_batch=_print_batch,
        )
        query.awaitTermination()
        seconds = time.perf_counter() - started
        emitted = sink.read(spark).drop("batch_id").toPandas()
    finally:
        if own_session:
            spark.stop()
    # exactly the first copy of every (user, event_id): same pairs, first ts, nothing twice
    expected = distinct.sort_values(["user", "event_id"]).reset_index(drop=True)
    got = emitted.sort_values(["user", "event_id"]).reset_index(drop=True)[["user", "event_id", "ts"]]
    correct = got.equals(expected.astype(got.dtypes.to_dict()))
    print(f"emitted {len(got):,} first-seen events of {len(data):,} in {seconds:.1f} s; "
          + ("check: exactly one row per distinct (user, event_id), the first copy" if correct else "check: OUTPUT IS WRONG"))
    return {"events": len(data), "emitted": len(got), "distinct": len(expected), "correct": correct,
            "seconds": seconds, "batch_metrics": [m.to_dict() for m in query.batch_metrics]}


if __name__ == "__main__":
    sys.exit(0 if main()["correct"] else 1)
