"""SIGKILL the whole driver (Python, JVM and workers) at random points; restarts on the same checkpoint converge.

Each trial kills the job's process group at a random moment, restarts it
until it completes, and compares the idempotent sink's output and the final
checkpointed state with Spark's own applyInPandasWithState on the same files.

A kill can change which files make a micro-batch: Spark's file source logs
the files of its next batch before the offsets log records the batch, so a
restart in between puts that file and the next one in one batch (its batch
ids then number one fewer). The expected output follows the batches Spark
actually ran, read from its offsets and source logs; the final state does not
depend on them.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pandas as pd
import pytest

from buffering.spark.standalone import kill_process_group
from checkpoint import read_state

from .helpers import all_rows, latest_per_key, reference_apply_in_pandas_with_state, views, write_batches
from .test_run_stream import SCHEMA, STATS_SCHEMA, tweet_stats

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TRIALS = 5
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _start(input_dir: str, checkpoint: str, sink: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.crash_job", input_dir, checkpoint, sink],
        cwd=ROOT,
        start_new_session=True,  # its own process group: the kill takes the JVM and workers too
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


class _State:
    """The part of GroupState that tweet_stats uses, over a dict entry."""

    def __init__(self, store: dict, key: tuple) -> None:
        self.store, self.key = store, key

    @property
    def exists(self) -> bool:
        return self.key in self.store

    @property
    def get(self) -> tuple:
        return self.store[self.key]

    def update(self, value: tuple) -> None:
        self.store[self.key] = value


def _killed_within(process: subprocess.Popen, seconds: float) -> bool:
    """SIGKILL the job's process group after ``seconds`` unless it finished first; whether it was killed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    if process.poll() is not None:
        process.communicate()
        return False
    kill_process_group(process)
    return True


def _finish(process: subprocess.Popen) -> None:
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err.decode()[-3000:]


def _batches_spark_ran(spark_checkpoint: str) -> list[list[str]]:
    """The input files of each micro-batch, from Spark's offsets log and its file source's log."""
    def lines(path: str) -> list[str]:
        with open(path) as f:
            return f.read().splitlines()

    offsets = os.path.join(spark_checkpoint, "offsets")
    ends = [json.loads(lines(os.path.join(offsets, name))[2])["logOffset"] for name in sorted(os.listdir(offsets), key=lambda n: int(n) if n.isdigit() else -1) if name.isdigit()]
    files: dict[int, list[str]] = {}
    log = os.path.join(spark_checkpoint, "sources", "0")
    for name in os.listdir(log):
        if name.isdigit():
            files[int(name)] = [json.loads(line)["path"].removeprefix("file://").removeprefix("file:") for line in lines(os.path.join(log, name))[1:]]
    batches, start = [], -1
    for end in ends:
        batches.append([path for entry in range(start + 1, end + 1) for path in files[entry]])
        start = end
    return batches


def _expected(batches: list[list[str]]) -> list[tuple[int, pd.DataFrame]]:
    """tweet_stats called as Spark calls it: once per key and batch, with all the key's rows of the batch."""
    store: dict = {}
    out = []
    for batch_id, paths in enumerate(batches):
        rows = pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)
        frames = [f for tweet, group in rows.groupby("tweet", sort=True) for f in tweet_stats((tweet,), [group], _State(store, (tweet,)))]
        out.append((batch_id, pd.concat(frames, ignore_index=True)))
    return out


def test_the_expected_output_follows_the_batches_spark_ran(spark, tmp_path):
    frames = views(4, 600, 30, 200, seed=3)
    input_dir = write_batches(str(tmp_path / "in"), frames[:2])
    checkpoint, sink = str(tmp_path / "ck"), str(tmp_path / "sink")
    assert subprocess.run([sys.executable, "-m", "tests.spark.crash_job", input_dir, checkpoint, sink], cwd=ROOT).returncode == 0
    # The crash window: the file source logged batch 1's file, the offsets log had not recorded batch 1.
    for log in ("offsets", "commits"):
        for name in ("1", ".1.crc"):
            os.remove(os.path.join(checkpoint, "_spark", log, name))
    write_batches(input_dir, frames)
    assert subprocess.run([sys.executable, "-m", "tests.spark.crash_job", input_dir, checkpoint, sink], cwd=ROOT).returncode == 0
    batches = _batches_spark_ran(os.path.join(checkpoint, "_spark"))
    assert [len(files) for files in batches] == [1, 2, 1]
    written = spark.read.option("basePath", sink).parquet(f"{sink}/batch_id=*").toPandas()
    ours = all_rows([(int(b), g.drop(columns="batch_id")) for b, g in written.groupby("batch_id")], ["tweet"])
    pd.testing.assert_frame_equal(ours, all_rows(_expected(batches), ["tweet"]), check_dtype=False)


def test_driver_killed_at_random_points_restarts_to_the_reference_result(spark, tmp_path):
    input_dir = write_batches(str(tmp_path / "in"), views(4, 600, 30, 200, seed=3))
    reference = reference_apply_in_pandas_with_state(
        spark, input_dir, SCHEMA, tweet_stats, ["tweet"], STATS_SCHEMA, "views long, hll binary", str(tmp_path / "ref")
    )
    expected = all_rows(reference, ["tweet"])
    rng = random.Random(20261121)
    # Kill points are drawn over the job's own length on this machine: a fixed window would
    # let a fast run finish before its kill, and then the trial tests nothing.
    started = time.monotonic()
    _finish(_start(input_dir, str(tmp_path / "timed-ck"), str(tmp_path / "timed-sink")))
    window = 0.9 * (time.monotonic() - started)
    kills = 0
    for trial in range(TRIALS):
        # The first run always dies (a run that finished before its kill is dropped and the
        # trial starts again with a kill drawn from the first half of the window).
        for fresh in range(4):
            checkpoint, sink = str(tmp_path / f"ck{trial}-{fresh}"), str(tmp_path / f"sink{trial}-{fresh}")
            if _killed_within(_start(input_dir, checkpoint, sink), rng.uniform(1.0, window / 2**fresh)):
                break
        else:
            pytest.fail(f"the job finished before each of 4 kills drawn within {window:.1f} s")
        kills += 1
        # Each restart dies again with probability 1/4, at most twice.
        for attempt in range(3):
            process = _start(input_dir, checkpoint, sink)
            if attempt < 2 and rng.random() < 0.25 and _killed_within(process, rng.uniform(1.0, window)):
                kills += 1
                continue
            _finish(process)
            break
        written = spark.read.option("basePath", sink).parquet(f"{sink}/batch_id=*").toPandas()
        ours = all_rows([(int(b), g.drop(columns="batch_id")) for b, g in written.groupby("batch_id")], ["tweet"])
        batches = _batches_spark_ran(os.path.join(checkpoint, "_spark"))
        if [len(files) for files in batches] == [1, 1, 1, 1]:
            pd.testing.assert_frame_equal(ours, expected, check_dtype=False)
        else:  # a kill merged two files into one batch: Spark's own run would have done the same
            pd.testing.assert_frame_equal(ours, all_rows(_expected(batches), ["tweet"]), check_dtype=False)
        state = read_state(checkpoint).sort_values("tweet").reset_index(drop=True)
        assert [s[0] for s in state["state"]] == latest_per_key(reference, ["tweet"])["views"].tolist()
