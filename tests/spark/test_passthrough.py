"""The decorated function, handed to Spark's own applyInPandasWithState, behaves as the undecorated one.

DESIGN, passthrough: Spark's state is the system of record; the decorators
may only combine a key's rows inside the call.
"""

from __future__ import annotations

import pandas as pd
import pytest

import buffering
from buffering import ApproxDistinct, Count

from .helpers import all_rows, reference_apply_in_pandas_with_state, views, write_batches
from .test_run_stream import SCHEMA, STATS_SCHEMA, tweet_stats

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def amount_total(key, rows, state):
    """Sums ``user`` per tweet (a stand-in for an amount): associative, so a summing combiner keeps it exact."""
    total = state.get[0] if state.exists else 0
    for pdf in rows:
        total += int(pdf["user"].sum())
    state.update((total,))
    yield pd.DataFrame({"tweet": [key[0]], "total": [total]})


def sum_rows(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"user": [pdf["user"].sum()]})


@pytest.fixture(scope="module")
def input_dir(tmp_path_factory):
    return write_batches(str(tmp_path_factory.mktemp("pass") / "in"), views(2, 600, 20, 100, seed=5))


def _apply(spark, input_dir, fn, output_schema, state_schema, tmp_path, name):
    return all_rows(
        reference_apply_in_pandas_with_state(
            spark, input_dir, SCHEMA, fn, ["tweet"], output_schema, state_schema, str(tmp_path / name)
        ),
        ["tweet"],
    )


def test_mini_batch_and_cached_state_decorators_keep_apply_in_pandas_with_state_results(spark, input_dir, tmp_path):
    decorated = buffering.mini_batch(max_rows=50)(buffering.cached_state(max_entries=4, store="rocksdb")(tweet_stats))
    plain = _apply(spark, input_dir, tweet_stats, STATS_SCHEMA, "views long, hll binary", tmp_path, "plain")
    ours = _apply(spark, input_dir, decorated, STATS_SCHEMA, "views long, hll binary", tmp_path, "decorated")
    pd.testing.assert_frame_equal(ours, plain)


def test_callable_combiner_inside_the_call_keeps_an_associative_function_exact(spark, input_dir, tmp_path):
    decorated = buffering.mini_batch(combine=sum_rows)(amount_total)
    plain = _apply(spark, input_dir, amount_total, "tweet long, total long", "total long", tmp_path, "plain")
    ours = _apply(spark, input_dir, decorated, "tweet long, total long", "total long", tmp_path, "decorated")
    pd.testing.assert_frame_equal(ours, plain)


def test_aggregate_operator_runs_under_apply_in_pandas_with_state(spark, input_dir, tmp_path):
    operator = buffering.aggregate({"views": Count(), "viewers": ApproxDistinct("user")}, key="tweet")
    plain = _apply(spark, input_dir, tweet_stats, STATS_SCHEMA, "views long, hll binary", tmp_path, "plain")
    ours = _apply(spark, input_dir, operator, STATS_SCHEMA, "acc binary", tmp_path, "agg")
    # aggregate(key="tweet") writes the key column: the same rows, key by key and batch by batch.
    assert ours[["batch", "tweet", "views"]].equals(plain[["batch", "tweet", "views"]])
    got, expected = ours["viewers"].to_numpy(), plain["viewers"].to_numpy()
    assert (abs(got - expected) <= 0.05 * expected + 1).all()