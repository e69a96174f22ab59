"""Crash at random points + restore + replay of the uncommitted batches == the reference run.

The operator keeps a per-key running count and sum behind ``mini_batch(max_rows=7)``
and ``cached_state(max_entries=3, store="rocksdb")`` (so flushes happen mid-batch,
rows stay pending across batches, and the cache evicts), and sets a
processing-time or (in half the trials) an event-time timeout, so timers fire
and are checkpointed too, and the watermark (kept in the manifest) drops late rows.

Each trial runs the micro-batches of a dataset on a fresh checkpoint location
and crashes one or two times at a random batch and point:

* ``mid-batch``: the user function raises on its k-th call of the batch;
* ``in-checkpoint``: the last instance fails writing its task file (the others' files are written);
* ``before-manifest``: every task file is written, the manifest is not (``runner._before_commit`` raises);
* ``after-manifest``: the batch commits, then the runner is dropped without ``close()``.

After each crash the runner is abandoned and a fresh LocalRunner opens the
location; it resumes at ``version`` and the batches after it are replayed.
Outputs of committed batches (each recorded once: a batch replayed after its
commit would be an update doubled) must equal the reference outputs, and the
final state (runner and ``read_state``), pending rows and timers must equal
the reference's. 200 trials, each a separate test id (seeded, reproducible).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import pandas as pd
import pytest

from buffering import LocalRunner, OperatorInstance, cached_state, mini_batch
from state.keys import denormalize_key

from .helpers import Clock, checkpoint_table, plain, random_batches, with_batch

MAX_PARALLELISM = 8  # small manifests keep each of the many commits cheap
N_BATCHES = 6
N_DATASETS = 3
PARALLELISMS = (1, 2)
N_TRIALS = 200
POINTS = ("mid-batch", "in-checkpoint", "before-manifest", "after-manifest")
TIMEOUT_MS = 2_500
BATCH_TIMES_MS = (0, 1_000, 2_000, 6_000, 7_000, 12_000)  # gaps past TIMEOUT_MS: timers fire
WATERMARK_DELAY_MS = 500
EVENT_TIMEOUT_MS = 1_000
RETRY_LATE_MS = 700  # the clock when a batch is retried after a crash, past its first attempt's time


class Crash(Exception):
    """The injected failure."""


class Hook:
    """Makes the operator raise on its k-th call once armed."""

    def __init__(self) -> None:
        self.k: Optional[int] = None
        self.calls = 0

    def arm(self, k: int) -> None:
        self.k, self.calls = k, 0

    def disarm(self) -> None:
        self.k = None

    def tick(self) -> None:
        self.calls += 1
        if self.k is not None and self.calls == self.k:
            self.disarm()
            raise Crash(f"injected crash on call {self.calls}")


HOOK = Hook()


def count_sum_expiring(key, rows, state, set_timeout):
    HOOK.tick()
    if state.hasTimedOut:
        n, s = state.get
        state.remove()
        yield pd.DataFrame({"k": [key[0]], "n": [n], "s": [s], "timed_out": [True]})
        return
    n, s = state.get if state.exists else (0, 0)
    for f in rows:
        n += len(f)
        s += int(f["v"].sum())
    state.update((n, s))
    set_timeout(state)
    yield pd.DataFrame({"k": [key[0]], "n": [n], "s": [s], "timed_out": [False]})


@mini_batch(max_rows=7)
@cached_state(max_entries=3, store="rocksdb")
def processing_time_operator(key, rows, state):
    """Running count and sum per key; a key idle for TIMEOUT_MS of processing time is emitted and dropped."""
    return count_sum_expiring(key, rows, state, lambda s: s.setTimeoutDuration(TIMEOUT_MS))


@mini_batch(max_rows=7)
@cached_state(max_entries=3, store="rocksdb")
def event_time_operator(key, rows, state):
    """The same with an event-time timeout: EVENT_TIMEOUT_MS past the watermark of the key's last flush."""
    return count_sum_expiring(
        key, rows, state, lambda s: s.setTimeoutTimestamp(s.getCurrentWatermarkMs() + EVENT_TIMEOUT_MS)
    )


MODES = ("processing", "event")
OPERATORS = {"processing": processing_time_operator, "event": event_time_operator}


def new_runner(location: Any, parallelism: int, clock: Clock, mode: str) -> LocalRunner:
    event = {"event_time": "ts", "watermark_delay_ms": WATERMARK_DELAY_MS} if mode == "event" else {}
    return LocalRunner(
        OPERATORS[mode], key="k", parallelism=parallelism, max_parallelism=MAX_PARALLELISM,
        checkpoint_location=location, timeout=mode, clock=clock, **event,
    )


def dataset(index: int) -> list[pd.DataFrame]:
    """Small random batches; ``ts`` is near the batch's time, so some rows arrive behind the watermark."""
    rng = np.random.default_rng(1000 + index)
    batches = random_batches(rng, N_BATCHES, 12, 8)
    return [b.assign(ts=BATCH_TIMES_MS[i] + rng.integers(-1_500, 500, len(b))) for i, b in enumerate(batches)]


def run_batch(runner: LocalRunner, clock: Clock, batches: list[pd.DataFrame], i: int, late_ms: int = 0) -> pd.DataFrame:
    """Batch ``i`` at its scheduled time (plus ``late_ms``: a retry runs later, yet must reuse the recorded time)."""
    clock.now = BATCH_TIMES_MS[i] + late_ms
    return runner.process(batches[i])


@dataclass
class Reference:
    outputs: pd.DataFrame
    calls: list[int]  # calls of the function per batch
    pending: list[int]  # rows left in the buffers after each batch
    timers: list[int]  # timers set after each batch
    evictions: int
    dropped_late: list[int]  # rows behind the watermark per batch (event time)
    state: dict
    checkpoint: dict  # read_state of the last version
    held: dict[str, dict]  # pending rows and timers at the end


def pending_and_timers(runner: LocalRunner) -> dict[str, dict]:
    """What the runner holds besides state: pending rows per key and timers, as the checkpoint stores them."""
    pending, timers = {}, {}
    for instance in runner.instances:
        pending.update({denormalize_key(k): plain(v) for k, v in instance.buffer.snapshot().items()})
        timers.update({denormalize_key(k): v for k, v in instance.timers.items()})
    return {"pending": pending, "timers": timers}


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[tuple[int, int, str], Reference]:
    out = {}
    for d, p, mode in itertools.product(range(N_DATASETS), PARALLELISMS, MODES):
        batches = dataset(d)
        location = tmp_path_factory.mktemp(f"reference-{d}-{p}-{mode}") / "ckpt"
        clock = Clock()
        runner = new_runner(location, p, clock, mode)
        outputs, calls, pending, timers, dropped = [], [], [], [], []
        for i in range(N_BATCHES):
            HOOK.arm(10**9)  # counts calls, never raises
            outputs.append(run_batch(runner, clock, batches, i))
            calls.append(HOOK.calls)
            HOOK.disarm()
            pending.append(sum(instance.buffer.rows for instance in runner.instances))
            timers.append(sum(len(instance.timers) for instance in runner.instances))
            dropped.append(runner.stats()["dropped_late_rows"])
        evictions = sum(instance.cache.stats()["evictions"] for instance in runner.instances)
        held = pending_and_timers(runner)
        for table in ("pending", "timers"):  # what the runner holds is what its last version stores
            assert checkpoint_table(location, table) == held[table]
        out[(d, p, mode)] = Reference(with_batch(outputs), calls, pending, timers, evictions, dropped,
                                      plain(runner.state()), checkpoint_table(location), held)
        runner.close()
    return out


def test_the_reference_runs_exercise_flushes_evictions_pending_rows_and_timeouts(references):
    for case, ref in references.items():
        assert ref.outputs["timed_out"].any(), case
        assert (~ref.outputs["timed_out"]).any(), case
        assert any(ref.pending[:-1]), case  # rows pending across a checkpoint
        assert ref.evictions > 0, case
        assert any(ref.timers[:-1]), case  # timers set across a checkpoint
        if case[2] == "event":
            assert sum(ref.dropped_late) > 0, case


@dataclass(frozen=True)
class CrashAt:
    batch: int
    point: str
    fraction: float  # mid-batch: crash on call 1 + floor(fraction * calls of the batch)


@dataclass
class Plan:
    dataset: int
    parallelism: int
    mode: str
    crashes: list[CrashAt] = field(default_factory=list)


def plan(trial: int) -> Plan:
    rng = random.Random(trial)
    p = Plan(dataset=rng.randrange(N_DATASETS), parallelism=rng.choice(PARALLELISMS), mode=rng.choice(MODES))
    first = rng.randrange(N_BATCHES)
    p.crashes.append(CrashAt(first, rng.choice(POINTS), rng.random()))
    if rng.random() < 0.3:  # a second crash while recovering
        p.crashes.append(CrashAt(rng.randrange(first, N_BATCHES), rng.choice(POINTS), rng.random()))
    return p


def test_the_trials_cover_every_batch_point_and_parallelism():
    plans = [plan(t) for t in range(N_TRIALS)]
    crashes = [c for p in plans for c in p.crashes]
    assert {c.point for c in crashes} == set(POINTS)
    assert {c.batch for c in crashes} == set(range(N_BATCHES))
    assert {p.parallelism for p in plans} == set(PARALLELISMS)
    assert {p.dataset for p in plans} == set(range(N_DATASETS))
    assert {p.mode for p in plans} == set(MODES)
    assert sum(len(p.crashes) == 2 for p in plans) >= 30
    assert len({(p.dataset, p.parallelism, p.mode, tuple(p.crashes)) for p in plans}) == N_TRIALS


def crash(runner: LocalRunner, clock: Clock, batches: list[pd.DataFrame], at: CrashAt, calls: int,
          late_ms: int) -> Optional[pd.DataFrame]:
    """Run batch ``at.batch`` and fail at ``at.point``; returns its output when the batch committed."""
    point = at.point
    if point == "mid-batch" and calls == 0:
        point = "before-manifest"  # the function is not called in this batch: fail at the next point
    if point == "after-manifest":
        return run_batch(runner, clock, batches, at.batch, late_ms)

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise Crash(point)

    if point == "mid-batch":
        HOOK.arm(1 + int(at.fraction * calls))
    elif point == "before-manifest":
        runner._before_commit = fail
    with pytest.MonkeyPatch.context() as patch:
        if point == "in-checkpoint":  # the last instance fails; the earlier ones have written their task files
            checkpoint = OperatorInstance.checkpoint

            def last_fails(self: OperatorInstance, *args: Any, **kwargs: Any) -> Any:
                if self.index == self.parallelism - 1:
                    raise Crash(point)
                return checkpoint(self, *args, **kwargs)

            patch.setattr(OperatorInstance, "checkpoint", last_fails)
        try:
            with pytest.raises(Crash):
                run_batch(runner, clock, batches, at.batch, late_ms)
        finally:
            HOOK.disarm()
    return None


@pytest.mark.slow  # 200 trials together take about a minute
@pytest.mark.parametrize("trial", range(N_TRIALS))
def test_crash_restore_and_replay_gives_exactly_the_reference_state_and_output(trial, references, tmp_path):
    p = plan(trial)
    ref = references[(p.dataset, p.parallelism, p.mode)]
    batches = dataset(p.dataset)
    location = tmp_path / "ckpt"
    clock = Clock()
    committed: dict[int, pd.DataFrame] = {}
    abandoned: list[LocalRunner] = []
    started: set[int] = set()  # batches that began before a crash: their retries run late

    def record(i: int, out: pd.DataFrame) -> None:
        assert i not in committed, f"batch {i} committed twice (an update doubled)"
        committed[i] = out

    runner = new_runner(location, p.parallelism, clock, p.mode)
    try:
        for at in p.crashes:
            next_batch = 0 if runner.version is None else runner.version + 1
            if at.batch < next_batch:  # a second crash planned at a batch that has committed since
                at = dataclasses.replace(at, batch=next_batch)
            if at.batch >= N_BATCHES:
                break
            for i in range(next_batch, at.batch):
                record(i, run_batch(runner, clock, batches, i, RETRY_LATE_MS if i in started else 0))
            late_ms = RETRY_LATE_MS if at.batch in started else 0
            started.add(at.batch)
            out = crash(runner, clock, batches, at, ref.calls[at.batch], late_ms)
            if out is not None:
                record(at.batch, out)
            abandoned.append(runner)  # no close(): its cache and working RocksDB die with it
            runner = new_runner(location, p.parallelism, clock, p.mode)
            expected_version = max(committed) if committed else None
            assert runner.version == expected_version
        next_batch = 0 if runner.version is None else runner.version + 1
        for i in range(next_batch, N_BATCHES):
            record(i, run_batch(runner, clock, batches, i, RETRY_LATE_MS if i in started else 0))

        assert sorted(committed) == list(range(N_BATCHES))
        outputs = with_batch([committed[i] for i in range(N_BATCHES)])
        pd.testing.assert_frame_equal(outputs, ref.outputs, check_dtype=False)
        assert plain(runner.state()) == ref.state
        assert checkpoint_table(location) == ref.checkpoint
        assert pending_and_timers(runner) == ref.held
    finally:
        runner.close()
        for old in abandoned:  # only now: releases the crashed runners' private working directories
            old.close()
