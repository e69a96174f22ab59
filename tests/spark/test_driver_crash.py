"""SIGKILL the whole driver (Python, JVM and workers) at random points; restarts on the same checkpoint converge.

Each trial kills the job's process group at a random moment, restarts it
until it completes, and compares the idempotent sink's output and the final
checkpointed state with Spark's own applyInPandasWithState on the same files.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

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


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def test_driver_killed_at_random_points_restarts_to_the_reference_result(spark, tmp_path):
    input_dir = write_batches(str(tmp_path / "in"), views(4, 600, 30, 200, seed=3))
    reference = reference_apply_in_pandas_with_state(
        spark, input_dir, SCHEMA, tweet_stats, ["tweet"], STATS_SCHEMA, "views long, hll binary", str(tmp_path / "ref")
    )
    expected = all_rows(reference, ["tweet"])
    rng = random.Random(20261121)
    kills = 0
    for trial in range(TRIALS):
        checkpoint, sink = str(tmp_path / f"ck{trial}"), str(tmp_path / f"sink{trial}")
        # The first run always dies; a restart dies again with probability 1/4.
        for attempt in range(4):
            process = _start(input_dir, checkpoint, sink)
            if attempt == 0 or (attempt < 3 and rng.random() < 0.25):
                deadline = time.monotonic() + rng.uniform(5.0, 20.0)
                while time.monotonic() < deadline and process.poll() is None:
                    time.sleep(0.1)
                if process.poll() is None:
                    _kill_group(process)
                    kills += 1
                    continue
            _, err = process.communicate(timeout=600)
            assert process.returncode == 0, err.decode()[-3000:]
            break
        written = spark.read.option("basePath", sink).parquet(f"{sink}/batch_id=*").toPandas()
        ours = all_rows([(int(b), g.drop(columns="batch_id")) for b, g in written.groupby("batch_id")], ["tweet"])
        pd.testing.assert_frame_equal(ours, expected, check_dtype=False)
        state = read_state(checkpoint).sort_values("tweet").reset_index(drop=True)
        assert [s[0] for s in state["state"]] == latest_per_key(reference, ["tweet"])["views"].tolist()
    assert kills >= TRIALS
