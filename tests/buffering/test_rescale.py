"""Rescaling: restarting on a location at parallelism 1 -> 3 -> 8 -> 2 gives the state of a parallelism-1 run.

Key groups move between instances on every restart; state, pending rows and
timers must all follow their keys (DESIGN "Checkpoints": any parallelism
restores any checkpoint).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from buffering import Count, LocalRunner, Max, Sum, aggregate, cached_state, mini_batch

from .helpers import Clock, checkpoint_table, count_sum, plain, random_batches, with_batch

SCHEDULE = (1, 3, 8, 2)  # parallelism of each restart
BATCHES_PER_RUN = 3


def batches() -> list[pd.DataFrame]:
    return random_batches(np.random.default_rng(11), len(SCHEDULE) * BATCHES_PER_RUN, 30, 40)


def run_rescaled(fn, location, schedule=SCHEDULE, finish_ms: int = 0, **kwargs):
    """Run the batches, restarting at each parallelism of ``schedule``; returns (outputs per batch, last runner)."""
    clock = Clock()
    outputs = []
    data = batches()
    runner = None
    for run, parallelism in enumerate(schedule):
        if runner is not None:
            runner.close()
        runner = LocalRunner(fn, key="k", parallelism=parallelism, checkpoint_location=location, clock=clock, **kwargs)
        for i in range(run * BATCHES_PER_RUN, (run + 1) * BATCHES_PER_RUN):
            clock.now = 100 * i
            outputs.append(runner.process(data[i]))
    if finish_ms:
        outputs.append(runner.advance_time(finish_ms))
    return outputs, runner


def test_rescaling_1_3_8_2_gives_the_same_state_and_output_as_parallelism_1(tmp_path):
    fn = cached_state(max_entries=5, store="rocksdb")(count_sum)
    expected_out, expected = run_rescaled(fn, tmp_path / "reference", schedule=(1,) * len(SCHEDULE))
    got_out, got = run_rescaled(fn, tmp_path / "rescaled")
    assert [r.parallelism for r in (expected, got)] == [1, 2]
    assert plain(got.state()) == plain(expected.state())
    assert checkpoint_table(tmp_path / "rescaled") == checkpoint_table(tmp_path / "reference")
    assert checkpoint_table(tmp_path / "rescaled") == plain(expected.state())
    pd.testing.assert_frame_equal(with_batch(got_out), with_batch(expected_out), check_dtype=False)


def test_rescaling_moves_pending_rows_with_their_keys(tmp_path):
    """Flush timing depends on the instances (max_rows counts per instance), the final state does not:
    after a last time-triggered flush every row has been counted exactly once."""
    fn = mini_batch(max_rows=9, max_delay_ms=10_000)(cached_state(max_entries=4, store="rocksdb")(count_sum))
    _, expected = run_rescaled(fn, tmp_path / "reference", schedule=(1,) * len(SCHEDULE), finish_ms=10_000)
    _, got = run_rescaled(fn, tmp_path / "rescaled", finish_ms=10_000)
    reference = pd.concat(batches()).groupby("k")["v"].agg(["size", "sum"])
    assert plain(expected.state()) == {(k,): (int(r["size"]), int(r["sum"])) for k, r in reference.iterrows()}
    assert plain(got.state()) == plain(expected.state())
    assert checkpoint_table(tmp_path / "rescaled") == plain(expected.state())
    assert checkpoint_table(tmp_path / "rescaled", "pending") == {}


def test_rescaling_moves_timers_with_their_keys(tmp_path):
    def expiring(key, rows, state):
        if state.hasTimedOut:
            state.remove()
            yield pd.DataFrame({"k": [key[0]], "expired": [True]})
            return
        n = (state.get[0] if state.exists else 0) + sum(len(f) for f in rows)
        state.update((n,))
        state.setTimeoutDuration(250)
        yield pd.DataFrame({"k": [key[0]], "expired": [False]})

    expected_out, expected = run_rescaled(expiring, tmp_path / "reference", schedule=(1,) * len(SCHEDULE),
                                          finish_ms=1_000, timeout="processing")
    got_out, got = run_rescaled(expiring, tmp_path / "rescaled", finish_ms=1_000, timeout="processing")
    assert with_batch(expected_out)["expired"].any()
    pd.testing.assert_frame_equal(with_batch(got_out), with_batch(expected_out), check_dtype=False)
    assert got.state() == expected.state() == {}


@pytest.mark.parametrize(
    "schedule, max_parallelism",
    [((2, 1), 128), ((8, 3), 128), ((5, 7), 128), ((1, 16), 16), ((16, 1), 16)],
    ids=["2-1", "8-3", "5-7", "1-to-one-key-group-each", "one-key-group-each-to-1"],
)
def test_any_parallelism_restores_any_checkpoint(tmp_path, schedule, max_parallelism):
    op = aggregate({"n": Count(), "s": Sum("v"), "top": Max("v")})
    _, expected = run_rescaled(op, tmp_path / "reference", schedule=(1,) * len(schedule),
                               max_parallelism=max_parallelism)
    _, got = run_rescaled(op, tmp_path / "rescaled", schedule=schedule, max_parallelism=max_parallelism)
    assert plain(got.state()) == plain(expected.state())
