"""buffering.aggregate(...) through LocalRunner equals a pandas groupby over all the batches.

With or without a mini-batch buffer in front, at any parallelism, and across a
restart from the checkpoint.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from buffering import (
    Aggregations,
    ApproxDistinct,
    CollectSet,
    Count,
    LocalRunner,
    Max,
    Mean,
    Min,
    OperatorInstance,
    Sum,
    aggregate,
    cached_state,
    mini_batch,
)
from buffering.decorators import spec_of
from buffering.operator import folds_raw_rows
from buffering.windows import Session, Tumbling

from .helpers import Clock, checkpoint_table, count_sum, plain

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


# ---------------------------------------------------------------- a batch's raw rows folded as columns
def tweet_batches(seed: int = 11, n: int = 5) -> list[pd.DataFrame]:
    rng = np.random.default_rng(seed)
    return [
        pd.DataFrame({"tweet": rng.zipf(1.5, 400) % 60, "user": rng.integers(0, 300, 400), "v": rng.integers(0, 9, 400)})
        for _ in range(n)
    ]


TWEET_AGGS = {"views": Count(), "viewers": ApproxDistinct("user", lg_k=7), "total": Sum("v")}


@pytest.mark.parametrize("parallelism", [1, 2])
def test_an_unbuffered_aggregate_emits_and_checkpoints_what_the_buffered_one_does(tmp_path, parallelism):
    """Without a trigger a batch's rows are folded as columns at its end; behind a trigger of one row they
    are merged row by row as partial objects: every key's last result of a batch and the state are the same."""
    frames = tweet_batches()
    op = cached_state(max_entries=25, store="rocksdb")(aggregate(TWEET_AGGS))
    columns, got = run(op, frames, "tweet", checkpoint_location=tmp_path / "columns", parallelism=parallelism)
    partials, expected = run(mini_batch(max_rows=1)(op), frames, "tweet", checkpoint_location=tmp_path / "partials",
                             parallelism=parallelism)
    columns.close()
    partials.close()
    for g, e in zip(got, expected):
        assert len(g) == g["tweet"].nunique()  # one row per key of the batch
        assert latest_per_key([g], ["tweet"]) == latest_per_key([e], ["tweet"])
    assert checkpoint_table(tmp_path / "columns") == checkpoint_table(tmp_path / "partials")


def test_an_unbuffered_aggregate_folds_its_rows_once_at_the_batchs_end():
    first, *chunks = tweet_batches(n=4)
    runner = LocalRunner(aggregate(TWEET_AGGS), key="tweet", clock=Clock())
    runner.process(first)
    instance = runner.instances[0]
    for frame in chunks:
        assert instance.process(frame, 0, -1) == []  # nothing merged or emitted before the end
    out = pd.concat(instance.end_of_batch(0, -1))
    rows = pd.concat(chunks)
    assert out["tweet"].tolist() == pd.unique(rows["tweet"]).tolist()  # one row per key, first-arrival order
    views = pd.concat([first, *chunks])["tweet"].value_counts()
    assert out.set_index("tweet")["views"].to_dict() == views[out["tweet"]].to_dict()


def test_rows_waiting_when_the_store_is_handed_over_are_emitted_by_the_adopter_at_the_batchs_end(tmp_path):
    op = cached_state(store="rocksdb", path=str(tmp_path / "work"))(aggregate(TWEET_AGGS))
    runner = LocalRunner(op, key="tweet", clock=Clock(), checkpoint_location=tmp_path / "cp")
    first, frame = tweet_batches(n=2)
    runner.process(first)
    instance = runner.instances[0]
    instance.process(frame, 0, -1)
    instance.suspend()  # writes what waits to the pending table, as a checkpoint does
    instance.release_workdir()
    adopter = OperatorInstance.for_runner(runner, 0, storage=runner.storage, manager=None, workdir=instance.workdir,
                                          fresh=False)
    adopter.adopt()  # another process takes the store over: what waited comes back from its tables
    out = pd.concat(adopter.end_of_batch(0, -1))
    adopter.close()
    views = pd.concat([first, frame])["tweet"].value_counts()
    assert out.set_index("tweet")["views"].to_dict() == views[pd.unique(frame["tweet"])].to_dict()


@pytest.mark.parametrize(
    ("operator", "folds"),
    [
        (aggregate(TWEET_AGGS), True),
        (cached_state(store="rocksdb", layout="key_group")(aggregate(TWEET_AGGS)), True),
        (aggregate(TWEET_AGGS, window=Tumbling("1 minute")), True),
        (mini_batch(max_rows=10)(aggregate(TWEET_AGGS)), False),  # a trigger: the buffer's partials
        (aggregate(TWEET_AGGS, window=Session("1 minute")), False),  # a session's state is its sessions
        (aggregate({"users": CollectSet("user")}), False),  # no column form
        (mini_batch()(cached_state()(count_sum)), False),  # a function, not an aggregate
    ],
    ids=["aggregate", "key_group", "tumbling", "trigger", "session", "collect_set", "function"],
)
def test_which_operators_fold_a_batchs_raw_rows_as_columns(operator, folds):
    assert folds_raw_rows(spec_of(operator)) is folds


@pytest.mark.parametrize("layout", ["key", "key_group"])
def test_a_batch_failing_after_its_rows_were_folded_into_one_instance_leaves_nothing_applied(tmp_path, layout, monkeypatch):
    """The fold at the batch's end merges each instance's block into its state; one instance failing after
    another merged leaves state and checkpoint at the last version, and the batch re-run gives what a run
    without the failure gives."""
    frames = tweet_batches(n=3)
    op = cached_state(max_entries=25, store="rocksdb", layout=layout)(aggregate(TWEET_AGGS))
    clean, expected = run(op, frames, "tweet", checkpoint_location=tmp_path / "clean", parallelism=2)
    clean.close()
    runner, got = run(op, frames[:2], "tweet", checkpoint_location=tmp_path / "failed", parallelism=2)
    merge = OperatorInstance._merge_columns
    merged = []

    def merge_then_fail(self, *args, **kwargs):
        out = merge(self, *args, **kwargs)  # this instance's state is changed ...
        merged.append(self.index)
        if len(merged) == 2:
            raise RuntimeError("injected failure after the second instance's fold")
        return out

    monkeypatch.setattr(OperatorInstance, "_merge_columns", merge_then_fail)
    before = checkpoint_table(tmp_path / "failed")
    with pytest.raises(RuntimeError, match="injected failure"):
        runner.process(frames[2])
    assert len(merged) == 2 and runner.version == 1
    assert checkpoint_table(tmp_path / "failed") == before
    monkeypatch.setattr(OperatorInstance, "_merge_columns", merge)
    got.append(runner.process(frames[2]))  # ... and the re-run starts from the last version
    runner.close()
    for g, e in zip(got, expected):
        pd.testing.assert_frame_equal(g.reset_index(drop=True), e.reset_index(drop=True))
    assert checkpoint_table(tmp_path / "failed") == checkpoint_table(tmp_path / "clean")
