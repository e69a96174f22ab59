"""Sessionization: a user's clicks form a session until the user has been idle for a gap; closed sessions are emitted.

The operator keeps each user's open session ``(start_ms, end_ms, clicks)`` as
state and sets a **processing-time timeout** (``state.setTimeoutDuration``)
on every call; when a user sends nothing for the gap, the runner calls it
with ``state.hasTimedOut`` and it emits the session and removes the state.
Timers are part of the checkpoint, so a restarted job still closes the
sessions that were open.

Run it on local Spark::

    python examples/sessionization.py

The stream is run three times with ``availableNow`` (the way a scheduled job
runs), sleeping longer than the gap in between, so the timeouts fire in the
later runs: users who kept clicking keep their session open; users who
stopped get their session closed. The operator's unit tests (LocalRunner with
a hand-moved clock, no Spark) are in ``examples/test_examples.py``.
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
from buffering.spark import ParquetSink, run_stream

from _spark import local_spark, ship_by_value

INPUT_SCHEMA = "user long, ts long"
OUTPUT_SCHEMA = "user long, start_ms long, end_ms long, clicks long"
#: Default idle gap that closes a session, in milliseconds of processing time.
SESSION_GAP_MS = 2_000


def sessionizer(gap_ms: int = SESSION_GAP_MS) -> Any:
    """The sessionization operator for an idle gap of ``gap_ms`` (processing time)."""

    @buffering.cached_state(max_entries=10_000)
    def sessionize(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        """Extend the user's open session with ``rows`` (clicks with a ``ts`` in epoch ms); emit it once it times out."""
        if state.hasTimedOut:
            start_ms, end_ms, clicks = state.get
            state.remove()
            yield pd.DataFrame({"user": [key[0]], "start_ms": [start_ms], "end_ms": [end_ms], "clicks": [clicks]})
            return
        start_ms, end_ms, clicks = state.get if state.exists else (None, None, 0)
        for pdf in rows:
            if not len(pdf):
                continue
            first, last = int(pdf["ts"].min()), int(pdf["ts"].max())
            start_ms = first if start_ms is None else min(start_ms, first)
            end_ms = last if end_ms is None else max(end_ms, last)
            clicks += len(pdf)
        state.update((start_ms, end_ms, clicks))
        state.setTimeoutDuration(gap_ms)  # closes the session after gap_ms without a click

    return sessionize


#: The operator with the default gap (what the tests use).
sessionize = sessionizer()


def clicks(users: Sequence[int], per_user: int, start_ms: int, seed: int) -> pd.DataFrame:
    """``per_user`` clicks of each of ``users``, 1 to 30 s apart, in time order."""
    rng = np.random.default_rng(seed)
    user = np.repeat(np.asarray(users, dtype=np.int64), per_user)
    ts = start_ms + np.cumsum(rng.integers(1_000, 30_000, size=(len(users), per_user)), axis=1).ravel()
    return pd.DataFrame({"user": user, "ts": ts.astype(np.int64)}).sort_values("ts", kind="stable").reset_index(drop=True)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--users", type=int, default=1_000, help="users clicking in the first run")
    parser.add_argument("--clicks", type=int, default=5, help="clicks per user per run")
    parser.add_argument("--gap-ms", type=int, default=SESSION_GAP_MS, help="idle gap (processing time) that closes a session")
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "output", "sessionization"),
        help="working directory (replaced on every run)",
    )
    args = parser.parse_args(argv)
    if args.users < 2 or args.clicks < 1 or args.gap_ms < 1:
        parser.error("need --users >= 2, --clicks >= 1, --gap-ms >= 1")
    return args


def main(argv: Optional[Sequence[str]] = None, spark: Any = None) -> dict[str, Any]:
    """Three availableNow runs over growing input, sleeping past the gap in between; with ``spark`` given, use it.

    Run 1: every user clicks (sessions open). Run 2, after the gap: only the
    first half clicks again, so the second half's sessions close. Run 3, after
    the gap: nobody clicks (an empty file), so the first half's sessions close.
    """
    args = parse_args(argv)
    out = os.path.abspath(args.out)
    shutil.rmtree(out, ignore_errors=True)
    input_dir = os.path.join(out, "input")
    os.makedirs(input_dir)
    users = list(range(args.users))
    returning = users[: args.users // 2]
    t0 = 1_767_225_600_000
    rounds = [
        clicks(users, args.clicks, t0, seed=1),
        clicks(returning, args.clicks, t0 + 3_600_000, seed=2),
        pd.DataFrame({"user": pd.Series([], dtype=np.int64), "ts": pd.Series([], dtype=np.int64)}),
    ]
    ship_by_value(__name__)
    own_session = spark is None
    if own_session:
        spark = local_spark("opbuffer-sessionization")
    sink = ParquetSink(os.path.join(out, "output"))
    fn = sessionizer(args.gap_ms)
    closed_per_run = []
    try:
        for run, frame in enumerate(rounds):
            if run:
                time.sleep(args.gap_ms / 1000 + 0.5)  # longer than the gap: idle users time out in this run
            frame.to_parquet(os.path.join(input_dir, f"clicks-{run:05d}.parquet"), index=False)
            stream = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).parquet(input_dir)
            query = run_stream(
                stream,
                fn,
                key="user",
                output_schema=OUTPUT_SCHEMA,
                checkpoint_location=os.path.join(out, "checkpoint"),
                sink=sink,
                timeout="processing",
                trigger={"availableNow": True},
                query_name="sessionization",
            )
            query.awaitTermination()
            closed = sum(m.rows_out for m in query.batch_metrics)
            timeouts = sum(m.timeouts for m in query.batch_metrics)
            closed_per_run.append(closed)
            print(f"run {run + 1}: {len(frame):,} clicks of {frame['user'].nunique():,} users -> "
                  f"{closed:,} sessions closed ({timeouts:,} timeouts)", flush=True)
        sessions = sink.read(spark).toPandas()
    finally:
        if own_session:
            spark.stop()
    per_user = sessions.groupby("user")["clicks"].sum()
    expected_clicks = pd.concat(rounds).groupby("user").size()
    correct = (
        closed_per_run == [0, len(users) - len(returning), len(returning)]
        and len(sessions) == len(users)
        and per_user.sort_index().to_dict() == expected_clicks.sort_index().to_dict()
    )
    print(f"{len(sessions):,} sessions, {int(sessions['clicks'].sum()):,} clicks; "
          + ("check: one session per user, every click in it" if correct else "check: SESSIONS ARE WRONG"))
    return {"closed_per_run": closed_per_run, "sessions": len(sessions), "correct": correct}


if __name__ == "__main__":
    sys.exit(0 if main()["correct"] else 1)
