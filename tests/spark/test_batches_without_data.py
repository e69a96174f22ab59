"""Batches without data on a live stream that goes idle: run_stream beside Spark's own run.

Spark runs a batch without data at every trigger for an operator with a
processing-time timeout, so a key's timeout fires on an idle stream about one
timeout after its last row. run_stream must fire it within two trigger
intervals of when Spark does. (The per-file ``availableNow`` runs of the
event-time scenarios are in test_upstream_parity.py and test_tws_parity.py.)
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterator

import pandas as pd
import pytest

from buffering.spark import run_stream

from .helpers import stream_of, write_batches

pytestmark = pytest.mark.spark

TRIGGER_S = 1
TIMEOUT_MS = 2_000
OUTPUT = "key string, count long"


def count_until_idle(key: tuple, rows: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """Counts a key's rows; once it has been idle for TIMEOUT_MS, emits (key, -1) and forgets it."""
    if state.hasTimedOut:
        state.remove()
        yield pd.DataFrame({"key": [key[0]], "count": [-1]})
        return
    count = (state.get[0] if state.exists else 0) + sum(len(pdf) for pdf in rows)
    state.update((count,))
    state.setTimeoutDuration(TIMEOUT_MS)
    yield pd.DataFrame({"key": [key[0]], "count": [count]})


def _timed_sink(events: list[tuple[float, list[tuple]]]) -> Any:
    def sink(df: Any, batch_id: int) -> None:
        rows = [tuple(r) for r in df.collect()]
        if rows:
            events.append((time.monotonic(), rows))

    return sink


def _seconds_to_timeout(events: list[tuple[float, list[tuple]]]) -> float:
    """From the batch that counted the rows to the one that emitted the timeout."""
    counted = next(t for t, rows in events if any(r[1] >= 0 for r in rows))
    fired = next(t for t, rows in events if any(r[1] == -1 for r in rows))
    return fired - counted


def _wait_for_timeout(events: list, query: Any, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not any(r[1] == -1 for _, rows in events for r in rows) and time.monotonic() < deadline:
        if query.exception() is not None:
            raise query.exception()
        time.sleep(0.1)
    query.stop()


ROWS = pd.DataFrame({"key": ["a", "b", "a"]})


@pytest.fixture(scope="module")
def spark_idle_run(spark, tmp_path_factory) -> list:
    """Spark's own run: the batches with output, each with when it ended."""
    tmp = tmp_path_factory.mktemp("idle-spark")
    directory = write_batches(str(tmp / "in"), [ROWS])
    events: list = []
    query = (
        stream_of(spark, directory, "key string")
        .groupBy("key")
        .applyInPandasWithState(count_until_idle, OUTPUT, "count long", "Update", "ProcessingTimeTimeout")
        .writeStream.outputMode("update")
        .foreachBatch(_timed_sink(events))
        .option("checkpointLocation", str(tmp / "ck"))
        .trigger(processingTime=f"{TRIGGER_S} second")
        .start()
    )
    _wait_for_timeout(events, query)
    return events


@pytest.mark.parametrize("placement", ["batch", "executor"])
def test_processing_time_timeout_fires_on_an_idle_stream_within_two_triggers_of_spark(spark, spark_idle_run, tmp_path, placement):
    directory = write_batches(str(tmp_path / "in"), [ROWS])
    spark_events = spark_idle_run
    ours: list = []
    query = run_stream(
        stream_of(spark, directory, "key string"),
        count_until_idle,
        key="key",
        output_schema=OUTPUT,
        checkpoint_location=str(tmp_path / "ck-opbuffer"),
        sink=_timed_sink(ours),
        timeout="processing",
        trigger={"processingTime": f"{TRIGGER_S} second"},
        placement=placement,
    )
    _wait_for_timeout(ours, query)
    fired = sorted(r for _, rows in ours for r in rows if r[1] == -1)
    assert fired == [("a", -1), ("b", -1)], ours
    assert sorted(r for _, rows in spark_events for r in rows) == sorted(r for _, rows in ours for r in rows)
    spark_s, ours_s = _seconds_to_timeout(spark_events), _seconds_to_timeout(ours)
    assert ours_s <= spark_s + 2 * TRIGGER_S, f"Spark fired after {spark_s:.1f} s, run_stream after {ours_s:.1f} s"


def test_an_available_now_run_with_a_processing_time_timeout_ends(spark, tmp_path):
    """Spark would run batches without data forever there; run_stream's run ends with its rows."""
    directory = write_batches(str(tmp_path / "in"), [pd.DataFrame({"key": ["a"]})])
    query = run_stream(
        stream_of(spark, directory, "key string"),
        count_until_idle,
        key="key",
        output_schema=OUTPUT,
        checkpoint_location=str(tmp_path / "ck"),
        sink="noop",
        timeout="processing",
        trigger={"availableNow": True},
    )
    assert query.awaitTermination(60) is not False
    assert [m.rows_in for m in query.batch_metrics] == [1]
    assert os.path.isdir(tmp_path / "ck")
