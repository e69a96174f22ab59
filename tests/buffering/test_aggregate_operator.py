"""buffering.aggregate(...) through LocalRunner equals a pandas groupby over all the batches.

With or without a mini-batch buffer in front, at any parallelism, and across a
restart from the checkpoint.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from buffering import Aggregations, Count, LocalRunner, Max, Mean, Min, Sum, aggregate, cached_state, mini_batch

from .helpers import Clock, checkpoint_table, plain

AGGS = {"n": Count(), "s": Sum("v")}


def batches(seed: int = 0, n: int = 8) -> list[pd.DataFrame]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        rows = int(rng.integers(0, 40))
        out.append(pd.DataFrame({
            "a": rng.integers(0, 4, rows).astype(np.int64),
            "b": rng.choice(["x", "y", "z"], rows),
            "v": rng.integers(-50, 100, rows).astype(np.int64),
        }))
    return out


def reference(frames: list[pd.DataFrame], keys: list[str]) -> dict[tuple, dict]:
    """The pandas groupby of everything: {key tuple: {output: value}}."""
    df = pd.concat(frames, ignore_index=True)
    grouped = df.groupby(keys)["v"].agg(n="size", s="sum", lo="min", hi="max", avg="mean")
    return {
        (k if isinstance(k, tuple) else (k,)): plain(row.to_dict()) for k, row in grouped.iterrows()
    }


def latest_per_key(outputs: list[pd.DataFrame], keys: list[str]) -> dict[tuple, dict]:
    """The last result each key was emitted with (outputs are running results)."""
    latest: dict[tuple, dict] = {}
    for out in outputs:
        for row in out.to_dict("records"):
            latest[tuple(plain(row[k]) for k in keys)] = plain({c: v for c, v in row.items() if c not in keys})
    return latest


def results_of_state(runner: LocalRunner, aggs) -> dict[tuple, dict]:
    """The results of the accumulators the runner holds per key."""
    a = Aggregations(aggs)
    return {k: plain(a.result(acc)) for k, acc in runner.state().items()}


def same(got: dict[tuple, dict], expected: dict[tuple, dict], outputs=("n", "s")) -> None:
    assert set(got) == set(expected)
    for key in expected:
        for name in outputs:
            g, e = got[key][name], expected[key][name]
            if isinstance(e, float):
                assert math.isclose(g, e, rel_tol=1e-12), (key, name, g, e)
            else:
                assert g == e, (key, name, g, e)


def run(op, frames, key, finish_ms=0, **kwargs):
    runner = LocalRunner(op, key=key, clock=Clock(), **kwargs)
    outputs = [runner.process(f) for f in frames]
    if finish_ms:
        outputs.append(runner.advance_time(finish_ms))
    return runner, outputs


@pytest.mark.parametrize("parallelism", [1, 3])
def test_aggregate_equals_a_pandas_groupby_over_all_batches(parallelism):
    frames = batches(1)
    runner, outputs = run(aggregate(AGGS), frames, ["a"], parallelism=parallelism)
    expected = reference(frames, ["a"])
    same(latest_per_key(outputs, ["a"]), expected)
    same(results_of_state(runner, AGGS), expected)


def test_aggregate_emits_the_running_result_of_every_key_of_a_batch():
    frames = batches(2)
    runner = LocalRunner(aggregate(AGGS), key="a", clock=Clock())
    for i, f in enumerate(frames):
        out = runner.process(f)
        expected = reference(frames[: i + 1], ["a"])
        got = latest_per_key([out], ["a"])
        assert set(got) == {(k,) for k in f["a"].unique().tolist()}
        same(got, {k: expected[k] for k in got})


def test_aggregate_with_two_key_columns_and_more_aggregations():
    aggs = {"n": Count(), "s": Sum("v"), "lo": Min("v"), "hi": Max("v"), "avg": Mean("v")}
    frames = batches(3)
    runner, outputs = run(aggregate(aggs), frames, ["b", "a"], parallelism=2)
    expected = reference(frames, ["b", "a"])
    same(latest_per_key(outputs, ["b", "a"]), expected, outputs=list(aggs))
    assert list(outputs[-1].columns[:2]) == ["b", "a"]


@pytest.mark.parametrize("max_rows", [1, 7, 1000])
def test_aggregate_behind_a_mini_batch_equals_the_groupby(max_rows):
    frames = batches(4)
    op = mini_batch(max_rows=max_rows, max_delay_ms=1_000)(aggregate(AGGS))
    runner, outputs = run(op, frames, ["a"], finish_ms=1_000)
    expected = reference(frames, ["a"])
    same(latest_per_key(outputs, ["a"]), expected)
    same(results_of_state(runner, AGGS), expected)


def test_aggregate_behind_a_mini_batch_holds_one_partial_per_key():
    op = mini_batch(max_delay_ms=10**9)(aggregate(AGGS))
    runner = LocalRunner(op, key="a", clock=Clock())
    for f in batches(5):
        runner.process(f)
    buffer = runner.instances[0].buffer
    assert len(buffer) == 4  # keys 0..3
    assert all(set(payload) == {"n", "s"} for _, (*_, payload) in buffer.snapshot().items())


@pytest.mark.parametrize("buffered", [False, True], ids=["unbuffered", "mini-batch"])
def test_aggregate_equals_the_groupby_after_a_restart(tmp_path, buffered):
    frames = batches(6, n=10)
    op = aggregate(AGGS)
    op = cached_state(max_entries=2, store="rocksdb")(op)
    if buffered:
        op = mini_batch(max_rows=9, max_delay_ms=1_000)(op)
    location = tmp_path / "ckpt"
    first = LocalRunner(op, key="a", clock=Clock(), checkpoint_location=location)
    outputs = [first.process(f) for f in frames[:5]]
    first.close()
    second = LocalRunner(op, key="a", clock=Clock(), checkpoint_location=location, parallelism=2)
    assert second.version == 4
    outputs += [second.process(f) for f in frames[5:]]
    outputs.append(second.advance_time(1_000))
    expected = reference(frames, ["a"])
    same(latest_per_key(outputs, ["a"]), expected)
    same(results_of_state(second, AGGS), expected)
    a = Aggregations(AGGS)
    same({k: plain(a.result(acc)) for k, acc in checkpoint_table(location).items()}, expected)
    second.close()
