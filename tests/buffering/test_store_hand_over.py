"""Handing an instance's working RocksDB between Spark Python workers: kept open in the worker that wrote it,
released to another worker that claims it (run in real processes, no JVM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Iterator

import numpy as np
import pandas as pd
import pytest

from buffering.operator import OperatorInstance
from buffering.spark import _task, _workers
from checkpoint import commit
from state.locks import FileLock, directory_lock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the holder listens on Linux's abstract sockets")


@pytest.fixture(autouse=True)
def _close_worker_instances() -> Iterator[None]:
    """The instances a task leaves for the next one live in this process (as in a Python worker)."""
    yield
    _workers.close_all()


def make_runner(path: str):
    """A run_stream runner of the count and sum of v per k, one instance, state under ``path``."""
    from pyspark.sql.types import LongType, StructField, StructType

    from buffering.spark.stream import StreamRunner
    from tests.buffering.helpers import count_sum

    schema = StructType([StructField("k", LongType()), StructField("v", LongType())])
    output = StructType([StructField("k", LongType()), StructField("n", LongType()), StructField("s", LongType())])
    return StreamRunner(
        count_sum, input_schema=schema, key="k", output_schema=output, checkpoint_location=os.path.join(path, "ckpt"),
        sink="noop", parallelism=1, workdir=os.path.join(path, "work"),
    )


def run_batch(runner, version: int, keys: list[int]) -> tuple[str, dict[int, tuple[int, int]]]:
    """Batch ``version`` of rows of ``keys`` (v = 1), committed; how the task got its instance and the output."""
    context, _ = runner.context(version)
    frame = pd.DataFrame({"k": keys, "v": np.ones(len(keys), dtype=np.int64), _task.OPERATOR_COLUMN: 0})
    rows = pd.concat(list(_task.run_task(runner.plan, context, iter([frame]), partition_id=0)))
    summary = _task.TaskSummary.from_json(rows[_task.REPORT_COLUMN].dropna().iloc[0])
    commit(runner.storage, version, [i.report for i in summary.instances])
    out = rows[rows[_task.REPORT_COLUMN].isna()]
    return summary.instances[0].start, {k: (n, s) for k, n, s in zip(out["k"], out["n"], out["s"])}


def other_worker(path: str, after: str) -> subprocess.Popen:
    """Another Python worker: runs batch 0 (keys 1, 1, 2), hands the store over, prints "ready", then does
    ``after``: "wait" (its holder answers; prints whether its store is open once stdin closes), "stuck" (its
    holder cannot take the instances' lock) or "sleep" (killed by the test)."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {ROOT!r})
        from buffering.spark import _workers
        from tests.buffering.test_store_hand_over import make_runner, run_batch
        runner = make_runner({path!r})
        run_batch(runner, 0, [1, 1, 2])
        (live,) = _workers._LIVE.values()
        if {after!r} == "stuck":
            _workers._LIVE_LOCK.acquire()
        print("ready", live.instance.store_open, flush=True)
        if {after!r} == "wait":
            sys.stdin.read()
            print("open" if live.instance.store_open else "closed", flush=True)
        else:
            time.sleep(120)
    """)
    worker = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert worker.stdout is not None
    assert worker.stdout.readline().split() == ["ready", "True"]  # handed over, its store still open
    return worker


def test_a_handed_over_store_stays_open_and_the_next_task_in_the_worker_resumes_it_without_reopening(tmp_path, monkeypatch):
    runner = make_runner(str(tmp_path))
    assert run_batch(runner, 0, [1, 2]) == ("new", {1: (1, 1), 2: (1, 1)})
    (live,) = _workers._LIVE.values()
    assert live.instance.suspended and live.instance.store_open
    opens = []
    monkeypatch.setattr(OperatorInstance, "_open_working_store", lambda self: opens.append(self))
    assert run_batch(runner, 1, [1]) == ("resumed", {1: (2, 2)})
    assert opens == []


def test_a_store_kept_open_holds_its_directory_claim_so_no_sweep_removes_it(tmp_path):
    runner = make_runner(str(tmp_path))
    run_batch(runner, 0, [1])
    (live,) = _workers._LIVE.values()
    other = directory_lock(live.instance.workdir)
    assert not other.try_acquire()
    assert _workers.sweep_stores(os.path.dirname(live.instance.workdir), keep="") == []


def test_releasing_a_held_store_drops_the_instance_closes_its_store_and_gives_up_its_directory(tmp_path):
    runner = make_runner(str(tmp_path))
    run_batch(runner, 0, [1])
    (live,) = _workers._LIVE.values()
    assert _workers.release_held(live.token)
    assert not live.instance.store_open and not _workers._LIVE
    claim = directory_lock(live.instance.workdir)
    assert claim.try_acquire()
    claim.release()


def test_releasing_a_token_this_process_does_not_hold_is_refused(tmp_path):
    runner = make_runner(str(tmp_path))
    run_batch(runner, 0, [1])
    assert not _workers.release_held("f" * 32)
    (live,) = _workers._LIVE.values()
    assert live.instance.store_open


def test_without_a_holder_the_store_is_closed_at_the_hand_over(tmp_path, monkeypatch):
    monkeypatch.setattr(_workers, "_HOLDER", (os.getpid(), None))  # as where abstract sockets do not exist
    runner = make_runner(str(tmp_path))
    run_batch(runner, 0, [1])
    (live,) = _workers._LIVE.values()
    assert live.instance.suspended and not live.instance.store_open
    assert run_batch(runner, 1, [1]) == ("resumed", {1: (2, 2)})


def test_another_worker_claiming_the_store_has_its_holder_close_it_and_adopts_it(tmp_path):
    worker = other_worker(str(tmp_path), "wait")
    try:
        assert run_batch(make_runner(str(tmp_path)), 1, [1, 3]) == ("adopted", {1: (3, 3), 3: (1, 1)})
        assert worker.poll() is None  # alive all along: its holder closed the store
        out, _ = worker.communicate("", timeout=60)
        assert out.split() == ["closed"]
    finally:
        worker.kill()
        worker.wait()


def test_a_store_whose_holder_was_killed_is_adopted_at_the_version_it_handed_over(tmp_path):
    worker = other_worker(str(tmp_path), "sleep")
    os.kill(worker.pid, signal.SIGKILL)  # as Spark stops an idle worker: no exit handler runs
    worker.wait()
    assert run_batch(make_runner(str(tmp_path)), 1, [1, 2]) == ("adopted", {1: (3, 3), 2: (2, 2)})


def test_a_holder_that_does_not_answer_leaves_the_claimer_to_restore_from_the_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(_workers, "HOLDER_TIMEOUT_S", 0.5)
    worker = other_worker(str(tmp_path), "stuck")
    try:
        started = time.monotonic()
        assert run_batch(make_runner(str(tmp_path)), 1, [2]) == ("restored", {2: (2, 2)})
        assert time.monotonic() - started < 30
        assert worker.poll() is None
    finally:
        worker.kill()
        worker.wait()


def test_a_failed_task_after_the_hand_over_closes_the_store_it_kept_open(tmp_path):
    runner = make_runner(str(tmp_path))
    run_batch(runner, 0, [1])
    (live,) = _workers._LIVE.values()
    instance = live.instance
    _workers.discard(runner.plan, 0)
    assert not instance.store_open and not _workers._LIVE
    claim = FileLock(directory_lock(instance.workdir).path)
    assert claim.try_acquire()
    claim.release()
