"""run_stream on a real standalone cluster (a master and workers started here, one temp dir each).

Each test runs ``python -m benchmarks.cluster`` in a subprocess (the test
process already holds a local SparkContext), which starts and stops its own
cluster, and reads back its JSON record: how every instance started in every
batch, and whether the output equals a pandas count of the input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(tmp_path, *args: str) -> dict:
    out = tmp_path / "cluster.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.cluster", "--quick", "--placements", "executor", "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = json.loads(out.read_text())["results"]["runs"]
    return run


def _starts_after_first(run: dict) -> list[str]:
    return [s for batch in run["batches"][1:] for s in batch["starts"]]


@pytest.mark.parametrize("layout", ["2x4", "3x6"])
def test_instances_stay_on_their_executor_after_the_first_batch(tmp_path, layout):
    run = _run(tmp_path, "--layouts", layout)
    assert run["exact"]
    starts = _starts_after_first(run)
    workers, parallelism = map(int, layout.split("x"))
    assert len(starts) == 5 * parallelism
    # One core per executor: the Python worker that ran an instance runs it again (warm cache).
    assert starts.count("resumed") >= 0.95 * len(starts), run["batches"]


def test_a_lost_worker_s_instances_restore_elsewhere_and_the_output_stays_exact(tmp_path):
    run = _run(tmp_path, "--layouts", "2x4", "--kill-worker-after", "2")
    assert run["exact"]
    after_kill = run["batches"][3]["starts"]
    assert "restored" in after_kill, run["batches"]
    assert all(s == "resumed" for batch in run["batches"][4:] for s in batch["starts"]), run["batches"]
